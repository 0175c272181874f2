"""ResNet-v1 backbones: resnet_v1_18, resnet_v1_50, resnet_v1_101 and their
`_beta` variants.

ResNet-v1 as DeepLab uses it: root layers, a 3x3/2 max-pool, then four
blocks of residual units (BN after each conv, ReLU after the sum with the
shortcut). Blocks 1-3 stride in their last unit; block4 has one unit per
`multi_grid` rate, which scales its atrous rate.

- 50 and 101 layers: bottleneck units (1x1, 3x3, 1x1 convs) under
  `bottleneck_v1`; block4 has 3 units.
- 18 layers: "lite" units of two 3x3 convs (the second one strides) under
  `lite_bottleneck_v1`, two per block; block4 has 2 units, so `multi_grid`
  takes 2 values.

The `_beta` variants replace the 7x7/2 root conv `conv1` by three 3x3 convs
`conv1_1` (stride 2), `conv1_2`, `conv1_3` (64, 64, 128 channels; a quarter
of that for resnet_v1_18_beta) and take inputs in [-1, 1]; the plain
variants subtract the ImageNet mean RGB. All keep their variables under
`resnet_v1_<layers>` (no `_beta`), the names of the model-zoo checkpoints.
BatchNorm: decay 0.95, epsilon 1e-5; weights use a He (variance scaling)
initializer.
"""
import dataclasses
import functools
from typing import Callable, Tuple

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.model import atrous
from deeplab_train.model import layers
from deeplab_train.model import registry

BATCH_NORM = layers.BatchNormParams(decay=0.95, epsilon=1e-5, scale=True)
# Root conv(s) stride 2, then pool1 strides 2.
_ROOT_STRIDE = 4


def subtract_imagenet_mean(images):
  """Plain resnet input: pixel values minus the ImageNet mean RGB."""
  images = tf.cast(images, tf.float32)
  mean = list(registry.IMAGENET_MEAN_RGB)
  channels = images.shape[-1]
  if channels is not None and int(channels) > 3:
    # Extra (non-RGB) channels are left as they are, as in the original.
    mean += [0.0] * (int(channels) - 3)
  return images - tf.constant(mean, tf.float32, shape=[1, 1, 1, len(mean)])


def _conv2d_same(x, num_outputs, kernel_size, params, scope, stride=1,
                 rate=1, **conv_args):
  """A conv (BN + ReLU) that pads explicitly when strided, so its output is
  aligned with a stride-1 SAME conv subsampled, whatever the input size."""
  if stride == 1:
    return layers.conv2d(x, num_outputs, kernel_size, params, scope,
                         rate=rate, **conv_args)
  x = layers.fixed_padding(x, kernel_size, rate)
  return layers.conv2d(x, num_outputs, kernel_size, params, scope,
                       stride=stride, rate=rate, padding='VALID', **conv_args)


def _shortcut(inputs, depth, stride, params, end_points):
  if int(inputs.shape[-1]) == depth:
    # Identity, subsampled (1x1 max-pool in the original).
    return inputs[:, ::stride, ::stride, :] if stride > 1 else inputs
  return end_points.add('shortcut', layers.conv2d(
      inputs, depth, 1, params, 'shortcut', stride=stride, activation=None))


def _bottleneck(inputs, depth, stride, rate, params, end_points):
  """One bottleneck unit; `depth` is the output depth (4x the bottleneck)."""
  bottleneck_depth = depth // 4
  with tf.variable_scope('bottleneck_v1'):
    shortcut = _shortcut(inputs, depth, stride, params, end_points)
    net = end_points.add('conv1', layers.conv2d(
        inputs, bottleneck_depth, 1, params, 'conv1'))
    net = end_points.add('conv2', _conv2d_same(
        net, bottleneck_depth, 3, params, 'conv2', stride=stride, rate=rate))
    # conv3 is linear after BN; its output (before the sum) is the end point
    # the decoder projects.
    net = end_points.add('conv3', layers.conv2d(
        net, depth, 1, params, 'conv3', activation=None))
    return end_points.add(None, layers.activate(tf.nn.relu, shortcut + net))


