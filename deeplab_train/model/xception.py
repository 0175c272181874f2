"""Aligned Xception backbones (xception_41, xception_65, xception_71).

DeepLab's Xception is fully convolutional: the max-pools of the classification
net are stride-2 separable convs, so any `output_stride` can be had by turning
the remaining strides into atrous rates. Every separable conv is built as two
layers, `<name>_depthwise` and `<name>_pointwise`, each with its own BatchNorm,
which is how the model-zoo checkpoints name them.

Network layout (all variants): root convs `entry_flow/conv1_{1,2}`, then
entry-flow blocks with a 1x1 conv shortcut, middle-flow units with an identity
shortcut, and two exit-flow blocks; the last one has no shortcut, applies its
activations inside the separable convs and takes `multi_grid` as the unit
rates of its three convs.

Variables live under the variant's name (`xception_65/...`). BatchNorm:
decay 0.9997, epsilon 1e-3; weights use a truncated normal (stddev 0.09);
depthwise weights are not L2-regularised.
"""
import dataclasses
import functools
from typing import Tuple

import tensorflow.compat.v1 as tf

from deeplab_train.model import atrous
from deeplab_train.model import layers
from deeplab_train.model import registry

BATCH_NORM = layers.BatchNormParams(decay=0.9997, epsilon=1e-3, scale=True)
WEIGHTS_STDDEV = 0.09
DEFAULT_MULTI_GRID = (1, 1, 1)
# entry_flow/conv1_1 has stride 2.
_ROOT_STRIDE = 2
# use_bounded_activation clips features to this range before sums.
_CLIP_CAP = 6.0


@dataclasses.dataclass(frozen=True)
class _Block:
  """A block of identical Xception units, each with the block's stride
  (the blocks that stride have a single unit)."""
  scope: str
  depths: Tuple[int, int, int]
  skip: str                      # 'conv', 'sum' or 'none'
  num_units: int
  stride: int
  activation_in_separable: bool = False
  uses_multi_grid: bool = False


def _entry_block(index, depth, stride):
  return _Block('entry_flow/block%d' % index, (depth,) * 3, 'conv', 1, stride)


def _blocks(entry, middle_units):
  """Entry blocks from (depth, stride) pairs, then middle and exit flows."""
  return (
      tuple(_entry_block(i + 1, d, s) for i, (d, s) in enumerate(entry)) +
      (_Block('middle_flow/block1', (728,) * 3, 'sum', middle_units, 1),
       _Block('exit_flow/block1', (728, 1024, 1024), 'conv', 1, 2),
       _Block('exit_flow/block2', (1536, 1536, 2048), 'none', 1, 1,
              activation_in_separable=True, uses_multi_grid=True)))


_BLOCKS = {
    'xception_41': _blocks([(128, 2), (256, 2), (728, 2)], 8),
    'xception_65': _blocks([(128, 2), (256, 2), (728, 2)], 16),
    'xception_71': _blocks(
        [(128, 2), (256, 1), (256, 2), (728, 1), (728, 2)], 16),
}

_MODULE = 'xception_module'
_PROJECTION = _MODULE + '/separable_conv2_pointwise'
# The units whose features the decoder projects, by stride (the original's
# DECODER_END_POINTS): a strided unit's second pointwise conv, the last
# layer before its third (strided) conv.
_DECODER_UNITS = {
    'xception_41': {4: 'entry_flow/block2/unit_1',
                    8: 'entry_flow/block3/unit_1',
                    16: 'exit_flow/block1/unit_1'},
    'xception_65': {4: 'entry_flow/block2/unit_1',
                    8: 'entry_flow/block3/unit_1',
                    16: 'exit_flow/block1/unit_1'},
    'xception_71': {4: 'entry_flow/block3/unit_1',
                    8: 'entry_flow/block5/unit_1',
                    16: 'exit_flow/block1/unit_1'},
}


def _separable_conv(x, depth, params, scope, stride, rate, end_points,
                    activation, explicit_padding):
  """`{scope}_depthwise` then `{scope}_pointwise`, each BN + activation.

  A strided conv pads the input explicitly (as a stride-1 SAME conv would)
  and then runs VALID, so features stay aligned whatever the input size.
  """
  padding = 'SAME'
  if stride > 1 and explicit_padding:
    x = layers.fixed_padding(x, 3, rate)
    padding = 'VALID'
  x = layers.depthwise_conv2d(x, 3, params, scope + '_depthwise',
                              stride=stride, rate=rate, padding=padding,
                              activation=activation)
  end_points.add(scope + '_depthwise', x)
  x = layers.conv2d(x, depth, 1, params, scope + '_pointwise',
                    activation=activation)
  return end_points.add(scope + '_pointwise', x)


