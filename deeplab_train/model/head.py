"""The layers DeepLab puts on a backbone: ASPP, decoder and logits.

Built as the original DeepLab's `model.py` builds them, so that variable
names, shapes and initialisers match its checkpoints:

  ASPP: `image_pooling`, `aspp0`, `aspp{i}` (separable:
  `aspp{i}_depthwise` / `aspp{i}_pointwise`), `concat_projection`;
  decoder: `decoder/feature_projection{i}`, `decoder/decoder_conv{0,1}`;
  logits: `logits/semantic`.

MobileNetV3's head (the original's options of the same names): the image
pooling branch as a squeeze-and-excitation gate of the ASPP output
(`aspp_with_squeeze_and_excitation`, `image_se_uses_qsigmoid`), no
`concat_projection` (`aspp_with_concat_projection`), a decoder that adds
instead of concatenating (`decoder_use_sum_merge`: `decoder_conv0` or
`decoder_split_sep_conv0_{depthwise,pointwise}`) and whose output is the
logits (`decoder_output_is_logits`: its convs have biases, no BN, no
activation, and the sum merge's is 1x1; there is no `logits/` scope).

The dropout after `concat_projection` is given by `deeplab`, which also
assembles the scales.
"""
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import model as model_config
from deeplab_train.model import layers
from deeplab_train.model import registry

LOGITS_SCOPE_NAME = 'logits'
IMAGE_POOLING_SCOPE = 'image_pooling'
ASPP_SCOPE = 'aspp'
CONCAT_PROJECTION_SCOPE = 'concat_projection'
DECODER_SCOPE = 'decoder'
# The logits conv's name under `logits/` (the original's output type).
OUTPUT_TYPE = 'semantic'

# Head constants of the original.
HEAD_BN_EPSILON = 1e-5
DECODER_PROJECTION_FILTERS = 48
# Truncated-normal stddevs of the split separable convs and the logits; the
# other head convs use slim's default (xavier / glorot uniform).
DEPTHWISE_STDDEV = 0.33
POINTWISE_STDDEV = 0.06
LOGITS_STDDEV = 0.01


def scale_dimension(dim, scale):
  """The original's scaled size: int((dim - 1) * scale + 1).

  Args:
    dim: a Python number or a scalar int Tensor.
    scale: float factor.

  Returns:
    The scaled dimension (int, or int32 Tensor for a Tensor input).
  """
  if isinstance(dim, tf.Tensor):
    return tf.cast((tf.cast(dim, tf.float32) - 1.0) * scale + 1.0, tf.int32)
  return int((float(dim) - 1.0) * scale + 1.0)


def resize_bilinear(images, size, output_dtype=None):
  """Bilinear resize with align_corners=True, computed in float32."""
  output_dtype = output_dtype or images.dtype
  resized = tf.image.resize_bilinear(
      tf.cast(images, tf.float32), size, align_corners=True)
  return tf.cast(resized, output_dtype)


def static_or_none(dim):
  """`dim` for a static shape: None when it is only known as a Tensor."""
  return None if isinstance(dim, tf.Tensor) else dim


def head_params(options, weight_decay, bn_training):
  """ConvParams of ASPP and decoder (the original's arg_scope for them)."""
  activation = tf.nn.relu6 if options.use_bounded_activation else tf.nn.relu
  return layers.ConvParams(
      weight_decay=weight_decay,
      batch_norm=layers.BatchNormParams(
          decay=options.batch_norm_decay, epsilon=HEAD_BN_EPSILON, scale=True),
      bn_training=bn_training,
      activation=activation,
      weights_initializer=tf.glorot_uniform_initializer())


def _separable_conv(x, filters, params, scope, rate=1):
  """DeepLab's split separable conv with its own initialisers."""
  pointwise = params.replace(weights_initializer=None,
                             weights_stddev=POINTWISE_STDDEV)
  depthwise = params.replace(weights_initializer=None,
                             weights_stddev=DEPTHWISE_STDDEV,
                             regularize_depthwise=False)
  return layers.split_separable_conv2d(
      x, filters, pointwise, scope, kernel_size=3, rate=rate,
      depthwise_params=depthwise)


