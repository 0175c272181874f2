"""DeepLabv3+ meta-architecture: backbone, head, multi-scale inference.

Builds the same graph as the original DeepLab's `model.py` on top of the
registered backbones, the head layers (`head`: ASPP, decoder, logits) and
the slim-compatible layers, so that the variables (names, shapes,
regularisation, BN updates) match the original checkpoints and the outputs
match its exported graph:

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
from deeplab_train.model import dense_prediction_cell
from deeplab_train.model import head
from deeplab_train.model import registry

OUTPUT_TYPE = head.OUTPUT_TYPE
PROB_SUFFIX = '_prob'

MERGED_LOGITS_SCOPE = 'merged_logits'
META_ARCHITECTURE_SCOPE = dense_prediction_cell.META_ARCHITECTURE_SCOPE

# The original's dropout after concat_projection, in training.
DROPOUT_KEEP_PROB = 0.9


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
    return [head.LOGITS_SCOPE_NAME]
  return [head.LOGITS_SCOPE_NAME, head.IMAGE_POOLING_SCOPE, head.ASPP_SCOPE,
          head.CONCAT_PROJECTION_SCOPE, head.DECODER_SCOPE,
          META_ARCHITECTURE_SCOPE]


def extract_features(images, options, weight_decay=None, is_training=False,
                     fine_tune_batch_norm=False, drop_path=None):
  """Backbone features followed by ASPP (when aspp_with_batch_norm) with,
  in training, the dropout after its concat_projection; or the dense
  prediction cell in place of ASPP when options has one.

  Args:
    images: float32 NHWC, raw pixel values in [0, 255].
    options: ModelOptions.
    weight_decay: L2 factor of the conv weights (None: the backbone
      registry entry's default).
    is_training: training graph (dropout on).
    fine_tune_batch_norm: with is_training, BN in training mode.
    drop_path: a nas_cell.DropPath for the backbones that use drop path
      (registry entry `uses_drop_path`), or None.

  Returns:
    (features, end_points, backbone).

  Raises:
    ConfigError: unknown model_variant, or drop_path for a backbone
      without drop path.
  """
  backbone = registry.get(options.model_variant)
  if weight_decay is None:
    weight_decay = backbone.default_weight_decay
  bn_training = bool(is_training and fine_tune_batch_norm)
  features, end_points = backbone.build(
      backbone.normalize(images), options, is_training, bn_training,
      weight_decay, **_drop_path_args(backbone, drop_path))
  if not options.aspp_with_batch_norm:
    return features, end_points, backbone
  if options.dense_prediction_cell_config is not None:
    # The cell replaces ASPP (its atrous and image pooling options unused).
    features = dense_prediction_cell.build_cell(
        features, options, weight_decay, is_training=is_training,
        bn_training=bn_training)
    return features, end_points, backbone
  params = head.head_params(options, weight_decay, bn_training)
  features = head.aspp(
      features, options, params,
      dropout=_concat_projection_dropout if is_training else None)
  return features, end_points, backbone


def _drop_path_args(backbone, drop_path):
  """The keyword arguments giving `drop_path` to the backbone's build."""
  if drop_path is None:
    return {}
  if not backbone.uses_drop_path:
    users = [name for name in registry.known_variants()
             if registry.get(name).uses_drop_path]
    raise ConfigError(
        '{TrainOptions.drop_path_keep_prob}=%g: drop path is a '
        'regularisation of the NAS backbones (%s); '
        '{ModelOptions.model_variant}=%s has none: leave '
        '{TrainOptions.drop_path_keep_prob} at 1', drop_path.keep_prob,
        ', '.join(users), backbone.name)
  return {'drop_path': drop_path}


def _concat_projection_dropout(features):
  with tf.name_scope(head.CONCAT_PROJECTION_SCOPE + '_dropout'):
    return tf.nn.dropout(features, rate=1.0 - DROPOUT_KEEP_PROB)


def _get_logits(images, options, weight_decay, is_training,
                fine_tune_batch_norm, drop_path=None):
  """Logits of one scale, at the decoder or backbone resolution."""
  features, end_points, backbone = extract_features(
      images, options, weight_decay=weight_decay, is_training=is_training,
      fine_tune_batch_norm=fine_tune_batch_norm, drop_path=drop_path)
  if options.decoder_output_stride:
    crop_size = options.crop_size
    if crop_size is None:
      crop_size = [tf.shape(images)[1], tf.shape(images)[2]]
    params = head.head_params(options, weight_decay,
                              bool(is_training and fine_tune_batch_norm))
    features = head.refine_by_decoder(features, end_points, backbone,
                                      crop_size, options, params)
  if options.decoder_output_is_logits:
    # The decoder gave the logits: no `logits/` convs; the tensor is named
    # after the output ('semantic:0' in the original's exported graph).
    return tf.identity(features, name=OUTPUT_TYPE)
  return head.get_branch_logits(features, options.num_classes, options,
                                weight_decay=weight_decay)


def _scaled_inputs(images, options, scale, crop_height, crop_width):
  """Images and options for one scale of the pyramid."""
  if scale == 1.0:
    return images, options
  height = head.scale_dimension(crop_height, scale)
  width = head.scale_dimension(crop_width, scale)
  scaled = head.resize_bilinear(images, [height, width])
  if options.crop_size:
    scaled.set_shape([None, height, width, images.shape[-1]])
  pool_crop = None
  if options.image_pooling_crop_size:
    pool_crop = tuple(head.scale_dimension(side, scale)
                      for side in options.image_pooling_crop_size)
  crop = (height, width) if options.crop_size else None
  return scaled, options.replace(crop_size=crop,
                                 image_pooling_crop_size=pool_crop)


def multi_scale_logits(images, options, image_pyramid=None,
                       weight_decay=None, is_training=False,
                       fine_tune_batch_norm=False, drop_path=None):
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
    drop_path: a nas_cell.DropPath (training graphs of the NAS backbones,
      which apply it only when BN is in training mode, as the original),
      or None.

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
  logits_height = head.scale_dimension(crop_height,
                                       top_scale / logits_output_stride)
  logits_width = head.scale_dimension(crop_width,
                                      top_scale / logits_output_stride)

  scales_to_logits = {}
  for scale in image_pyramid:
    scaled_images, scaled_options = _scaled_inputs(
        images, options, scale, crop_height, crop_width)
    with tf.variable_scope(tf.get_variable_scope(), reuse=tf.AUTO_REUSE):
      logits = _get_logits(scaled_images, scaled_options, weight_decay,
                           is_training, fine_tune_batch_norm, drop_path)
    logits = head.resize_bilinear(logits, [logits_height, logits_width])
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
    upsampled = head.resize_bilinear(logits, size)
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
    probabilities.append(tf.nn.softmax(head.resize_bilinear(logits, size)))

  for scale in eval_scales:
    logits = multi_scale_logits(images, options, image_pyramid=[scale])
    add(logits[OUTPUT_TYPE][MERGED_LOGITS_SCOPE], flipped=False)
    if add_flipped_images:
      flipped = multi_scale_logits(tf.reverse(images, [2]), options,
                                   image_pyramid=[scale])
      add(flipped[OUTPUT_TYPE][MERGED_LOGITS_SCOPE], flipped=True)
  mean = tf.reduce_mean(tf.stack(probabilities, axis=4), axis=4)
  return {OUTPUT_TYPE: tf.argmax(mean, 3), OUTPUT_TYPE + PROB_SUFFIX: mean}
