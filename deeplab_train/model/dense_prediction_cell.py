"""The dense prediction cell (DPC): a searched multi-scale head replacing ASPP.

The original DeepLab's `core/dense_prediction_cell.py` (used by the model
zoo's xception71_dpc_cityscapes checkpoints), built with the project's layers
so that its variables are the original's:

  meta_architecture/branch{i}                    1x1 conv or pyramid pooling
  meta_architecture/branch{i}_depthwise,         separable conv
  meta_architecture/branch{i}_pointwise
  meta_architecture/concat_projection            1x1 conv of the concatenation

The cell is a list of operations (ModelOptions.dense_prediction_cell_config,
described in `config.model.dense_prediction_cell_problem`). Each reads the
backbone features or an earlier operation's output and gives 256 channels;
all outputs are concatenated, dropped out in training (keep 0.9, before the
projection, unlike ASPP) and projected to 256 channels. Every conv has batch
norm (decay 0.9997, epsilon 1e-5) and ReLU, whatever the ASPP options say.

The model zoo's cell ships with the package (`SHIPPED_CELL`); `load_cell`
reads a cell file, where the original's path and the bare file name of the
shipped cell name that copy.
"""
import json
import os

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import model as model_config
from deeplab_train.model import head
from deeplab_train.model import layers

META_ARCHITECTURE_SCOPE = 'meta_architecture'
BRANCH_SCOPE = 'branch'

# The original's hyper-parameters of the cell (not options there either).
REDUCTION_SIZE = 256
CONCAT_CHANNELS = 256
DROPOUT_KEEP_PROB = 0.9
BATCH_NORM = layers.BatchNormParams(decay=0.9997, epsilon=1e-5, scale=True)

# The model zoo's cell (Cityscapes, 5 branches), a copy of the original's
# deeplab/core/ file beside this module.
SHIPPED_CELL = 'dense_prediction_cell_branch5_top1_cityscapes.json'
_SHIPPED_NAMES = (SHIPPED_CELL, 'deeplab/core/' + SHIPPED_CELL)


def cell_file_path(path):
  """The file a cell path names: the shipped copy for the original's path
  `deeplab/core/<SHIPPED_CELL>` or the bare file name, else `path`."""
  if os.path.normpath(path) in _SHIPPED_NAMES:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        SHIPPED_CELL)
  return path


def load_cell(path):
  """The cell described by a JSON file, checked and normalised.

  Args:
    path: a cell file, or a name of the shipped cell (`cell_file_path`).

  Returns:
    The cell as ModelOptions.dense_prediction_cell_config holds it.

  Raises:
    ConfigError: the file is missing, unreadable, not JSON or not a valid
      cell; the message names the file.
  """
  resolved = cell_file_path(path)
  if not os.path.exists(resolved):
    raise ConfigError(
        'no such file %s (the model zoo\'s cell ships with deeplab-train as '
        '%s)', resolved, SHIPPED_CELL)
  try:
    with open(resolved) as f:
      cell = json.load(f)
  except OSError as e:
    raise ConfigError('cannot read %s: %s', resolved, e) from None
  except ValueError as e:
    raise ConfigError('%s is not JSON: %s', resolved, e) from None
  problem = model_config.dense_prediction_cell_problem(cell)
  if problem:
    raise ConfigError('%s is not a valid dense prediction cell: %s',
                      resolved, problem)
  return model_config.normalized_cell(cell)


def cell_params(weight_decay, bn_training):
  """ConvParams of the cell's convs (the original's arg_scope for them)."""
  return layers.ConvParams(
      weight_decay=weight_decay, batch_norm=BATCH_NORM,
      bn_training=bn_training, activation=tf.nn.relu,
      weights_initializer=tf.glorot_uniform_initializer())


