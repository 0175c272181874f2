"""MobileNetV2 feature extractor, as DeepLab builds it (`mobilenet_v2`).

Variables live under `MobilenetV2/` with the names of the original slim
model (`Conv`, `expanded_conv`, `expanded_conv_1`, ... `expanded_conv_16`),
so the model-zoo checkpoints (e.g. mobilenetv2_coco_voc_trainaug) restore
without any mapping. DeepLab stops the network at `expanded_conv_16`
(320 channels): the final 1x1 `Conv_1` of the classifier is not built.

Facts reproduced from the original:
- ReLU6 after the stem conv, the expansion and the depthwise conv; the
  projection is linear; BN everywhere (decay 0.997, epsilon 1e-3, scale).
- 'SAME' padding (DeepLab does not ask for explicit padding).
- `output_stride`: once the running stride reaches it, later strided layers
  run with stride 1 and the atrous rate of the following layers grows by
  the skipped stride (the layer that drops its stride keeps the old rate).
- `depth_multiplier` scales every layer's outputs, rounded to a multiple of
  `divisible_by` (default 8 at multiplier 1.0, else 1) with a minimum depth
  (8 at multiplier 1.0, else 1). The expansion width is 6x the block input
  rounded to a multiple of 8 whatever the multiplier; the first block does
  not expand.
- L2 weight decay on the 1x1 / stem conv weights, not on depthwise weights;
  truncated-normal initialisation with stddev 0.09.
- Inputs are scaled to [-1, 1]: (2 / 255) * x - 1.
"""
import collections

import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.model import registry

SCOPE = 'MobilenetV2'
BATCH_NORM = layers.BatchNormParams(decay=0.997, epsilon=1e-3, scale=True)
WEIGHTS_STDDEV = 0.09
EXPANSION_FACTOR = 6
# The expansion width is rounded to this, independently of depth_multiplier.
EXPANSION_DIVISIBLE_BY = 8

# Decoder inputs: the depthwise output of the last block at each stride.
DECODER_END_POINTS = {
    4: ('layer_4/depthwise_output',),
    8: ('layer_7/depthwise_output',),
    16: ('layer_14/depthwise_output',),
}

_Block = collections.namedtuple('_Block', ['stride', 'num_outputs'])

# The stem conv (3x3, stride 2, 32 channels) is layer_1; these are the
# inverted-residual blocks, layer_2 .. layer_18.
STEM_OUTPUTS = 32
BLOCKS = (
    _Block(1, 16),
    _Block(2, 24), _Block(1, 24),
    _Block(2, 32), _Block(1, 32), _Block(1, 32),
    _Block(2, 64), _Block(1, 64), _Block(1, 64), _Block(1, 64),
    _Block(1, 96), _Block(1, 96), _Block(1, 96),
    _Block(2, 160), _Block(1, 160), _Block(1, 160),
    _Block(1, 320),
)


def make_divisible(value, divisor, min_value=None):
  """Rounds `value` to a multiple of `divisor`, at least `min_value`.

  As slim's mobilenet: round half up, and never go more than 10 % below
  the requested value.
  """
  if min_value is None:
    min_value = divisor
  rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
  if rounded < 0.9 * value:
    rounded += divisor
  return int(rounded)


def layer_depths(depth_multiplier=1.0, divisible_by=None):
  """Output channels of the stem and of each block after the multiplier.

  Args:
    depth_multiplier: the channel multiplier (> 0).
    divisible_by: rounding of the channel counts; None for the original's
      default (8 at multiplier 1.0, else 1).

  Returns:
    (stem channels, [block output channels, ...]).
  """
  if divisible_by is None:
    divisible_by = 8 if depth_multiplier == 1.0 else 1
  min_depth = 8 if depth_multiplier == 1.0 else 1

  def scale(d):
    return make_divisible(d * depth_multiplier, divisible_by, min_depth)
  return scale(STEM_OUTPUTS), [scale(b.num_outputs) for b in BLOCKS]


def layer_strides_and_rates(output_stride):
  """(stride, atrous rate) per layer, stem first, for `output_stride`."""
  return strides_and_rates([2] + [b.stride for b in BLOCKS], output_stride)


def strides_and_rates(strides, output_stride):
  """(stride, atrous rate) of each layer of a slim mobilenet.

  Once the running stride equals `output_stride`, a layer keeps the current
  rate but runs at stride 1, and the layers after it use the rate times the
  stride it skipped.

  Args:
    strides: the nominal stride of each layer, in order.
    output_stride: the largest running stride, or None for no limit.

  Returns:
    [(stride, rate), ...], one per layer.
  """
  plan = []
  current_stride, rate = 1, 1
  for stride in strides:
    if output_stride is not None and current_stride == output_stride:
      plan.append((1, rate))
      rate *= stride
    else:
      plan.append((stride, 1))
      current_stride *= stride
  return plan


