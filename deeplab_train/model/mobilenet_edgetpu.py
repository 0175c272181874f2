"""MobileNet-EdgeTPU feature extractor, as DeepLab builds it.

`mobilenet_edgetpu` is the backbone of the model zoo's EdgeTPU-DeepLab and
EdgeTPU-DeepLab-slim (the latter is the same variant with
depth_multiplier 0.75 and aspp_convs_filters 128). The original describes
the network as a MobileNetV3 conv def run by the slim mobilenet builder;
variables live under `MobilenetEdgeTPU/` with that builder's names (`Conv`,
`expanded_conv`, `expanded_conv_1` .. `expanded_conv_21`, `Conv_1`), so the
zoo checkpoints restore without any mapping.

Facts reproduced from the original:
- Two kinds of blocks. The first nine are "fused": a full kxk conv
  (`expand`, carrying the block's stride) replaces the 1x1 expansion and the
  depthwise conv, then the linear 1x1 `project`. The first block's expansion
  factor is 1, so it is a lone 1x1 projection. The others are inverted
  residual blocks (1x1 `expand`, kxk `depthwise`, linear 1x1 `project`).
  A block adds its input when its stride is 1 and its depth is unchanged,
  except `expanded_conv_13`, which never does.
- DeepLab keeps the final 1x1 conv to 1280 channels (`Conv_1`, end point
  `layer_24`): ASPP sees its output.
- ReLU everywhere (not ReLU6: the conv def's defaults win over DeepLab's
  mobilenet arg scope); BN everywhere (decay 0.997, epsilon 1e-3, scale);
  'SAME' padding; L2 weight decay on the conv weights, not on depthwise
  weights; truncated-normal initialisation with stddev 0.09.
- `output_stride` as in mobilenet_v2, but only depthwise convs get an atrous
  rate (the fused blocks are 1x1 ops to the builder). Fused blocks keep
  their own stride whatever the output stride, so an output stride below 8
  (which would have to cancel one of them) is refused.
- `depth_multiplier` scales every layer's outputs (the stem and `Conv_1`
  included), rounded to a multiple of 8 with a minimum of 8 whatever the
  multiplier; `divisible_by` is ignored, as the original ignores it. The
  expansion width is the block input times the block's factor, rounded to
  a multiple of 8.
- No decoder end points: the original defines none for this variant.
- Inputs are scaled to [-1, 1]: (2 / 255) * x - 1.
"""
import collections

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.model import layers
from deeplab_train.model import mobilenet_v2
from deeplab_train.model import registry

SCOPE = 'MobilenetEdgeTPU'
# Channel rounding and minimum depth, independent of depth_multiplier.
DIVISIBLE_BY = 8
MIN_DEPTH = 8
STEM_OUTPUTS = 32
FINAL_OUTPUTS = 1280
# The smallest output stride the fused blocks allow (see module docstring).
MIN_OUTPUT_STRIDE = 8

_Block = collections.namedtuple(
    '_Block', ['fused', 'kernel', 'stride', 'expansion', 'num_outputs',
               'residual'])


def _fused(kernel, stride, expansion, num_outputs):
  return _Block(True, kernel, stride, expansion, num_outputs, True)


def _inverted(kernel, stride, expansion, num_outputs, residual=True):
  return _Block(False, kernel, stride, expansion, num_outputs, residual)


# expanded_conv .. expanded_conv_21 (end points layer_2 .. layer_23); the
# stem conv is layer_1 and Conv_1 is layer_24.
BLOCKS = (
    _fused(3, 1, 1, 16),
    _fused(3, 2, 8, 32), _fused(3, 1, 4, 32), _fused(3, 1, 4, 32),
    _fused(3, 1, 4, 32),
    _fused(3, 2, 8, 48), _fused(3, 1, 4, 48), _fused(3, 1, 4, 48),
    _fused(3, 1, 4, 48),
    _inverted(3, 2, 8, 96), _inverted(3, 1, 4, 96), _inverted(3, 1, 4, 96),
    _inverted(3, 1, 4, 96), _inverted(3, 1, 8, 96, residual=False),
    _inverted(3, 1, 4, 96), _inverted(3, 1, 4, 96), _inverted(3, 1, 4, 96),
    _inverted(5, 2, 8, 160), _inverted(5, 1, 4, 160), _inverted(5, 1, 4, 160),
    _inverted(5, 1, 4, 160),
    _inverted(3, 1, 8, 192),
)


def scaled_depth(depth, depth_multiplier):
  """A layer's output channels after the multiplier."""
  return mobilenet_v2.make_divisible(depth * depth_multiplier, DIVISIBLE_BY,
                                     MIN_DEPTH)