def _image_pooling(features, options, params):
  """Image-level feature: pool and 1x1 conv, to be resized back to the
  feature size (`_resized_image_feature`).

  As a squeeze-and-excitation gate the conv has biases instead of BN and a
  (hard) sigmoid instead of ReLU.

  Returns:
    (the feature, the (height, width) to resize it to).
  """
  depth = options.aspp_convs_filters
  if options.crop_size is not None:
    pool_crop = options.image_pooling_crop_size or options.crop_size
    pool_height = scale_dimension(pool_crop[0], 1. / options.output_stride)
    pool_width = scale_dimension(pool_crop[1], 1. / options.output_stride)
    stride = list(options.image_pooling_stride)
    pooled = tf.nn.avg_pool2d(
        features, ksize=[pool_height, pool_width], strides=stride,
        padding='VALID', name='AvgPool2D')
    resize_height = scale_dimension(options.crop_size[0],
                                    1. / options.output_stride)
    resize_width = scale_dimension(options.crop_size[1],
                                   1. / options.output_stride)
  else:
    # Without a crop size the pooling is global over the actual features.
    pooled = tf.reduce_mean(features, axis=[1, 2], keepdims=True)
    resize_height = tf.shape(features)[1]
    resize_width = tf.shape(features)[2]
  if options.aspp_with_squeeze_and_excitation:
    gate = (layers.hard_sigmoid if options.image_se_uses_qsigmoid
            else tf.nn.sigmoid)
    image_feature = layers.conv2d(pooled, depth, 1, params,
                                  IMAGE_POOLING_SCOPE, normalize=False,
                                  activation=gate)
  else:
    # The original keeps ReLU here even with bounded activations.
    image_feature = layers.conv2d(pooled, depth, 1, params,
                                  IMAGE_POOLING_SCOPE, activation=tf.nn.relu)
  return image_feature, (resize_height, resize_width)


def _resized_image_feature(image_feature, size):
  resized = resize_bilinear(image_feature, list(size))
  resized.set_shape([None, static_or_none(size[0]), static_or_none(size[1]),
                     image_feature.shape[-1]])
  return resized


def aspp(features, options, params, dropout=None):
  """ASPP branches, concatenated and merged.

  The concatenation goes through `concat_projection` and `dropout` (when
  options.aspp_with_concat_projection); with
  options.aspp_with_squeeze_and_excitation the image pooling branch is not
  concatenated but multiplies the result.

  Args:
    features: the backbone's output.
    options: ModelOptions.
    params: the head's ConvParams.
    dropout: fn(tensor) -> tensor applied after `concat_projection` (the
      training graph's dropout), or None.

  Returns:
    The ASPP output.
  """
  depth = options.aspp_convs_filters
  branches = []
  gate = None
  # The image pooling branch where it is one value per image, repeated at
  # every pixel: a resize from 1x1 (align_corners) copies the value.
  per_image = None
  if options.add_image_level_feature:
    image_feature, size = _image_pooling(features, options, params)
    if (not options.aspp_with_squeeze_and_excitation
        and options.aspp_with_concat_projection
        and layers.projects_broadcast_input_once()
        and image_feature.shape[1:3].as_list() == [1, 1]):
      per_image = image_feature
    else:
      image_feature = _resized_image_feature(image_feature, size)
      if options.aspp_with_squeeze_and_excitation:
        gate = image_feature
      else:
        branches.append(image_feature)
  branches.append(layers.conv2d(features, depth, 1, params, ASPP_SCOPE + '0'))
  for i, rate in enumerate(options.atrous_rates or (), 1):
    scope = ASPP_SCOPE + str(i)
    if options.aspp_with_separable_conv:
      branches.append(_separable_conv(features, depth, params, scope, rate))
    else:
      branches.append(layers.conv2d(features, depth, 3, params, scope,
                                    rate=rate))
  net = tf.concat(branches, 3)
  if options.aspp_with_concat_projection:
    if per_image is not None:
      net = layers.pointwise_conv2d_of_broadcast_and(
          per_image, net, depth, params, CONCAT_PROJECTION_SCOPE)
    else:
      net = layers.conv2d(net, depth, 1, params, CONCAT_PROJECTION_SCOPE)
    if dropout is not None:
      net = dropout(net)
  if gate is not None:
    net = net * gate
  return net


def _decoder_end_point(end_points, backbone, output_stride, name):
  try:
    return end_points[name]
  except KeyError:
    raise ConfigError(
        'decoder end point %r (for {ModelOptions.decoder_output_stride}=%d) '
        'is not among the end points of backbone %r; available: %s', name,
        output_stride, backbone.name, ', '.join(sorted(end_points))) from None


def _decoder_feature_names(backbone, output_stride):
  names = backbone.decoder_end_points.get(output_stride)
  if not names:
    raise ConfigError(
        '{ModelOptions.decoder_output_stride}=%d is not supported by '
        '{ModelOptions.model_variant}=%s; it has decoder end points for '
        'output strides %s', output_stride, backbone.name,
        ', '.join(str(s) for s in sorted(backbone.decoder_end_points)))
  return names