def expanded_conv(x, num_outputs, inner, stride, rate, params, scope,
                  kernel_size=3, transform=None):
  """Inverted residual block of slim's mobilenets.

  A 1x1 expansion to `inner` channels (skipped unless it widens the input),
  a depthwise conv, an optional `transform` of its output (MobileNetV3's
  squeeze-and-excitation) and a linear 1x1 projection; the input is added
  back when the shapes allow it.

  Args:
    x: NHWC input.
    num_outputs: channels of the projection.
    inner: channels of the expansion.
    stride, rate: of the depthwise conv.
    params: ConvParams of the expansion and depthwise conv (their
      activation); the projection is linear.
    scope: variable scope (e.g. 'expanded_conv_3').
    kernel_size: of the depthwise conv.
    transform: fn(depthwise output) -> tensor before the projection.

  Returns:
    (output, {'expansion_output' | 'depthwise_output' | 'output': tensor}).
  """
  points = {}
  with tf.variable_scope(scope):
    in_channels = int(x.shape[-1])
    net = x
    if inner > in_channels:
      net = layers.conv2d(net, inner, 1, params, 'expand')
      net = tf.identity(net, name='expansion_output')
      points['expansion_output'] = net
    net = layers.depthwise_conv2d(net, kernel_size, params, 'depthwise',
                                  stride=stride, rate=rate)
    net = tf.identity(net, name='depthwise_output')
    points['depthwise_output'] = net
    if transform is not None:
      net = transform(net)
    net = layers.conv2d(net, num_outputs, 1, params, 'project',
                        activation=None)
    if stride == 1 and num_outputs == in_channels:
      net = net + x
    net = tf.identity(net, name='output')
    points['output'] = net
  return net, points


def _expansion_width(in_channels, first_block):
  if first_block:
    return in_channels
  return make_divisible(in_channels * EXPANSION_FACTOR, EXPANSION_DIVISIBLE_BY)


def mobilenet_v2_base(images, depth_multiplier=1.0, divisible_by=None,
                      output_stride=None, params=None):
  """MobileNetV2 from normalised images up to expanded_conv_16.

  Args:
    images: float NHWC input, already normalised to [-1, 1].
    depth_multiplier: channel multiplier.
    divisible_by: channel rounding (None: the original's default).
    output_stride: 8, 16 or 32 (None: 32, no atrous convs).
    params: the ConvParams of the backbone.

  Returns:
    (features, end_points): end points are named as the original's
    ('layer_1' .. 'layer_18', 'layer_N/expansion_output',
    'layer_N/depthwise_output', 'layer_N/output').
  """
  if depth_multiplier <= 0:
    raise ValueError('depth_multiplier must be > 0, got %r' % depth_multiplier)
  stem_depth, block_depths = layer_depths(depth_multiplier, divisible_by)
  plan = layer_strides_and_rates(output_stride)
  end_points = {}
  with tf.variable_scope(SCOPE):
    stride, _ = plan[0]
    net = layers.conv2d(images, stem_depth, 3, params, 'Conv', stride=stride)
    end_points['layer_1'] = net
    for i, depth in enumerate(block_depths):
      stride, rate = plan[i + 1]
      scope = 'expanded_conv' + ('_%d' % i if i else '')
      inner = _expansion_width(int(net.shape[-1]), first_block=(i == 0))
      net, points = expanded_conv(net, depth, inner, stride, rate, params,
                                  scope)
      name = 'layer_%d' % (i + 2)
      end_points[name] = net
      for suffix, tensor in points.items():
        end_points[name + '/' + suffix] = tensor
  return net, end_points


def backbone_params(weight_decay, bn_training):
  """The ConvParams the original's mobilenet_v2 training scope sets."""
  return layers.ConvParams(
      weight_decay=weight_decay, batch_norm=BATCH_NORM,
      bn_training=bn_training, activation=tf.nn.relu6,
      weights_stddev=WEIGHTS_STDDEV, regularize_depthwise=False)


@registry.register(
    'mobilenet_v2', scope=SCOPE, mean_pixel=registry.INCEPTION_MEAN_PIXEL,
    normalize=registry.zero_mean_unit_range,
    decoder_end_points=DECODER_END_POINTS,
    # The original trainer's --weight_decay default.
    default_weight_decay=4e-5,
    options_read=('depth_multiplier', 'divisible_by'))
def build(images, options, is_training, bn_training, weight_decay):
  """Registry entry: MobileNetV2 features for DeepLab.

  Args:
    images: normalised float NHWC images.
    options: ModelOptions (depth_multiplier, divisible_by, output_stride).
    is_training: unused (MobileNetV2's base has no dropout).
    bn_training: BN in training mode.
    weight_decay: L2 factor of the conv weights.

  Returns:
    (features, end_points).
  """
  del is_training  # Only BN depends on the mode, through bn_training.
  return mobilenet_v2_base(
      images, depth_multiplier=options.depth_multiplier,
      divisible_by=options.divisible_by, output_stride=options.output_stride,
      params=backbone_params(weight_decay, bn_training))
