"""MobileNetV3 feature extractors for segmentation, as DeepLab builds them.

`mobilenet_v3_large_seg` and `mobilenet_v3_small_seg` are slim's MobileNetV3
Large / Small with the segmentation tail of the original DeepLab: the last
stage (its three blocks and the 1x1 `Conv_1` after them) has half the
channels, and the network stops at `Conv_1` (no pooling, no classifier).
Variables live under `MobilenetV3/` (`Conv`, `expanded_conv`,
`expanded_conv_1`, ..., `Conv_1`) so the model-zoo checkpoints restore
without any mapping.

Facts reproduced from the original:
- Every block is mobilenet_v2's inverted residual (`mobilenet_v2.
  expanded_conv`) with its own depthwise kernel (3 or 5), inner activation
  (ReLU or hard-swish, x * relu6(x + 3) / 6) and, on some blocks, a
  squeeze-and-excitation of the depthwise output (`squeeze_excite/Conv`,
  `Conv_1`: global mean, 1x1 conv with biases to a quarter of the channels
  rounded to a multiple of 8, ReLU, 1x1 conv with biases back,
  relu6(x + 3) * 0.16667 as the gate).
- The stem conv and `Conv_1` use hard-swish; BN everywhere but in the
  squeeze-and-excitation convs (decay 0.997, epsilon 1e-3, scale);
  truncated-normal initialisation with stddev 0.09; L2 weight decay on all
  conv weights (squeeze-and-excitation included) but not on depthwise
  weights. 'SAME' padding.
- The expansion width is the block's factor times its actual input
  channels, rounded to a multiple of 8; `depth_multiplier` scales the
  output channels of every layer, always rounded to a multiple of 8 (at
  least 8): the original ignores `divisible_by` for these networks.
- `output_stride` works as in mobilenet_v2 (later depthwise convs become
  atrous).
- Inputs are scaled to [-1, 1]: (2 / 255) * x - 1.
"""
import collections
import functools

import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.model import mobilenet_v2
from deeplab_train.model import registry

SCOPE = 'MobilenetV3'
# Channel rounding of every layer, whatever the depth multiplier.
DIVISIBLE_BY = 8
MIN_DEPTH = 8
STEM_OUTPUTS = 16
SQUEEZE_FACTOR = 4


def hard_swish(x):
  """x * relu6(x + 3) / 6, in the original's order of float32 operations.

  Python constants (not float32 ones) so that bf16 / fp16 inputs work; they
  become the same float32 values for float32 inputs.
  """
  with tf.name_scope('hard_swish'):
    return x * tf.nn.relu6(x + 3.0) * (1.0 / 6.0)


_Block = collections.namedtuple(
    '_Block', ['expansion', 'num_outputs', 'kernel_size', 'stride',
               'activation', 'squeeze_excite'])


def _relu(ef, n, k, s, se=False):
  return _Block(ef, n, k, s, tf.nn.relu, se)


def _hswish(ef, n, k, s, se=False):
  return _Block(ef, n, k, s, hard_swish, se)


# (expansion factor, outputs, depthwise kernel, stride, activation, SE).
# The seg tails: the original halves the outputs of the last three blocks
# and keeps their expansion widths at 336 / 480 / 480 (large) and
# 144 / 288 / 288 (small), whence the factors 3 and 6.
LARGE_SEG_BLOCKS = (
    _relu(1, 16, 3, 1),
    _relu(4, 24, 3, 2),
    _relu(3, 24, 3, 1),
    _relu(3, 40, 5, 2, se=True),
    _relu(3, 40, 5, 1, se=True),
    _relu(3, 40, 5, 1, se=True),
    _hswish(6, 80, 3, 2),
    _hswish(2.5, 80, 3, 1),
    _hswish(184 / 80., 80, 3, 1),
    _hswish(184 / 80., 80, 3, 1),
    _hswish(6, 112, 3, 1, se=True),
    _hswish(6, 112, 3, 1, se=True),
    _hswish(3, 80, 5, 2, se=True),
    _hswish(6, 80, 5, 1, se=True),
    _hswish(6, 80, 5, 1, se=True),
)
LARGE_SEG_HEAD_OUTPUTS = 480

SMALL_SEG_BLOCKS = (
    _relu(1, 16, 3, 2, se=True),
    _relu(72 / 16., 24, 3, 2),
    _relu(88 / 24., 24, 3, 1),
    _hswish(4, 40, 5, 2, se=True),
    _hswish(6, 40, 5, 1, se=True),
    _hswish(6, 40, 5, 1, se=True),
    _hswish(3, 48, 5, 1, se=True),
    _hswish(3, 48, 5, 1, se=True),
    _hswish(3, 48, 5, 2, se=True),
    _hswish(6, 48, 5, 1, se=True),
    _hswish(6, 48, 5, 1, se=True),
)
SMALL_SEG_HEAD_OUTPUTS = 288

# Decoder inputs: the depthwise output of the last block at each stride
# (before its squeeze-and-excitation).
LARGE_SEG_DECODER_END_POINTS = {
    4: ('layer_4/depthwise_output',),
    8: ('layer_7/depthwise_output',),
    16: ('layer_13/depthwise_output',),
}
SMALL_SEG_DECODER_END_POINTS = {
    4: ('layer_2/depthwise_output',),
    8: ('layer_4/depthwise_output',),
    16: ('layer_9/depthwise_output',),
}


def _depth(value, depth_multiplier):
  return mobilenet_v2.make_divisible(value * depth_multiplier, DIVISIBLE_BY,
                                     MIN_DEPTH)