def layer_strides_and_rates(output_stride):
  """(stride, atrous rate) of the stem, each block and Conv_1, in order.

  As mobilenet_v2's plan; the rate only reaches depthwise convs.

  Raises:
    ConfigError: output_stride below MIN_OUTPUT_STRIDE.
  """
  if output_stride is not None and output_stride < MIN_OUTPUT_STRIDE:
    raise ConfigError(
        '{ModelOptions.model_variant}=mobilenet_edgetpu supports '
        '{ModelOptions.output_stride} 8, 16 or 32, got %d: its strided fused '
        'blocks cannot run atrous', output_stride)
  return mobilenet_v2.strides_and_rates(
      [2] + [b.stride for b in BLOCKS] + [1], output_stride)


def _block(x, block, num_outputs, stride, rate, params, scope):
  """One fused or inverted residual block; returns (output, {suffix: t})."""
  points = {}
  with tf.variable_scope(scope):
    in_channels = int(x.shape[-1])
    inner = mobilenet_v2.make_divisible(in_channels * block.expansion,
                                        DIVISIBLE_BY)
    net = x
    if inner > in_channels:
      if block.fused:
        net = layers.conv2d(net, inner, block.kernel, params, 'expand',
                            stride=stride)
      else:
        net = layers.conv2d(net, inner, 1, params, 'expand')
      net = tf.identity(net, name='expansion_output')
      points['expansion_output'] = net
    if not block.fused:
      net = layers.depthwise_conv2d(net, block.kernel, params, 'depthwise',
                                    stride=stride, rate=rate)
      net = tf.identity(net, name='depthwise_output')
      points['depthwise_output'] = net
    net = layers.conv2d(net, num_outputs, 1, params, 'project',
                        activation=None)
    if block.residual and stride == 1 and num_outputs == in_channels:
      net = net + x
    net = tf.identity(net, name='output')
    points['output'] = net
  return net, points


def mobilenet_edgetpu_base(images, depth_multiplier=1.0, output_stride=None,
                           params=None):
  """MobileNet-EdgeTPU from normalised images up to Conv_1.

  Args:
    images: float NHWC input, already normalised to [-1, 1].
    depth_multiplier: channel multiplier (> 0).
    output_stride: 8, 16 or 32 (None: 32, no atrous convs).
    params: the ConvParams of the backbone (see `backbone_params`).

  Returns:
    (features, end_points): end points are named as the original's
    ('layer_1' .. 'layer_24', 'layer_N/expansion_output',
    'layer_N/depthwise_output', 'layer_N/output').

  Raises:
    ValueError: depth_multiplier <= 0.
    ConfigError: output_stride below 8.
  """
  if depth_multiplier <= 0:
    raise ValueError('depth_multiplier must be > 0, got %r' % depth_multiplier)
  plan = layer_strides_and_rates(output_stride)
  end_points = {}
  with tf.variable_scope(SCOPE):
    stride, _ = plan[0]
    net = layers.conv2d(images, scaled_depth(STEM_OUTPUTS, depth_multiplier),
                        3, params, 'Conv', stride=stride)
    end_points['layer_1'] = net
    for i, block in enumerate(BLOCKS):
      stride, rate = plan[i + 1]
      scope = 'expanded_conv' + ('_%d' % i if i else '')
      net, points = _block(
          net, block, scaled_depth(block.num_outputs, depth_multiplier),
          stride, rate, params, scope)
      name = 'layer_%d' % (i + 2)
      end_points[name] = net
      for suffix, tensor in points.items():
        end_points[name + '/' + suffix] = tensor
    net = layers.conv2d(net, scaled_depth(FINAL_OUTPUTS, depth_multiplier),
                        1, params, 'Conv_1')
    end_points['layer_%d' % (len(BLOCKS) + 2)] = net
  return net, end_points


def backbone_params(weight_decay, bn_training):
  """mobilenet_v2's ConvParams with ReLU, as the EdgeTPU conv def sets."""
  return mobilenet_v2.backbone_params(weight_decay, bn_training).replace(
      activation=tf.nn.relu)


@registry.register(
    'mobilenet_edgetpu', scope=SCOPE,
    mean_pixel=registry.INCEPTION_MEAN_PIXEL,
    normalize=registry.zero_mean_unit_range,
    # The original has no decoder end points for this variant.
    decoder_end_points={},
    # The original trainer's --weight_decay default.
    default_weight_decay=4e-5,
    options_read=('depth_multiplier',))
def build(images, options, is_training, bn_training, weight_decay):
  """Registry entry: MobileNet-EdgeTPU features for DeepLab.

  Args:
    images: normalised float NHWC images.
    options: ModelOptions (depth_multiplier, output_stride; divisible_by is
      ignored, as in the original).
    is_training: unused (the base has no dropout).
    bn_training: BN in training mode.
    weight_decay: L2 factor of the conv weights.

  Returns:
    (features, end_points).
  """
  del is_training  # Only BN depends on the mode, through bn_training.
  return mobilenet_edgetpu_base(
      images, depth_multiplier=options.depth_multiplier,
      output_stride=options.output_stride,
      params=backbone_params(weight_decay, bn_training))
