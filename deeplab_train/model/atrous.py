"""Output-stride bookkeeping, multi-grid rates and end-point naming shared by
the backbones.

Backbones made of strided units (xception, resnet) reach a requested
`output_stride` the same way: units keep their stride until the features are
at that stride, then run at stride 1 and turn each skipped stride into an
atrous rate for the units after it. Both take `multi_grid` as the rates of
the three units (or convs) of their last block.
"""
import collections

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError


def unit_strides_and_rates(unit_strides, output_stride, root_stride, variant):
  """The (stride, atrous rate) each unit runs with for an output stride.

  Args:
    unit_strides: nominal stride of every unit, in order.
    output_stride: the wanted ratio of input to output resolution.
    root_stride: the stride of the layers before the first unit.
    variant: model_variant, for the error message.

  Returns:
    A list of (stride, rate), one per unit. A unit's `rate` multiplies its
    own unit rates (multi_grid).

  Raises:
    ConfigError: `output_stride` is not the root stride times a product of
      leading unit strides.
  """
  plan = []
  current, rate = root_stride, 1
  for stride in unit_strides:
    if current == output_stride:
      plan.append((1, rate))
      rate *= stride
    else:
      plan.append((stride, 1))
      current *= stride
  if current != output_stride:
    reachable = [root_stride]
    for stride in unit_strides:
      if stride > 1:
        reachable.append(reachable[-1] * stride)
    raise ConfigError(
        '{ModelOptions.output_stride}=%d cannot be reached by '
        '{ModelOptions.model_variant}=%s; use one of %s', output_stride,
        variant, ', '.join(map(str, reachable)))
  return plan


def multi_grid_rates(options, default, rates_of):
  """The atrous rates of the last block's 3 units (or convs): multi_grid.

  Args:
    options: ModelOptions (multi_grid, model_variant).
    default: the rates when options.multi_grid is not set.
    rates_of: what the 3 rates apply to, for the error message.

  Returns:
    A tuple of 3 ints.

  Raises:
    ConfigError: multi_grid has another number of values.
  """
  grid = tuple(options.multi_grid or default)
  if len(grid) != 3:
    raise ConfigError('{ModelOptions.multi_grid} must have 3 values for '
                      '{ModelOptions.model_variant}=%s (the rates of %s), '
                      'got %s', options.model_variant, rates_of,
                      ','.join(map(str, grid)))
  return grid


class EndPoints(collections.OrderedDict):
  """Layer outputs keyed by their variable scope relative to the backbone's.

  Keys look like 'block1/unit_2/bottleneck_v1/conv3': the names the original
  collected its end points under, without the backbone scope, so they match
  the registry's `decoder_end_points` whatever scope encloses the backbone.
  """

  def __init__(self, backbone_scope_name):
    super().__init__()
    self._root = backbone_scope_name

  def add(self, name, tensor):
    """Records `tensor` as `name` in the current variable scope.

    Args:
      name: layer name inside the current scope; None for the scope itself.
      tensor: the layer's output.

    Returns:
      `tensor`, so calls can be chained.
    """
    current = tf.get_variable_scope().name
    if current == self._root or current.startswith(self._root + '/'):
      current = current[len(self._root) + 1:]
    key = '/'.join(part for part in (current, name) if part)
    self[key] = tensor
    return tensor
