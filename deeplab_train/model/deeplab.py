"""DeepLabv3+ meta-architecture: backbone, ASPP, decoder, logits, inference.

Builds the same graph as the original DeepLab's `model.py` on top of the
registered backbones and the slim-compatible layers, so that the variables
(names, shapes, regularisation, BN updates) match the original checkpoints
and the outputs match its exported graph:

  backbone -> ASPP (`image_pooling`, `aspp0`, `aspp{i}[_depthwise|_pointwise]`,
  `concat_projection` + dropout) -> decoder (`decoder/feature_projection{i}`,
  `decoder/decoder_conv{0,1}`) -> `logits/semantic`.

`multi_scale_logits` returns logits at the decoder (or backbone) resolution;
`predict_labels` and `predict_labels_multi_scale` turn them into labels at
the input size. Build inside `layers.recording()` to collect the
regularisation losses and BN update ops.
"""
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.model import layers
from deeplab_train.model import registry

OUTPUT_TYPE = 'semantic'
PROB_SUFFIX = '_prob'

LOGITS_SCOPE_NAME = 'logits'
MERGED_LOGITS_SCOPE = 'merged_logits'
IMAGE_POOLING_SCOPE = 'image_pooling'
ASPP_SCOPE = 'aspp'
CONCAT_PROJECTION_SCOPE = 'concat_projection'
DECODER_SCOPE = 'decoder'
META_ARCHITECTURE_SCOPE = 'meta_architecture'

# Head constants of the original.
HEAD_BN_EPSILON = 1e-5
DROPOUT_KEEP_PROB = 0.9
DECODER_PROJECTION_FILTERS = 48
# Truncated-normal stddevs of the split separable convs and the logits; the
# other head convs use slim's default (xavier / glorot uniform).
DEPTHWISE_STDDEV = 0.33
POINTWISE_STDDEV = 0.06
LOGITS_STDDEV = 0.01


def get_extra_layer_scopes(last_layers_contain_logits_only=False):
  """Scopes of the layers on top of the backbone.

  Used to skip them when initialising from a checkpoint of another task
  (`initialize_last_layer=False`) and for the last-layer gradient
  multiplier.

  Args:
    last_layers_contain_logits_only: only the logits count as last layer.

  Returns:
    A list of variable scope names.
  """
  if last_layers_contain_logits_only:
    return [LOGITS_SCOPE_NAME]
  return [LOGITS_SCOPE_NAME, IMAGE_POOLING_SCOPE, ASPP_SCOPE,
          CONCAT_PROJECTION_SCOPE, DECODER_SCOPE, META_ARCHITECTURE_SCOPE]


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


def _static_or_none(dim):
  return None if isinstance(dim, tf.Tensor) else dim


def _head_params(options, weight_decay, bn_training):
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
  """Image-level feature: pool, 1x1 conv, resize back to the feature size."""
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
  # The original keeps ReLU here even with bounded activations.
  image_feature = layers.conv2d(pooled, depth, 1, params, IMAGE_POOLING_SCOPE,
                                activation=tf.nn.relu)
  image_feature = resize_bilinear(image_feature, [resize_height, resize_width])
  image_feature.set_shape([None, _static_or_none(resize_height),
                           _static_or_none(resize_width), depth])
  return image_feature


def _aspp(features, options, params, is_training):
  """ASPP branches, concat_projection and its dropout."""
  depth = options.aspp_convs_filters
  branches = []
  if options.add_image_level_feature:
    branches.append(_image_pooling(features, options, params))
  branches.append(layers.conv2d(features, depth, 1, params, ASPP_SCOPE + '0'))
  for i, rate in enumerate(options.atrous_rates or (), 1):
    scope = ASPP_SCOPE + str(i)
    if options.aspp_with_separable_conv:
      branches.append(_separable_conv(features, depth, params, scope, rate))
    else:
      branches.append(layers.conv2d(features, depth, 3, params, scope,
                                    rate=rate))
  net = tf.concat(branches, 3)
  net = layers.conv2d(net, depth, 1, params, CONCAT_PROJECTION_SCOPE)
  if is_training:
    with tf.name_scope(CONCAT_PROJECTION_SCOPE + '_dropout'):
      net = tf.nn.dropout(net, rate=1.0 - DROPOUT_KEEP_PROB)
  return net


