"""The cell of the NAS backbones (PNASNet-5 and Auto-DeepLab) and drop path.

A cell turns the previous cell's output and the one before it into a new
feature map. It first projects both to the cell's filter count (`1x1` +
`beginning_bn` for the current input; `prev_1x1` + `prev_bn` for the older
one, resized to the current resolution first when it differs), giving the
hidden states 0 (current) and 1 (older). Then each of its five
`comb_iter_{i}` applies one operation to each of two earlier hidden states
(`left`, `right`) and adds the results as a new hidden state. The output
(`cell_output`) concatenates the hidden states no combination used.

A genotype names the operations: `separable_KxK_N` (N x: ReLU, separable
conv `separable_KxK_n` with `depthwise_weights` and `pointwise_weights`,
BN `bn_sep_KxK_n`), `atrous_KxK` (ReLU, KxK conv at rate 2 `atrous_KxK`,
BN `bn_atr_KxK`), `max_pool_KxK` / `avg_pool_KxK` and `none` (identity).
In a strided cell only the operations on hidden states 0 and 1 stride.

Drop path (training only): the output of every operation but `none` is
zeroed for a whole image with probability 1 - keep, and scaled by 1 / keep
otherwise. `keep` starts at 1 and falls linearly with the global step to
its final value at the end of training; the final value is
`1 - (cell + 1) / num_cells * (1 - drop_path_keep_prob)`, so the last cell
drops the most.
"""
import dataclasses
import re
from typing import Any, Tuple

import tensorflow.compat.v1 as tf

from deeplab_train.model import head
from deeplab_train.model import layers


@dataclasses.dataclass(frozen=True)
class Genotype:
  """What a cell computes.

  Attributes:
    operations: two per combination, (left, right) in order.
    hiddenstate_indices: the hidden state each operation reads.
    used_hiddenstates: 1 for the hidden states a combination reads (left
      out of the cell's output), one per hidden state.
  """
  operations: Tuple[str, ...]
  hiddenstate_indices: Tuple[int, ...]
  used_hiddenstates: Tuple[int, ...]

  def __post_init__(self):
    if len(self.operations) != len(self.hiddenstate_indices):
      raise ValueError('a genotype needs one hidden state per operation')
    if len(self.operations) % 2:
      raise ValueError('a genotype needs an even number of operations')


# PNASNet-5 (Liu et al., "Progressive Neural Architecture Search", 2018).
PNASNET_GENOTYPE = Genotype(
    operations=('separable_5x5_2', 'max_pool_3x3',
                'separable_7x7_2', 'max_pool_3x3',
                'separable_5x5_2', 'separable_3x3_2',
                'separable_3x3_2', 'max_pool_3x3',
                'separable_3x3_2', 'none'),
    hiddenstate_indices=(1, 1, 0, 0, 0, 0, 4, 0, 1, 0),
    used_hiddenstates=(1, 1, 0, 0, 0, 0, 0))

# Auto-DeepLab (Liu et al., "Auto-DeepLab", 2019).
HNASNET_GENOTYPE = Genotype(
    operations=('atrous_5x5', 'separable_3x3_2',
                'separable_3x3_2', 'atrous_3x3',
                'separable_3x3_2', 'separable_3x3_2',
                'separable_5x5_2', 'separable_5x5_2',
                'separable_5x5_2', 'atrous_5x5'),
    hiddenstate_indices=(1, 0, 1, 0, 3, 1, 4, 2, 3, 5),
    used_hiddenstates=(1, 1, 0, 0, 0, 0, 0))

# The rate of the stride-1 atrous operations.
_ATROUS_RATE = 2


@dataclasses.dataclass(frozen=True)
class DropPath:
  """Drop-path settings of a training graph (the original's
  nas_training_hyper_parameters).

  Attributes:
    keep_prob: the keep probability of the last cell at the end of training
      (< 1; 1 means no drop path: pass no DropPath at all).
    total_steps: the step at which the keep probabilities reach their final
      values (the run's training_number_of_steps).
    global_step: the training step (a scalar tensor or variable).
  """
  keep_prob: float
  total_steps: int
  global_step: Any

  def keep_prob_of_cell(self, cell_num, num_cells):
    """float32 scalar: cell `cell_num`'s keep probability at this step."""
    final = 1.0 - (cell_num + 1) / float(num_cells) * (1.0 - self.keep_prob)
    step = tf.cast(self.global_step, tf.float32)
    progress = tf.minimum(1.0, step / float(self.total_steps))
    return 1.0 - progress * (1.0 - final)


def drop_path(net, keep_prob):
  """Keeps each image of `net` with probability `keep_prob` (a float32
  scalar), scaled by 1 / keep_prob; zeroes it otherwise."""
  with tf.name_scope('drop_path'):
    noise_shape = tf.stack([tf.shape(net)[0], 1, 1, 1])
    keep = tf.floor(keep_prob + tf.random.uniform(noise_shape,
                                                  dtype=tf.float32))
    return net * tf.cast(keep / keep_prob, net.dtype)


def _conv_bn(x, num_outputs, kernel_size, params, conv_scope, bn_scope,
             stride=1, rate=1):
  """A bias-free conv (`conv_scope`) and its BatchNorm (`bn_scope`)."""
  x = layers.conv2d(x, num_outputs, kernel_size, params, conv_scope,
                    stride=stride, rate=rate, activation=None,
                    normalize=False, use_bias=False)
  return layers.batch_norm(x, params, scope=bn_scope)