def squeeze_excite(x, params):
  """x times a per-channel gate computed from its spatial mean.

  Args:
    x: NHWC input (a block's depthwise output).
    params: the backbone's ConvParams (initialiser, weight decay); the two
      convs have biases and no BN.

  Returns:
    The gated tensor, shaped as `x`.
  """
  channels = int(x.shape[-1])
  squeezed = mobilenet_v2.make_divisible(channels / SQUEEZE_FACTOR,
                                         DIVISIBLE_BY)
  with tf.variable_scope('squeeze_excite'):
    pooled = tf.reduce_mean(x, axis=[1, 2], keepdims=True)
    net = layers.conv2d(pooled, squeezed, 1, params, 'Conv', normalize=False,
                        activation=tf.nn.relu)
    gate = layers.conv2d(net, channels, 1, params, 'Conv_1', normalize=False,
                         activation=layers.hard_sigmoid)
    return x * gate


def mobilenet_v3_base(images, blocks, head_outputs, depth_multiplier=1.0,
                      output_stride=None, params=None):
  """A MobileNetV3 from normalised images up to its final 1x1 `Conv_1`.

  Args:
    images: float NHWC input, already normalised to [-1, 1].
    blocks: the inverted-residual blocks (e.g. LARGE_SEG_BLOCKS).
    head_outputs: channels of `Conv_1` before the multiplier.
    depth_multiplier: channel multiplier.
    output_stride: 8, 16 or 32 (None: 32, no atrous convs).
    params: the ConvParams of the backbone (its activation is replaced per
      layer).

  Returns:
    (features, end_points): end points are named as the original's
    ('layer_1' (stem) .. 'layer_N' (`Conv_1`), 'layer_N/expansion_output',
    'layer_N/depthwise_output', 'layer_N/output').
  """
  if depth_multiplier <= 0:
    raise ValueError('depth_multiplier must be > 0, got %r' % depth_multiplier)
  # The final 1x1 conv has stride 1 and never becomes atrous.
  plan = mobilenet_v2.strides_and_rates(
      [2] + [b.stride for b in blocks] + [1], output_stride)
  end_points = {}
  with tf.variable_scope(SCOPE):
    net = layers.conv2d(images, _depth(STEM_OUTPUTS, depth_multiplier), 3,
                        params, 'Conv', stride=plan[0][0],
                        activation=hard_swish)
    end_points['layer_1'] = net
    for i, block in enumerate(blocks):
      stride, rate = plan[i + 1]
      in_channels = int(net.shape[-1])
      inner = mobilenet_v2.make_divisible(in_channels * block.expansion,
                                          DIVISIBLE_BY)
      block_params = params.replace(activation=block.activation)
      transform = (functools.partial(squeeze_excite, params=params)
                   if block.squeeze_excite else None)
      net, points = mobilenet_v2.expanded_conv(
          net, _depth(block.num_outputs, depth_multiplier), inner, stride,
          rate, block_params, 'expanded_conv' + ('_%d' % i if i else ''),
          kernel_size=block.kernel_size, transform=transform)
      name = 'layer_%d' % (i + 2)
      end_points[name] = net
      for suffix, tensor in points.items():
        end_points[name + '/' + suffix] = tensor
    net = layers.conv2d(net, _depth(head_outputs, depth_multiplier), 1,
                        params, 'Conv_1', activation=hard_swish)
    end_points['layer_%d' % (len(blocks) + 2)] = net
  return net, end_points


def backbone_params(weight_decay, bn_training):
  """The ConvParams of the original's MobileNetV3 (its mobilenet_v2 arg
  scope under the V3 definitions' ReLU default)."""
  return mobilenet_v2.backbone_params(weight_decay, bn_training).replace(
      activation=tf.nn.relu)


def _build(images, options, is_training, bn_training, weight_decay, blocks,
           head_outputs):
  """Registry entry: MobileNetV3 features for DeepLab.

  Args:
    images: normalised float NHWC images.
    options: ModelOptions (depth_multiplier, output_stride; divisible_by is
      ignored, as by the original).
    is_training: unused (the base has no dropout).
    bn_training: BN in training mode.
    weight_decay: L2 factor of the conv weights.
    blocks, head_outputs: the network's definition.

  Returns:
    (features, end_points).
  """
  del is_training  # Only BN depends on the mode, through bn_training.
  return mobilenet_v3_base(
      images, blocks, head_outputs, depth_multiplier=options.depth_multiplier,
      output_stride=options.output_stride,
      params=backbone_params(weight_decay, bn_training))


def _register(name, blocks, head_outputs, decoder_end_points):
  registry.register(
      name, scope=SCOPE, mean_pixel=registry.INCEPTION_MEAN_PIXEL,
      normalize=registry.zero_mean_unit_range,
      decoder_end_points=decoder_end_points,
      # The original trainer's --weight_decay default.
      default_weight_decay=4e-5,
      options_read=('depth_multiplier',),
  )(functools.partial(_build, blocks=blocks, head_outputs=head_outputs))


_register('mobilenet_v3_large_seg', LARGE_SEG_BLOCKS, LARGE_SEG_HEAD_OUTPUTS,
          LARGE_SEG_DECODER_END_POINTS)
_register('mobilenet_v3_small_seg', SMALL_SEG_BLOCKS, SMALL_SEG_HEAD_OUTPUTS,
          SMALL_SEG_DECODER_END_POINTS)