def extract_features(images, options, weight_decay=None, is_training=False,
                     fine_tune_batch_norm=False):
  """Backbone features followed by ASPP (when aspp_with_batch_norm).

  Args:
    images: float32 NHWC, raw pixel values in [0, 255].
    options: ModelOptions.
    weight_decay: L2 factor of the conv weights (None: the backbone
      registry entry's default).
    is_training: training graph (dropout on).
    fine_tune_batch_norm: with is_training, BN in training mode.

  Returns:
    (features, end_points, backbone).

  Raises:
    ConfigError: unknown model_variant.
  """
  backbone = registry.get(options.model_variant)
  if weight_decay is None:
    weight_decay = backbone.default_weight_decay
  bn_training = bool(is_training and fine_tune_batch_norm)
  features, end_points = backbone.build(
      backbone.normalize(images), options, is_training, bn_training,
      weight_decay)
  if not options.aspp_with_batch_norm:
    return features, end_points, backbone
  params = _head_params(options, weight_decay, bn_training)
  return _aspp(features, options, params, is_training), end_points, backbone


def _decoder_end_point(end_points, backbone, output_stride, name):
  try:
    return end_points[name]
  except KeyError:
    raise ConfigError(
        'decoder end point %r (for --decoder_output_stride=%d) is not among '
        'the end points of backbone %r; available: %s'
        % (name, output_stride, backbone.name,
           ', '.join(sorted(end_points)))) from None


def _decoder_feature_names(backbone, output_stride):
  names = backbone.decoder_end_points.get(output_stride)
  if not names:
    raise ConfigError(
        '--decoder_output_stride=%d is not supported by --model_variant=%s; '
        'it has decoder end points for output strides %s'
        % (output_stride, backbone.name,
           ', '.join(str(s) for s in sorted(backbone.decoder_end_points))))
  return names


def refine_by_decoder(features, end_points, backbone, crop_size, options,
                      params):
  """The DeepLabv3+ decoder, one stage per decoder output stride.

  Stage k (k > 0 gets the suffix `_k`) projects each low-level end point to
  48 channels (`feature_projection{i}`), resizes everything to the stage's
  resolution, concatenates, and smooths with two 3x3 convs.

  Args:
    features: the ASPP output.
    end_points: the backbone's end points.
    backbone: the registered Backbone (its decoder_end_points).
    crop_size: (height, width) as ints or scalar Tensors.
    options: ModelOptions (decoder_output_stride, decoder_filters,
      decoder_use_separable_conv).
    params: the head's ConvParams.

  Returns:
    The decoder output.

  Raises:
    ConfigError: no end point for a requested stride, or an end point name
      missing from `end_points`.
  """
  depth = options.decoder_filters
  net = features
  with tf.variable_scope(DECODER_SCOPE):
    for stage, output_stride in enumerate(options.decoder_output_stride):
      suffix = '_%d' % stage if stage else ''
      names = _decoder_feature_names(backbone, output_stride)
      height = scale_dimension(crop_size[0], 1.0 / output_stride)
      width = scale_dimension(crop_size[1], 1.0 / output_stride)
      for i, name in enumerate(names):
        low_level = _decoder_end_point(end_points, backbone, output_stride,
                                       name)
        projected = layers.conv2d(
            low_level, DECODER_PROJECTION_FILTERS, 1, params,
            'feature_projection%d%s' % (i, suffix))
        merged = []
        for tensor in (net, projected):
          tensor = resize_bilinear(tensor, [height, width])
          tensor.set_shape([None, _static_or_none(height),
                            _static_or_none(width), None])
          merged.append(tensor)
        net = tf.concat(merged, 3)
        if options.decoder_use_separable_conv:
          net = _separable_conv(net, depth, params, 'decoder_conv0' + suffix)
          net = _separable_conv(net, depth, params, 'decoder_conv1' + suffix)
        else:
          # As the original's slim.repeat: decoder_conv{i}{suffix}/..._1, _2.
          scope = 'decoder_conv%d%s' % (i, suffix)
          with tf.variable_scope(scope):
            for rep in (1, 2):
              net = layers.conv2d(net, depth, 3, params,
                                  '%s_%d' % (scope, rep))
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
      raise ConfigError(
          '--logits_kernel_size must be 1 when atrous_rates is empty or '
          'aspp_with_batch_norm is on; got %d' % kernel_size)
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