def _lite_bottleneck(inputs, depth, stride, rate, params, end_points):
  """One unit of resnet_v1_18: two 3x3 convs of `depth`, the second strided
  and linear after BN (its output is the decoder's end point)."""
  with tf.variable_scope('lite_bottleneck_v1'):
    shortcut = _shortcut(inputs, depth, stride, params, end_points)
    net = end_points.add('conv1', _conv2d_same(
        inputs, depth, 3, params, 'conv1', rate=rate))
    net = end_points.add('conv2', _conv2d_same(
        net, depth, 3, params, 'conv2', stride=stride, rate=rate,
        activation=None))
    return end_points.add(None, layers.activate(tf.nn.relu, shortcut + net))


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a ResNet depth is made of.

  Attributes:
    unit: fn(inputs, depth, stride, rate, params, end_points) -> output.
    unit_scope: the unit's variable scope inside `unit_<i>`.
    last_conv: the unit's last conv, linear after BN (decoder end points).
    block_units: number of units of blocks 1-3.
    block_depths: output depth of the units of blocks 1-4.
    block4_units: units of block4, i.e. the number of multi_grid rates.
    beta_root_depths: output depths of the `_beta` root convs
      conv1_1, conv1_2, conv1_3.
  """
  unit: Callable
  unit_scope: str
  last_conv: str
  block_units: Tuple[int, int, int]
  block_depths: Tuple[int, int, int, int]
  block4_units: int
  beta_root_depths: Tuple[int, int, int]

  def decoder_end_points(self):
    """{stride: (end point,)}: the last conv of the unit before the strided
    last unit of blocks 1-3 (at strides 4, 8, 16)."""
    return {
        4 * 2 ** b: ('block%d/unit_%d/%s/%s' % (
            b + 1, num_units - 1, self.unit_scope, self.last_conv),)
        for b, num_units in enumerate(self.block_units)}


_BOTTLENECK_DEPTHS = (256, 512, 1024, 2048)
LAYOUTS = {
    # The original builds resnet_v1_18_beta's root at depth multiplier 0.25.
    18: Layout(_lite_bottleneck, 'lite_bottleneck_v1', 'conv2', (2, 2, 2),
               (64, 128, 256, 512), 2, (16, 16, 32)),
    50: Layout(_bottleneck, 'bottleneck_v1', 'conv3', (3, 4, 6),
               _BOTTLENECK_DEPTHS, 3, (64, 64, 128)),
    101: Layout(_bottleneck, 'bottleneck_v1', 'conv3', (3, 4, 23),
                _BOTTLENECK_DEPTHS, 3, (64, 64, 128)),
}


def _root(images, params, root_depths, end_points):
  """The root convs (the 7x7 one, or the three 3x3 `_beta` ones) and pool1."""
  if root_depths:
    net = images
    for i, (depth, stride) in enumerate(zip(root_depths, (2, 1, 1))):
      name = 'conv1_%d' % (i + 1)
      net = end_points.add(name, _conv2d_same(net, depth, 3, params, name,
                                              stride=stride))
  else:
    net = end_points.add('conv1', _conv2d_same(images, 64, 7, params, 'conv1',
                                               stride=2))
  with tf.name_scope('pool1'):
    net = tf.nn.max_pool2d(net, 3, 2, 'SAME')
  return end_points.add('pool1', net)


def _block4_rates(options, num_units):
  """multi_grid (default all 1): one atrous rate factor per block4 unit."""
  grid = tuple(options.multi_grid or (1,) * num_units)
  if len(grid) != num_units:
    raise ConfigError('{ModelOptions.multi_grid} must have %d values for '
                      '{ModelOptions.model_variant}=%s (the rates of '
                      "block4's %d units), got %s", num_units,
                      options.model_variant, num_units,
                      ','.join(map(str, grid)))
  return grid


def _unit_specs(layout, multi_grid):
  """(block scope, output depth, nominal stride, unit rate) for every unit."""
  specs = []
  for b, num_units in enumerate(layout.block_units):
    for i in range(num_units):
      specs.append(('block%d' % (b + 1), layout.block_depths[b],
                    2 if i == num_units - 1 else 1, 1))
  for rate in multi_grid:
    specs.append(('block4', layout.block_depths[3], 1, rate))
  return specs


def conv_params(weight_decay, bn_training):
  """The ConvParams of every ResNet layer (the original's arg scope)."""
  return layers.ConvParams(
      weight_decay=weight_decay, batch_norm=BATCH_NORM,
      bn_training=bn_training, activation=tf.nn.relu, weights_stddev=None)


def build_resnet(images, options, is_training, bn_training, weight_decay,
                 num_layers, beta, scope):
  """Builds a ResNet-v1 backbone on normalised images.

  Args:
    images: float NHWC, already normalised (see the registered `normalize`).
    options: config.ModelOptions (output_stride and multi_grid are used).
    is_training: unused (no dropout in the backbone).
    bn_training: BatchNorm uses batch statistics and updates moving averages.
    weight_decay: L2 factor of conv weights.
    num_layers: 18, 50 or 101 (a key of LAYOUTS).
    beta: three 3x3 root convs instead of one 7x7.
    scope: variable scope ('resnet_v1_18', 'resnet_v1_50' or
      'resnet_v1_101').

  Returns:
    (features, end_points): block4's output at `output_stride` (2048
    channels; 512 for 18 layers) and a dict of layer outputs keyed by their
    scope relative to `scope` (e.g. 'block1/unit_2/bottleneck_v1/conv3').

  Raises:
    ConfigError: unreachable output_stride or bad multi_grid.
  """
  del is_training
  layout = LAYOUTS[num_layers]
  specs = _unit_specs(layout, _block4_rates(options, layout.block4_units))
  plan = atrous.unit_strides_and_rates(
      [stride for _, _, stride, _ in specs], options.output_stride,
      _ROOT_STRIDE, options.model_variant)
  params = conv_params(weight_decay, bn_training)
  with tf.variable_scope(scope, values=[images]) as sc:
    end_points = atrous.EndPoints(sc.name)
    net = _root(images, params, layout.beta_root_depths if beta else None,
                end_points)
    for block in ('block1', 'block2', 'block3', 'block4'):
      with tf.variable_scope(block):
        units = [(spec, p) for spec, p in zip(specs, plan) if spec[0] == block]
        for i, ((_, depth, _, unit_rate), (stride, rate)) in enumerate(units):
          with tf.variable_scope('unit_%d' % (i + 1)):
            net = layout.unit(net, depth, stride, rate * unit_rate, params,
                              end_points)
        end_points.add(None, net)
  return net, end_points


def _mean_pixel(num_layers, beta):
  if beta:
    return registry.INCEPTION_MEAN_PIXEL
  if num_layers == 18:
    # The original pads resnet_v1_18's images with 127.5 (its mean-pixel
    # table lists only resnet_v1_50/101) although it subtracts the ImageNet
    # mean: padding becomes (4.35, 11.6, 24.44), not 0. Kept, so that
    # training, evaluation and the exported graph see what its checkpoints
    # were trained and exported with.
    return registry.INCEPTION_MEAN_PIXEL
  return registry.IMAGENET_MEAN_RGB


def _register(name, num_layers, beta):
  scope = 'resnet_v1_%d' % num_layers
  registry.register(
      name,
      scope=scope,
      mean_pixel=_mean_pixel(num_layers, beta),
      normalize=(registry.zero_mean_unit_range if beta
                 else subtract_imagenet_mean),
      decoder_end_points=LAYOUTS[num_layers].decoder_end_points(),
      # The original trainer's --weight_decay default, which it passed to
      # every backbone (its resnet arg scope's own 1e-4 never applied).
      default_weight_decay=4e-5,
      options_read=('multi_grid',),
  )(functools.partial(build_resnet, num_layers=num_layers, beta=beta,
                      scope=scope))


for _layers in sorted(LAYOUTS):
  _register('resnet_v1_%d' % _layers, _layers, beta=False)
  _register('resnet_v1_%d_beta' % _layers, _layers, beta=True)
