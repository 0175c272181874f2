"""Choosing variables by scope: the one place that decides which variables
are "last layers" (for the gradient multiplier and for initialisation).

A scope selects every variable whose name starts with it, as the original
DeepLab did: 'aspp' covers 'aspp0/...' and 'aspp1_depthwise/...', 'logits'
covers 'logits/semantic/...'.
"""


def variable_name(var_or_name):
  """'aspp0/weights' for a variable, its ':0' tensor name or a string."""
  name = var_or_name if isinstance(var_or_name, str) else var_or_name.op.name
  return name[:-2] if name.endswith(':0') else name


def in_scopes(var_or_name, scopes):
  """True when the variable lies under one of `scopes` (name prefixes)."""
  name = variable_name(var_or_name)
  return any(name.startswith(scope) for scope in scopes or ())


def is_bias(var_or_name):
  """Biases get twice the gradient in training, as in the original."""
  return variable_name(var_or_name).rsplit('/', 1)[-1] == 'biases'


def gradient_multipliers(variables, last_layer_scopes, last_layer_multiplier):
  """The original's per-variable gradient multipliers.

  Biases are doubled; variables under `last_layer_scopes` are multiplied by
  `last_layer_multiplier` (biases there by twice that). Variables with a
  multiplier of 1 are left out.

  Args:
    variables: the trainable model variables.
    last_layer_scopes: scope prefixes of the last layers.
    last_layer_multiplier: float.

  Returns:
    {variable: multiplier}.
  """
  out = {}
  for var in variables:
    mult = 1.0
    if in_scopes(var, last_layer_scopes):
      mult = last_layer_multiplier
    if is_bias(var):
      mult *= 2.0
    if mult != 1.0:
      out[var] = mult
  return out