def refine_by_decoder(features, end_points, backbone, crop_size, options,
                      params):
  """The DeepLabv3+ decoder, one stage per decoder output stride.

  Stage k (k > 0 gets the suffix `_k`) projects each low-level end point to
  48 channels (`feature_projection{i}`), resizes everything to the stage's
  resolution, concatenates, and smooths with two 3x3 convs. With
  options.decoder_use_sum_merge the projection has decoder_filters channels
  and is added to one conv of the upsampled features instead. With
  options.decoder_output_is_logits every decoder conv is linear with biases
  (no BN) and none is separable; the sum merge's conv is then 1x1.

  Args:
    features: the ASPP output.
    end_points: the backbone's end points.
    backbone: the registered Backbone (its decoder_end_points).
    crop_size: (height, width) as ints or scalar Tensors.
    options: ModelOptions (decoder_output_stride, decoder_filters,
      decoder_use_separable_conv, decoder_use_sum_merge,
      decoder_output_is_logits).
    params: the head's ConvParams.

  Returns:
    The decoder output.

  Raises:
    ConfigError: no end point for a requested stride, or an end point name
      missing from `end_points`.
  """
  if options.decoder_output_is_logits:
    params = params.replace(batch_norm=None, activation=None)
  projection_filters = (options.decoder_filters if options.decoder_use_sum_merge
                        else DECODER_PROJECTION_FILTERS)
  net = features
  with tf.variable_scope(DECODER_SCOPE):
    for stage, output_stride in enumerate(options.decoder_output_stride):
      suffix = '_%d' % stage if stage else ''
      size = [scale_dimension(crop_size[0], 1.0 / output_stride),
              scale_dimension(crop_size[1], 1.0 / output_stride)]
      names = _decoder_feature_names(backbone, output_stride)
      for i, name in enumerate(names):
        low_level = _decoder_end_point(end_points, backbone, output_stride,
                                       name)
        projected = layers.conv2d(
            low_level, projection_filters, 1, params,
            'feature_projection%d%s' % (i, suffix))
        if options.decoder_use_sum_merge:
          net = _sum_merge(net, projected, size, suffix, options, params)
        else:
          net = _concat_resized((net, projected), size)
          net = _decoder_convs(net, i, suffix, options, params)
  return net


def _resized(tensor, size):
  """`tensor` resized to `size` [height, width], with its static shape."""
  tensor = resize_bilinear(tensor, size)
  tensor.set_shape([None, static_or_none(size[0]),
                    static_or_none(size[1]), None])
  return tensor


def _concat_resized(tensors, size):
  """The tensors resized to `size` [height, width], concatenated."""
  return tf.concat([_resized(tensor, size) for tensor in tensors], 3)


def _decoder_uses_separable_conv(options):
  # The original builds a logits-giving decoder from plain convs only.
  return (options.decoder_use_separable_conv and
          not options.decoder_output_is_logits)


def _sum_merge(net, projected, size, suffix, options, params):
  """One conv of the upsampled features plus the projected end point."""
  net, projected = _resized(net, size), _resized(projected, size)
  depth = options.decoder_filters
  if _decoder_uses_separable_conv(options):
    net = _separable_conv(net, depth, params,
                          'decoder_split_sep_conv0' + suffix)
  else:
    kernel_size = 1 if options.decoder_output_is_logits else 3
    net = layers.conv2d(net, depth, kernel_size, params,
                        'decoder_conv0' + suffix)
  return net + projected


def _decoder_convs(net, index, suffix, options, params):
  """The two 3x3 convs smoothing a decoder stage's merged features."""
  depth = options.decoder_filters
  if _decoder_uses_separable_conv(options):
    net = _separable_conv(net, depth, params, 'decoder_conv0' + suffix)
    return _separable_conv(net, depth, params, 'decoder_conv1' + suffix)
  # As the original's slim.repeat: decoder_conv{i}{suffix}/..._1, _2.
  scope = 'decoder_conv%d%s' % (index, suffix)
  with tf.variable_scope(scope):
    for rep in (1, 2):
      net = layers.conv2d(net, depth, 3, params, '%s_%d' % (scope, rep))
  return net


def get_branch_logits(features, num_classes, options, weight_decay=None,
                      scope_suffix=OUTPUT_TYPE):
  """The logits conv(s) under `logits/`, with biases and no BN.

  With ASPP (aspp_with_batch_norm) or no atrous rates this is one
  `logits/semantic` conv; otherwise one atrous branch per rate
  (`semantic`, `semantic_1`, ...) summed, as the original DeepLabv2 head.

  Raises:
    ConfigError: logits_kernel_size != 1 where the original requires 1.
  """
  rates = options.atrous_rates
  kernel_size = options.logits_kernel_size
  if options.aspp_with_batch_norm or rates is None:
    if kernel_size != 1:
      raise ConfigError(model_config.LOGITS_KERNEL_RULE, kernel_size)
    rates = (1,)
  if weight_decay is None:
    weight_decay = registry.get(options.model_variant).default_weight_decay
  params = layers.ConvParams(weight_decay=weight_decay, batch_norm=None,
                             activation=None, weights_stddev=LOGITS_STDDEV)
  with tf.variable_scope(LOGITS_SCOPE_NAME):
    branches = []
    for i, rate in enumerate(rates):
      scope = scope_suffix + ('_%d' % i if i else '')
      branches.append(layers.conv2d(features, num_classes, kernel_size,
                                    params, scope, rate=rate))
    return branches[0] if len(branches) == 1 else tf.add_n(branches)