def _get_logits(images, options, weight_decay, is_training,
                fine_tune_batch_norm):
  """Logits of one scale, at the decoder or backbone resolution."""
  features, end_points, backbone = extract_features(
      images, options, weight_decay=weight_decay, is_training=is_training,
      fine_tune_batch_norm=fine_tune_batch_norm)
  if options.decoder_output_stride:
    crop_size = options.crop_size
    if crop_size is None:
      crop_size = [tf.shape(images)[1], tf.shape(images)[2]]
    params = _head_params(options, weight_decay,
                          bool(is_training and fine_tune_batch_norm))
    features = refine_by_decoder(features, end_points, backbone, crop_size,
                                 options, params)
  return get_branch_logits(features, options.num_classes, options,
                           weight_decay=weight_decay)


def _scaled_inputs(images, options, scale, crop_height, crop_width):
  """Images and options for one scale of the pyramid."""
  if scale == 1.0:
    return images, options
  height = scale_dimension(crop_height, scale)
  width = scale_dimension(crop_width, scale)
  scaled = resize_bilinear(images, [height, width])
  if options.crop_size:
    scaled.set_shape([None, height, width, images.shape[-1]])
  pool_crop = None
  if options.image_pooling_crop_size:
    pool_crop = (scale_dimension(options.image_pooling_crop_size[0], scale),
                 scale_dimension(options.image_pooling_crop_size[1], scale))
  crop = (height, width) if options.crop_size else None
  return scaled, options.replace(crop_size=crop,
                                 image_pooling_crop_size=pool_crop)


def multi_scale_logits(images, options, image_pyramid=None,
                       weight_decay=None, is_training=False,
                       fine_tune_batch_norm=False):
  """Logits for each scale of an image pyramid, and their merge.

  Every scale shares the variables (built with AUTO_REUSE). Each scale's
  logits are resized (bilinear, align_corners) to the logits size of the
  largest scale (at least 1.0); 'merged_logits' is their max or mean
  (options.merge_method). With one scale only 'merged_logits' is returned.

  Args:
    images: float32 NHWC, raw pixel values in [0, 255].
    options: ModelOptions.
    image_pyramid: input scales; None or empty for (1.0,).
    weight_decay: L2 factor of the conv weights (None: the backbone
      registry entry's default).
    is_training: training graph (dropout on).
    fine_tune_batch_norm: with is_training, BN in training mode.

  Returns:
    {'semantic': {'merged_logits': T, 'logits_1.00': T, ...}}, logits
    [N, h, w, num_classes] at the decoder (or backbone) output stride.

  Raises:
    ConfigError: invalid options or unknown model_variant.
  """
  options.validate()
  image_pyramid = list(image_pyramid or [1.0])
  if options.crop_size:
    crop_height, crop_width = options.crop_size
  else:
    crop_height, crop_width = tf.shape(images)[1], tf.shape(images)[2]
  if options.decoder_output_stride:
    logits_output_stride = min(options.decoder_output_stride)
  else:
    logits_output_stride = options.output_stride
  top_scale = max(1.0, max(image_pyramid))
  logits_height = scale_dimension(crop_height,
                                  top_scale / logits_output_stride)
  logits_width = scale_dimension(crop_width, top_scale / logits_output_stride)

  scales_to_logits = {}
  for scale in image_pyramid:
    scaled_images, scaled_options = _scaled_inputs(
        images, options, scale, crop_height, crop_width)
    with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
      logits = _get_logits(scaled_images, scaled_options, weight_decay,
                           is_training, fine_tune_batch_norm)
    logits = resize_bilinear(logits, [logits_height, logits_width])
    if len(image_pyramid) == 1:
      return {OUTPUT_TYPE: {MERGED_LOGITS_SCOPE: logits}}
    scales_to_logits['logits_%.2f' % scale] = logits

  stacked = tf.stack(list(scales_to_logits.values()), axis=4)
  merge = tf.reduce_max if options.merge_method == 'max' else tf.reduce_mean
  scales_to_logits[MERGED_LOGITS_SCOPE] = merge(stacked, axis=4)
  return {OUTPUT_TYPE: scales_to_logits}