def _xception_module(inputs, block, stride, rate, unit_rates, params,
                     end_points, bounded):
  """Three separable convs plus the block's shortcut (one Xception unit)."""
  with tf.variable_scope(_MODULE):
    residual = inputs
    for i in range(3):
      if block.activation_in_separable:
        activation = tf.nn.relu6 if bounded else tf.nn.relu
      else:
        # Pre-activation: the ReLU runs on the conv's input, the separable
        # conv itself is linear after BN (clipped when bounded).
        residual = layers.activate(tf.nn.relu6 if bounded else tf.nn.relu,
                                   residual)
        activation = ((lambda t: tf.clip_by_value(t, -_CLIP_CAP, _CLIP_CAP))
                      if bounded else None)
      residual = _separable_conv(
          residual, block.depths[i], params, 'separable_conv%d' % (i + 1),
          stride=stride if i == 2 else 1, rate=rate * unit_rates[i],
          end_points=end_points, activation=activation,
          explicit_padding=not bounded)
    if block.skip == 'none':
      outputs = residual
    else:
      if block.skip == 'conv':
        shortcut = layers.conv2d(inputs, block.depths[-1], 1, params,
                                 'shortcut', stride=stride, activation=None)
        end_points.add('shortcut', shortcut)
      else:
        shortcut = inputs
      if bounded:
        residual = tf.clip_by_value(residual, -_CLIP_CAP, _CLIP_CAP)
        shortcut = tf.clip_by_value(shortcut, -_CLIP_CAP, _CLIP_CAP)
      outputs = residual + shortcut
      if bounded:
        outputs = tf.nn.relu6(outputs)
  return end_points.add(_MODULE, outputs)


def _root(images, params, end_points):
  """entry_flow/conv1_1 (3x3/2, explicitly padded) and conv1_2 (3x3/1)."""
  with tf.variable_scope('entry_flow'):
    net = layers.conv2d(layers.fixed_padding(images, 3), 32, 3, params,
                        'conv1_1', stride=2, padding='VALID')
    end_points.add('conv1_1', net)
    net = layers.conv2d(net, 64, 3, params, 'conv1_2')
    end_points.add('conv1_2', net)
  return net


def conv_params(weight_decay, bn_training, bounded=False):
  """The ConvParams of every Xception layer (the original's arg scope)."""
  return layers.ConvParams(
      weight_decay=weight_decay, batch_norm=BATCH_NORM,
      bn_training=bn_training,
      activation=tf.nn.relu6 if bounded else tf.nn.relu,
      weights_stddev=WEIGHTS_STDDEV, regularize_depthwise=False)


def build_xception(images, options, is_training, bn_training, weight_decay,
                   variant):
  """Builds `variant` on normalised images.

  Args:
    images: float NHWC, already normalised to [-1, 1].
    options: config.ModelOptions (output_stride, multi_grid,
      use_bounded_activation are used).
    is_training: unused (no dropout in the backbone).
    bn_training: BatchNorm uses batch statistics and updates moving averages.
    weight_decay: L2 factor of conv weights.
    variant: 'xception_41', 'xception_65' or 'xception_71'.

  Returns:
    (features, end_points): the exit-flow output at `output_stride` (2048
    channels) and a dict of layer outputs keyed by their scope relative to
    `variant` (e.g. 'entry_flow/block2/unit_1/xception_module/'
    'separable_conv2_pointwise').

  Raises:
    ConfigError: unreachable output_stride or bad multi_grid.
  """
  del is_training
  blocks = _BLOCKS[variant]
  grid = atrous.multi_grid_rates(options, DEFAULT_MULTI_GRID,
                                 "the last block's 3 convs")
  bounded = options.use_bounded_activation
  params = conv_params(weight_decay, bn_training, bounded)
  plan = iter(atrous.unit_strides_and_rates(
      [b.stride for b in blocks for _ in range(b.num_units)],
      options.output_stride, _ROOT_STRIDE, variant))
  with tf.variable_scope(variant, values=[images]) as scope:
    end_points = atrous.EndPoints(scope.name)
    net = _root(images, params, end_points)
    for block in blocks:
      unit_rates = grid if block.uses_multi_grid else DEFAULT_MULTI_GRID
      with tf.variable_scope(block.scope):
        for i in range(block.num_units):
          stride, rate = next(plan)
          with tf.variable_scope('unit_%d' % (i + 1)):
            net = _xception_module(net, block, stride, rate, unit_rates,
                                   params, end_points, bounded)
        end_points.add(None, net)
  return net, end_points


def _register(variant):
  registry.register(
      variant,
      scope=variant,
      mean_pixel=registry.INCEPTION_MEAN_PIXEL,
      normalize=registry.zero_mean_unit_range,
      decoder_end_points={
          stride: (unit + '/' + _PROJECTION,)
          for stride, unit in _DECODER_UNITS[variant].items()},
      # The original trainer's --weight_decay default (also its xception
      # arg scope's).
      default_weight_decay=4e-5,
      options_read=('multi_grid',),
  )(functools.partial(build_xception, variant=variant))


for _variant in sorted(_BLOCKS):
  _register(_variant)
