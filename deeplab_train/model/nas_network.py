"""NAS backbones: nas_pnasnet (PNASNet-5 cells) and nas_hnasnet (Auto-DeepLab).

Both are a stem (`conv0` 3x3/2, `conv1` 3x3, `conv2` 3x3/2, each with its
BatchNorm `conv{i}_bn`) followed by 12 cells (`cell_0` ... `cell_11`, see
`nas_cell`) laid out on a path over resolutions: `_BACKBONES` gives each
cell's level, level L being output stride 2 ** (L + 2). Going one level down
a cell strides (and doubles its filters); going one level up the input is
first upsampled bilinearly (and the filters halve). Each cell also reads the
output two cells back. The features are the last cell's output after a ReLU.

nas_pnasnet has one path per output stride (8, 16 or 32); nas_hnasnet has a
single path and gives features at output stride 8, unless the optional
classification head (`nas_use_classification_head`) brings them to
`output_stride` with `downsample_os{N}` convs and a 1x1 conv to 2048
channels. Variables live under `pnasnet` / `hnasnet`; decoder end points are
'Stem' and 'Cell_{i}' (cell outputs before the ReLU).

BatchNorm: decay 0.9997, epsilon 1e-3. Convs have no biases; weights start
uniform with variance 1 / (3 fan_in) and every weight, depthwise ones too,
is L2-regularised. In training with batch norm trained, the cells apply
drop path when given a `nas_cell.DropPath`.
"""
import dataclasses
import functools

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.model import head
from deeplab_train.model import layers
from deeplab_train.model import nas_cell
from deeplab_train.model import registry

BATCH_NORM = layers.BatchNormParams(decay=0.9997, epsilon=1e-3, scale=True)
# Filters multiply by this at each stride (divide on the way up).
FILTER_SCALING_RATE = 2.0
_STEM_STRIDE = 4
# Filters of the classification head's downsampling convs, by their
# output stride, and of its last 1x1 conv.
_HEAD_FILTERS = {8: 256, 16: 512, 32: 1024}
_HEAD_OUTPUT_FILTERS = 2048

# The level (output stride 2 ** (level + 2)) of each cell.
_PNASNET_BACKBONES = {
    8: (1,) * 12,
    16: (1,) * 4 + (2,) * 8,
    32: (1,) * 4 + (2,) * 4 + (3,) * 4,
}
_HNASNET_BACKBONE = (0, 0, 0, 1, 2, 1, 2, 2, 3, 3, 2, 1)


@dataclasses.dataclass(frozen=True)
class _CellStep:
  """How one cell runs: its stride, filter scaling, whether its input is
  upsampled first, and the output stride of its output."""
  stride: int
  filter_scaling: float
  upsample_input: bool
  output_stride: int


def _cell_steps(backbone, remove_os32_stride):
  """The _CellStep of each cell of a backbone (a tuple of levels).

  With `remove_os32_stride` the step to level 3 does not stride (and the
  step back does not upsample): level 3 stays at output stride 16.
  """
  steps = []
  scaling, stride_so_far, previous = 1.0, _STEM_STRIDE, 0
  for level in backbone:
    stride, upsample = 1, False
    if level == previous + 1:
      stride = 1 if (level == 3 and remove_os32_stride) else 2
      scaling *= FILTER_SCALING_RATE
    elif level == previous - 1:
      upsample = not (previous == 3 and remove_os32_stride)
      scaling /= FILTER_SCALING_RATE
    stride_so_far = stride_so_far * stride // (2 if upsample else 1)
    steps.append(_CellStep(stride, scaling, upsample, stride_so_far))
    previous = level
  return steps


def _head_convs(backbone_stride, output_stride):
  """(output stride name, stride, rate) of the classification head's 3x3
  convs bringing features at `backbone_stride` to output stride 32 in name,
  at `output_stride` in fact (atrous once it is reached)."""
  convs = []
  remaining = output_stride // backbone_stride
  rate, nominal = 1, backbone_stride
  while nominal < 32:
    nominal *= 2
    if remaining != 1:
      stride = 2
      remaining //= 2
    else:
      stride = 1
      rate *= 2
    convs.append((nominal, stride, rate))
  return convs