def _kernel_size(operation):
  """3 for 'separable_3x3_2', 'atrous_3x3', 'max_pool_3x3'."""
  return int(re.search(r'_(\d+)x\d+', operation).group(1))


class Cell:
  """A NAS cell with a genotype; call it once per cell of the network."""

  def __init__(self, genotype, num_conv_filters, num_cells, params,
               drop_path_schedule=None):
    """Builds nothing yet.

    Args:
      genotype: the cell's Genotype.
      num_conv_filters: filters of a cell at filter scaling 1.
      num_cells: cells in the network (the drop-path schedule over cells).
      params: layers.ConvParams of the convs and BatchNorms (no
        activation: the cell places its ReLUs itself).
      drop_path_schedule: a DropPath, or None for none.
    """
    self._genotype = genotype
    self._num_conv_filters = num_conv_filters
    self._num_cells = num_cells
    self._params = params
    self._drop_path = drop_path_schedule

  def __call__(self, net, prev_layer, scope, filter_scaling, stride,
               cell_num, resize_prev_layer):
    """The cell's output.

    Args:
      net: the previous cell's output (the stem's, for the first cell).
      prev_layer: the output before that.
      scope: variable scope ('cell_{cell_num}').
      filter_scaling: multiplies num_conv_filters.
      stride: 1, or 2 for a reduction cell.
      cell_num: the cell's index (for the drop-path schedule).
      resize_prev_layer: prev_layer is at another resolution than `net`.

    Returns:
      The concatenation of the unused hidden states.
    """
    filters = int(self._num_conv_filters * filter_scaling)
    genotype = self._genotype
    with tf.variable_scope(scope):
      states = self._base(net, prev_layer, filters, resize_prev_layer)
      keep_prob = None
      if self._drop_path is not None:
        keep_prob = self._drop_path.keep_prob_of_cell(cell_num,
                                                      self._num_cells)
      for i in range(len(genotype.operations) // 2):
        with tf.variable_scope('comb_iter_%d' % i):
          branches = []
          for side, k in (('left', 2 * i), ('right', 2 * i + 1)):
            index = genotype.hiddenstate_indices[k]
            with tf.variable_scope(side):
              branches.append(self._operation(
                  states[index], genotype.operations[k],
                  stride if index < 2 else 1, filters, keep_prob))
          with tf.name_scope('combine'):
            states.append(branches[0] + branches[1])
      with tf.name_scope('cell_output'):
        return tf.concat([h for h, used in zip(states,
                                               genotype.used_hiddenstates)
                          if not used], axis=3)

  def _base(self, net, prev_layer, filters, resize_prev_layer):
    """Hidden states 0 and 1: `net` and `prev_layer` projected."""
    params = self._params
    if resize_prev_layer:
      prev_layer = head.resize_bilinear(prev_layer, tf.shape(net)[1:3])
    if int(prev_layer.shape[-1]) != filters:
      prev_layer = _conv_bn(tf.nn.relu(prev_layer), filters, 1, params,
                            'prev_1x1', 'prev_bn')
    net = _conv_bn(tf.nn.relu(net), filters, 1, params, '1x1',
                   'beginning_bn')
    return [net, prev_layer]

  def _operation(self, net, operation, stride, filters, keep_prob):
    """One operation of the genotype, then drop path (but for 'none')."""
    params = self._params
    if operation.startswith('separable'):
      kernel_size = _kernel_size(operation)
      for n in range(1, int(operation.split('_')[-1]) + 1):
        name = '%dx%d_%d' % (kernel_size, kernel_size, n)
        net = layers.separable_conv2d(tf.nn.relu(net), filters, kernel_size, params,
                               'separable_' + name, stride=stride)
        net = layers.batch_norm(net, params, scope='bn_sep_' + name)
        stride = 1
    elif operation.startswith('atrous'):
      net = self._atrous(net, _kernel_size(operation), stride, filters)
    elif operation == 'none':
      if stride > 1 or int(net.shape[-1]) != filters:
        net = _conv_bn(tf.nn.relu(net), filters, 1, params, '1x1', 'bn_1',
                       stride=stride)
      return net
    elif operation.startswith(('max_pool', 'avg_pool')):
      pool = (tf.nn.max_pool2d if operation.startswith('max')
              else tf.nn.avg_pool2d)
      net = pool(net, _kernel_size(operation), stride, 'SAME')
      if int(net.shape[-1]) != filters:
        net = _conv_bn(net, filters, 1, params, '1x1', 'bn_1')
    else:
      raise ValueError('unknown NAS operation %r' % operation)
    if keep_prob is not None:
      net = drop_path(net, keep_prob)
    return net

  def _atrous(self, net, kernel_size, stride, filters):
    """ReLU, a KxK conv at rate 2 (or, striding, halve the size bilinearly
    and convolve at rate 1), BN."""
    name = '%dx%d' % (kernel_size, kernel_size)
    net = tf.nn.relu(net)
    rate = _ATROUS_RATE
    if stride == 2:
      size = tf.shape(net)[1:3]
      net = head.resize_bilinear(net, [head.scale_dimension(size[0], 0.5),
                                       head.scale_dimension(size[1], 0.5)])
      rate = 1
    return _conv_bn(net, filters, kernel_size, self._params,
                    'atrous_' + name, 'bn_atr_' + name, rate=rate)