def predict_labels(images, options, image_pyramid=None):
  """Labels at the input size (inference graph: no dropout, BN frozen).

  With options.prediction_with_upsampled_logits the logits are upsampled
  (bilinear, align_corners) to the image size before the argmax; otherwise
  the argmax is upsampled (nearest, align_corners).

  Args:
    images: float32 NHWC, raw pixel values in [0, 255].
    options: ModelOptions.
    image_pyramid: input scales for multi-scale feature extraction.

  Returns:
    {'semantic': int64 [N, H, W] labels,
     'semantic_prob': float [N, H, W, num_classes] softmax probabilities}.
  """
  logits = multi_scale_logits(images, options, image_pyramid=image_pyramid,
                              is_training=False, fine_tune_batch_norm=False)
  logits = logits[OUTPUT_TYPE][MERGED_LOGITS_SCOPE]
  size = tf.shape(images)[1:3]
  if options.prediction_with_upsampled_logits:
    upsampled = resize_bilinear(logits, size)
    return {OUTPUT_TYPE: tf.argmax(upsampled, 3),
            OUTPUT_TYPE + PROB_SUFFIX: tf.nn.softmax(upsampled)}
  labels = tf.image.resize_nearest_neighbor(
      tf.expand_dims(tf.argmax(logits, 3), 3), size, align_corners=True,
      name='resize_prediction')
  probs = tf.image.resize_bilinear(tf.nn.softmax(logits), size,
                                   align_corners=True, name='resize_prob')
  return {OUTPUT_TYPE: tf.squeeze(labels, 3), OUTPUT_TYPE + PROB_SUFFIX: probs}


def predict_labels_multi_scale(images, options, eval_scales=(1.0,),
                               add_flipped_images=False):
  """Labels from softmax probabilities averaged over scales (and flips).

  For each scale (and its left-right flip, flipped back) the merged logits
  are upsampled to the image size, turned into probabilities, and the mean
  probability is argmax-ed, as the original's multi-scale evaluation.

  Args:
    images: float32 NHWC, raw pixel values in [0, 255].
    options: ModelOptions.
    eval_scales: input scales.
    add_flipped_images: also evaluate the left-right flipped images.

  Returns:
    {'semantic': int64 [N, H, W] labels,
     'semantic_prob': float [N, H, W, num_classes] averaged probabilities}.
  """
  size = tf.shape(images)[1:3]
  probabilities = []

  def add(logits, flipped):
    if flipped:
      logits = tf.reverse(logits, [2])
    probabilities.append(tf.nn.softmax(resize_bilinear(logits, size)))

  for scale in eval_scales:
    logits = multi_scale_logits(images, options, image_pyramid=[scale])
    add(logits[OUTPUT_TYPE][MERGED_LOGITS_SCOPE], flipped=False)
    if add_flipped_images:
      flipped = multi_scale_logits(tf.reverse(images, [2]), options,
                                   image_pyramid=[scale])
      add(flipped[OUTPUT_TYPE][MERGED_LOGITS_SCOPE], flipped=True)
  mean = tf.reduce_mean(tf.stack(probabilities, axis=4), axis=4)
  return {OUTPUT_TYPE: tf.argmax(mean, 3), OUTPUT_TYPE + PROB_SUFFIX: mean}
