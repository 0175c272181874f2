"""ResNet-v1 backbones: resnet_v1_50, resnet_v1_101 and their `_beta` variants.

Bottleneck ResNet-v1 as DeepLab uses it: root layers, a 3x3/2 max-pool, then
four blocks of bottleneck units (1x1, 3x3, 1x1 convs, BN after each, ReLU
after the sum with the shortcut). Blocks 1-3 stride in their last unit;
block4 has three units whose 3x3 atrous rates are scaled by `multi_grid`.

The `_beta` variants replace the 7x7/2 root conv `conv1` by three 3x3 convs
`conv1_1` (stride 2), `conv1_2`, `conv1_3` (128 channels) and take inputs in
[-1, 1]; the plain variants subtract the ImageNet mean RGB. Both keep their
variables under `resnet_v1_50` / `resnet_v1_101` (no `_beta`), the names of
the model-zoo checkpoints. BatchNorm: decay 0.95, epsilon 1e-5; weights use a
He (variance scaling) initializer.
"""
import functools

import tensorflow.compat.v1 as tf

from deeplab_train.model import atrous
from deeplab_train.model import layers
from deeplab_train.model import registry

BATCH_NORM = layers.BatchNormParams(decay=0.95, epsilon=1e-5, scale=True)
DEFAULT_MULTI_GRID = (1, 1, 1)
# Root conv(s) stride 2, then pool1 strides 2.
_ROOT_STRIDE = 4
_UNIT = 'bottleneck_v1'

# Units in blocks 1-3 (block4 always has len(multi_grid) == 3 units).
_DEPTH_UNITS = {50: (3, 4, 6), 101: (3, 4, 23)}
_BLOCK_BOTTLENECK_DEPTH = (64, 128, 256, 512)


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
                 rate=1):
  """A conv (BN + ReLU) that pads explicitly when strided, so its output is
  aligned with a stride-1 SAME conv subsampled, whatever the input size."""
  if stride == 1:
    return layers.conv2d(x, num_outputs, kernel_size, params, scope,
                         rate=rate)
  x = layers.fixed_padding(x, kernel_size, rate)
  return layers.conv2d(x, num_outputs, kernel_size, params, scope,
                       stride=stride, rate=rate, padding='VALID')


def _bottleneck(inputs, depth, stride, rate, params, end_points):
  """One bottleneck unit; `depth` is the output depth (4x the bottleneck)."""
  bottleneck_depth = depth // 4
  with tf.variable_scope(_UNIT):
    if int(inputs.shape[-1]) == depth:
      # Identity shortcut, subsampled (1x1 max-pool in the original).
      shortcut = inputs[:, ::stride, ::stride, :] if stride > 1 else inputs
    else:
      shortcut = end_points.add('shortcut', layers.conv2d(
          inputs, depth, 1, params, 'shortcut', stride=stride,
          activation=None))
    net = end_points.add('conv1', layers.conv2d(
        inputs, bottleneck_depth, 1, params, 'conv1'))
    net = end_points.add('conv2', _conv2d_same(
        net, bottleneck_depth, 3, params, 'conv2', stride=stride, rate=rate))
    # conv3 is linear after BN; its output (before the sum) is the end point
    # the decoder projects.
    net = end_points.add('conv3', layers.conv2d(
        net, depth, 1, params, 'conv3', activation=None))
    return end_points.add(None, tf.nn.relu(shortcut + net))


def _root(images, params, beta, end_points):
  if beta:
    net = _conv2d_same(images, 64, 3, params, 'conv1_1', stride=2)
    end_points.add('conv1_1', net)
    net = end_points.add('conv1_2', _conv2d_same(net, 64, 3, params,
                                                 'conv1_2'))
    net = end_points.add('conv1_3', _conv2d_same(net, 128, 3, params,
                                                 'conv1_3'))
  else:
    net = _conv2d_same(images, 64, 7, params, 'conv1', stride=2)
    end_points.add('conv1', net)
  with tf.name_scope('pool1'):
    net = tf.nn.max_pool2d(net, 3, 2, 'SAME')
  return end_points.add('pool1', net)


def _unit_specs(num_layers, multi_grid):
  """(block scope, output depth, nominal stride, unit rate) for every unit."""
  specs = []
  for b, num_units in enumerate(_DEPTH_UNITS[num_layers]):
    depth = _BLOCK_BOTTLENECK_DEPTH[b] * 4
    for i in range(num_units):
      specs.append(('block%d' % (b + 1), depth,
                    2 if i == num_units - 1 else 1, 1))
  for rate in multi_grid:
    specs.append(('block4', _BLOCK_BOTTLENECK_DEPTH[3] * 4, 1, rate))
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
    num_layers: 50 or 101.
    beta: three 3x3 root convs instead of one 7x7.
    scope: variable scope ('resnet_v1_50' or 'resnet_v1_101').

  Returns:
    (features, end_points): block4's output at `output_stride` (2048
    channels) and a dict of layer outputs keyed by their scope relative to
    `scope` (e.g. 'block1/unit_2/bottleneck_v1/conv3').

  Raises:
    ConfigError: unreachable output_stride or bad multi_grid.
  """
  del is_training
  grid = atrous.multi_grid_rates(options, DEFAULT_MULTI_GRID,
                                 "block4's 3 units")
  specs = _unit_specs(num_layers, grid)
  plan = atrous.unit_strides_and_rates(
      [stride for _, _, stride, _ in specs], options.output_stride,
      _ROOT_STRIDE, options.model_variant)
  params = conv_params(weight_decay, bn_training)
  with tf.variable_scope(scope, values=[images]) as sc:
    end_points = atrous.EndPoints(sc.name)
    net = _root(images, params, beta, end_points)
    for block in ('block1', 'block2', 'block3', 'block4'):
      with tf.variable_scope(block):
        units = [(spec, p) for spec, p in zip(specs, plan) if spec[0] == block]
        for i, ((_, depth, _, unit_rate), (stride, rate)) in enumerate(units):
          with tf.variable_scope('unit_%d' % (i + 1)):
            net = _bottleneck(net, depth, stride, rate * unit_rate, params,
                              end_points)
        end_points.add(None, net)
  return net, end_points


def _register(name, num_layers, beta):
  scope = 'resnet_v1_%d' % num_layers
  last_block3_unit = _DEPTH_UNITS[num_layers][2] - 1
  registry.register(
      name,
      scope=scope,
      mean_pixel=(registry.INCEPTION_MEAN_PIXEL if beta
                  else registry.IMAGENET_MEAN_RGB),
      normalize=(registry.zero_mean_unit_range if beta
                 else subtract_imagenet_mean),
      # The unit before each block's strided last unit: its conv3 output.
      decoder_end_points={
          4: ('block1/unit_2/%s/conv3' % _UNIT,),
          8: ('block2/unit_3/%s/conv3' % _UNIT,),
          16: ('block3/unit_%d/%s/conv3' % (last_block3_unit, _UNIT),),
      },
      # The original trainer's --weight_decay default, which it passed to
      # every backbone (its resnet arg scope's own 1e-4 never applied).
      default_weight_decay=4e-5,
  )(functools.partial(build_resnet, num_layers=num_layers, beta=beta,
                      scope=scope))


for _layers in (50, 101):
  _register('resnet_v1_%d' % _layers, _layers, beta=False)
  _register('resnet_v1_%d_beta' % _layers, _layers, beta=True)