def conv_params(weight_decay, bn_training):
  """The ConvParams of every layer of the NAS backbones."""
  return layers.ConvParams(
      weight_decay=weight_decay, batch_norm=BATCH_NORM,
      bn_training=bn_training, activation=None,
      weights_initializer=tf.variance_scaling_initializer(
          scale=1.0 / 3.0, mode='fan_in', distribution='uniform'),
      regularize_depthwise=True)


def _conv_same(x, num_outputs, kernel_size, params, scope, stride=1, rate=1):
  """A bias-free conv; strided ones pad explicitly (layers.fixed_padding)."""
  padding = 'SAME'
  if stride > 1:
    x = layers.fixed_padding(x, kernel_size, rate)
    padding = 'VALID'
  return layers.conv2d(x, num_outputs, kernel_size, params, scope,
                       stride=stride, rate=rate, padding=padding,
                       activation=None, normalize=False, use_bias=False)


def _stem(images, params):
  """(stem output, [conv1_bn, conv2_bn]): the first two 'cell outputs'."""
  net = _conv_same(images, 64, 3, params, 'conv0', stride=2)
  net = tf.nn.relu(layers.batch_norm(net, params, scope='conv0_bn'))
  net = layers.batch_norm(_conv_same(net, 64, 3, params, 'conv1'), params,
                          scope='conv1_bn')
  outputs = [net]
  net = _conv_same(tf.nn.relu(net), 128, 3, params, 'conv2', stride=2)
  net = layers.batch_norm(net, params, scope='conv2_bn')
  outputs.append(net)
  return net, outputs


def _upsample(net):
  """Twice the size (the original's (size - 1) * 2 + 1), bilinearly."""
  height, width = net.shape[1], net.shape[2]
  if height is None or width is None:
    height, width = tf.shape(net)[1], tf.shape(net)[2]
  return head.resize_bilinear(net, [head.scale_dimension(height, 2),
                                    head.scale_dimension(width, 2)])


def _classification_head(net, backbone_stride, output_stride, params,
                         end_points):
  """Downsampling convs to output stride 32 (atrous past `output_stride`),
  then a 1x1 conv to 2048 channels, each with BN and ReLU.

  `backbone_stride` is the nominal stride of the last cell's level.
  """
  for nominal, stride, rate in _head_convs(backbone_stride, output_stride):
    scope = 'downsample_os%d' % nominal
    net = _conv_same(net, _HEAD_FILTERS[nominal], 3, params, scope + '_conv',
                     stride=stride, rate=rate)
    net = layers.batch_norm(net, params, scope=scope + '_bn')
    end_points[scope] = net
    net = tf.nn.relu(net)
  scope = 'classification_head'
  net = _conv_same(net, _HEAD_OUTPUT_FILTERS, 1, params, scope + '_conv')
  net = layers.batch_norm(net, params, scope=scope + '_bn')
  end_points[scope] = net
  return tf.nn.relu(net)


def _feature_stride(steps, backbone, options):
  """The output stride of the features, checked against options.

  Raises:
    ConfigError: the features would not be at options.output_stride.
  """
  stride = steps[-1].output_stride
  if options.nas_use_classification_head:
    nominal = 2 ** (2 + backbone[-1])
    if options.output_stride % nominal:
      raise ConfigError(
          '{ModelOptions.output_stride}=%d is not a multiple of %d, the '
          'stride of the last cell of {ModelOptions.model_variant}=%s: the '
          'classification head cannot reach it', options.output_stride,
          nominal, options.model_variant)
    stride = stride * options.output_stride // nominal
  if stride != options.output_stride:
    raise ConfigError(
        '{ModelOptions.model_variant}=%s gives features at output stride %d '
        'with these options, not {ModelOptions.output_stride}=%d: set '
        'output_stride=%d (the features of nas_hnasnet are at stride 8 '
        'unless {ModelOptions.nas_use_classification_head})',
        options.model_variant, stride, options.output_stride, stride)
  return stride