def build_cell(features, options, weight_decay, is_training=False,
               bn_training=False):
  """The cell of options.dense_prediction_cell_config on the features.

  Args:
    features: the backbone output, NHWC at options.output_stride.
    options: ModelOptions (the cell, output_stride, crop sizes).
    weight_decay: L2 factor of the conv weights.
    is_training: training graph (dropout on).
    bn_training: batch norm in training mode.

  Returns:
    The projected features, [N, h, w, CONCAT_CHANNELS].

  Raises:
    ConfigError: a pyramid pooling operation without a fixed crop size.
  """
  params = cell_params(weight_decay, bn_training)
  # The rates are those of output stride 16: doubled at 8, as the original.
  rate_multiplier = (model_config.CELL_RATES_OUTPUT_STRIDE //
                     options.output_stride)
  with tf.variable_scope(META_ARCHITECTURE_SCOPE):
    outputs = []
    for index, operation in enumerate(options.dense_prediction_cell_config):
      source = operation['input']
      net = features if source < 0 else outputs[source]
      scope = BRANCH_SCOPE + str(index)
      if operation['op'] == 'pyramid_pooling':
        outputs.append(_pyramid_pooling(net, operation, options, params,
                                        scope))
        continue
      kernel = model_config.cell_pair(operation['kernel'])
      if kernel == (1, 1):
        outputs.append(layers.conv2d(net, REDUCTION_SIZE, 1, params, scope))
      else:
        rate = tuple(r * rate_multiplier
                     for r in model_config.cell_pair(operation['rate']))
        outputs.append(_separable_conv(net, kernel, rate, params, scope))
    net = tf.concat(outputs, 3)
    if is_training:
      with tf.name_scope(head.CONCAT_PROJECTION_SCOPE + '_dropout'):
        net = tf.nn.dropout(net, rate=1.0 - DROPOUT_KEEP_PROB)
    return layers.conv2d(net, CONCAT_CHANNELS, 1, params,
                         head.CONCAT_PROJECTION_SCOPE)


def _separable_conv(x, kernel, rate, params, scope):
  """DeepLab's split separable conv (`{scope}_depthwise`, then
  `{scope}_pointwise`), with a kernel and an atrous rate per axis."""
  depthwise = params.replace(
      weights_initializer=tf.truncated_normal_initializer(
          stddev=head.DEPTHWISE_STDDEV))
  x = layers.depthwise_conv2d(x, tuple(kernel), depthwise,
                              scope + '_depthwise', rate=tuple(rate))
  pointwise = params.replace(weights_initializer=None,
                             weights_stddev=head.POINTWISE_STDDEV)
  return layers.conv2d(x, REDUCTION_SIZE, 1, pointwise, scope + '_pointwise')


def _pyramid_pooling(x, operation, options, params, scope):
  """Average pooling over a grid of the image pooling crop (VALID, stride
  1), a 1x1 conv, and a resize back to the feature size."""
  pool_crop = options.image_pooling_crop_size or options.crop_size
  if pool_crop is None:
    raise ConfigError(
        'the pyramid pooling of {ModelOptions.dense_prediction_cell_config} '
        'needs a fixed {ModelOptions.crop_size} (or '
        '{ModelOptions.image_pooling_crop_size})')
  stride = options.output_stride
  grid = model_config.cell_pair(operation['grid_size'])
  kernel = [head.scale_dimension(pool_crop[i], 1. / (stride * grid[i]))
            for i in (0, 1)]
  if options.crop_size is not None:
    size = [head.scale_dimension(side, 1. / stride)
            for side in options.crop_size]
  else:
    size = [tf.shape(x)[1], tf.shape(x)[2]]
  pooled = tf.nn.avg_pool2d(x, ksize=kernel, strides=[1, 1], padding='VALID',
                            name=scope + '_pool')
  pooled = layers.conv2d(pooled, REDUCTION_SIZE, 1, params, scope)
  resized = head.resize_bilinear(pooled, size)
  resized.set_shape([None, head.static_or_none(size[0]),
                     head.static_or_none(size[1]), REDUCTION_SIZE])
  return resized
