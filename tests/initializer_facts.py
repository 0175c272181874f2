"""How each variable of a fresh graph is initialised, read off the graph.

For a variable's initial-value tensor: the kind of random op it starts from
(truncated_normal, uniform, normal, or constant) and the scalar constants
that shape it (mean and stddev, bounds, the fill value), plus the mean and
standard deviation of the fresh values. The recorder of the original's
training step and our test read both graphs with the same functions, so
the two descriptions compare field by field.
"""
import numpy as np

_RANDOM_KINDS = {'TruncatedNormal': 'truncated_normal',
                 'RandomUniform': 'uniform',
                 'RandomStandardNormal': 'normal'}
KINDS = ('constant', 'normal', 'truncated_normal', 'uniform')
MAX_CONSTS = 4


def describe(initial_value):
  """(kind, sorted scalar float constants) of an initial-value tensor."""
  kinds, consts = set(), set()
  stack, seen = [initial_value.op], set()
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.type in _RANDOM_KINDS:
      kinds.add(_RANDOM_KINDS[op.type])
    if op.type == 'Const' and op.get_attr('dtype').is_floating:
      value = np.asarray(_tensor_value(op), np.float64).ravel()
      if value.size and np.all(value == value[0]):
        consts.add(round(float(value[0]), 9))
    stack.extend(t.op for t in op.inputs)
  if len(kinds) > 1:
    raise ValueError('%s: several random ops %s' % (initial_value.name, kinds))
  return (kinds.pop() if kinds else 'constant'), sorted(consts)


def _tensor_value(op):
  # A Const's value of any size (small ones are also in float_val).
  from tensorflow.python.framework import tensor_util  # pylint: disable=g-import-not-at-top,line-too-long
  return tensor_util.MakeNdarray(op.get_attr('value'))


def record(sess, variables):
  """Initializer facts of `variables` (already initialised in `sess`).

  Returns:
    {'init_names', 'init_kinds' (index into KINDS), 'init_consts'
    [N, MAX_CONSTS] (nan-padded), 'init_stats' [N, 2] (mean, std)}.
  """
  values = sess.run(variables)
  names, kinds, consts, stats = [], [], [], []
  for var, value in sorted(zip(variables, values),
                           key=lambda vv: vv[0].op.name):
    kind, numbers = describe(var.initial_value)
    names.append(var.op.name)
    kinds.append(KINDS.index(kind))
    row = np.full(MAX_CONSTS, np.nan)
    row[:len(numbers)] = numbers[:MAX_CONSTS]
    consts.append(row)
    stats.append([np.mean(value), np.std(value)])
  return {'init_names': np.array(names), 'init_kinds': np.array(kinds),
          'init_consts': np.array(consts), 'init_stats': np.array(stats)}