def build_nas(images, options, is_training, bn_training, weight_decay,
              backbone, genotype, scope, drop_path=None):
  """Builds a NAS backbone on normalised images.

  Args:
    images: float NHWC in [-1, 1].
    options: config.ModelOptions (output_stride and the nas_* options).
    is_training: unused: as in the original, drop path and batch norm
      follow `bn_training`.
    bn_training: BatchNorm uses batch statistics and updates its moving
      averages; the cells apply `drop_path`.
    weight_decay: L2 factor of every weight.
    backbone: the cells' levels.
    genotype: the cells' nas_cell.Genotype.
    scope: variable scope ('pnasnet' or 'hnasnet').
    drop_path: a nas_cell.DropPath, or None; ignored unless bn_training.

  Returns:
    (features, end_points): the last cell's output after ReLU, and
    {'Stem': T, 'Cell_0': T, ...} (plus the classification head's).

  Raises:
    ConfigError: the features cannot be at options.output_stride.
  """
  del is_training
  steps = _cell_steps(backbone, options.nas_remove_os32_stride)
  _feature_stride(steps, backbone, options)
  params = conv_params(weight_decay, bn_training)
  cell = nas_cell.Cell(genotype, options.nas_stem_output_num_conv_filters,
                       len(backbone), params,
                       drop_path if bn_training else None)
  end_points = {}
  with tf.variable_scope(scope, values=[images]):
    net, outputs = _stem(images, params)
    end_points['Stem'] = net
    # The output stride of each entry of `outputs`.
    strides = [_STEM_STRIDE // 2, _STEM_STRIDE]
    for i, step in enumerate(steps):
      net_stride = strides[-1]
      if step.upsample_input:
        net = _upsample(net)
        net_stride //= 2
      net = cell(net, outputs[-2], 'cell_%d' % i, step.filter_scaling,
                 step.stride, cell_num=i,
                 resize_prev_layer=strides[-2] != net_stride)
      end_points['Cell_%d' % i] = net
      outputs.append(net)
      strides.append(step.output_stride)
    net = tf.nn.relu(net)
    if options.nas_use_classification_head:
      net = _classification_head(net, 2 ** (2 + backbone[-1]),
                                 options.output_stride, params, end_points)
  return net, end_points


def build_pnasnet(images, options, is_training, bn_training, weight_decay,
                  drop_path=None):
  """nas_pnasnet: PNASNet-5 cells, 4 cells at each output stride up to
  options.output_stride (8, 16 or 32). See build_nas."""
  backbone = _PNASNET_BACKBONES.get(options.output_stride)
  if backbone is None:
    raise ConfigError(
        '{ModelOptions.output_stride}=%d is not supported by '
        '{ModelOptions.model_variant}=nas_pnasnet; use 8, 16 or 32',
        options.output_stride)
  return build_nas(images, options, is_training, bn_training, weight_decay,
                   backbone, nas_cell.PNASNET_GENOTYPE, 'pnasnet',
                   drop_path=drop_path)


def _register(name, build, scope, decoder_end_points):
  registry.register(
      name,
      scope=scope,
      mean_pixel=registry.INCEPTION_MEAN_PIXEL,
      normalize=registry.zero_mean_unit_range,
      decoder_end_points=decoder_end_points,
      # The original trainer's --weight_decay default (also the NAS arg
      # scope's).
      default_weight_decay=4e-5,
      uses_drop_path=True,
      options_read=('nas_stem_output_num_conv_filters',
                    'nas_use_classification_head', 'nas_remove_os32_stride'),
  )(build)


_register('nas_pnasnet', build_pnasnet, 'pnasnet',
          {4: ('Stem',), 8: ('Cell_3',), 16: ('Cell_7',)})
_register('nas_hnasnet',
          functools.partial(build_nas, backbone=_HNASNET_BACKBONE,
                            genotype=nas_cell.HNASNET_GENOTYPE,
                            scope='hnasnet'),
          'hnasnet', {4: ('Cell_2',), 8: ('Cell_5',), 16: ('Cell_7',)})
