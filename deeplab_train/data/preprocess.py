"""Training augmentation and evaluation preprocessing of one image + label.

Behaves like the original DeepLab's `input_preprocess` (same order of steps,
same resize methods and corner alignment, same random choices):

1. optional resize so the short side is `min_resize_value` without the long
   side passing `max_resize_value`, sides snapped to `k * resize_factor + 1`;
2. training only: random scale from [min_scale_factor, max_scale_factor]
   (uniform, or one of the steps of `scale_factor_step_size`);
3. pad bottom/right to at least the crop size, the image with the
   backbone's mean pixel, the label with `ignore_label`;
4. training only: random crop to the crop size, then a left-right flip with
   probability 0.5.

In training, steps 2-4 run fused (`crop_window.scale_pad_and_crop`): only
the pixels of the crop window are interpolated, and the flip only reorders
the columns sampled, with the same result. The steps themselves are in
`image_ops`.

Images are resized bilinearly and labels by nearest neighbour, both with
`align_corners=True`. Randomness comes from stateless ops driven by a
`seed` tensor of shape [2], so a seeded tf.data pipeline is reproducible
even with parallel map calls. All functions work eagerly and in graphs.
"""
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.data import crop_window
from deeplab_train.data import image_ops

FLIP_PROBABILITY = 0.5
DEFAULT_MEAN_PIXEL = (127.5, 127.5, 127.5)

# Sentinel: take the crop size from the PreprocessOptions.
FROM_OPTIONS = 'from_options'

# The steps, as callers outside data/ (evaluation, export, tests) use them.
resize_to_range = image_ops.resize_to_range
scale_image_and_label = image_ops.scale_image_and_label
pad_to_size = image_ops.pad_to_size
random_crop_offsets = crop_window.random_crop_offsets
random_crop = crop_window.random_crop
scale_pad_and_crop = crop_window.scale_pad_and_crop
scale_pad_and_crop_at = crop_window.scale_pad_and_crop_at


def random_scale_factor(min_scale, max_scale, step_size, seed):
  """A random scale: fixed, uniform in [min, max), or one of the steps.

  Returns:
    A python float when min == max, else a float32 scalar tensor.

  Raises:
    ConfigError: min < 0 or min > max.
  """
  if min_scale < 0 or min_scale > max_scale:
    raise ConfigError('{PreprocessOptions.min_scale_factor} must be in '
                      '[0, {PreprocessOptions.max_scale_factor}], got %g and '
                      '%g', min_scale, max_scale)
  if min_scale == max_scale:
    return float(min_scale)
  if not step_size:
    return tf.random.stateless_uniform([], seed, minval=min_scale,
                                       maxval=max_scale)
  num_steps = int((max_scale - min_scale) / step_size + 1)
  steps = tf.linspace(float(min_scale), float(max_scale), num_steps)
  index = tf.random.stateless_uniform([], seed, minval=0, maxval=num_steps,
                                      dtype=tf.int32)
  return steps[index]


def random_flip_decision(seed, probability=FLIP_PROBABILITY):
  """A bool scalar, True with `probability` (stateless, from `seed`)."""
  return tf.random.stateless_uniform([], seed) <= probability


def _augment(image, label, options, crop_size, mean_pixel, ignore_label,
             seed):
  """Training: random scale, pad, crop and flip, fused (only the crop
  window is interpolated)."""
  if seed is None:
    seed = tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32)
  seeds = tf.random.experimental.stateless_split(seed, 3)
  scale = random_scale_factor(options.min_scale_factor,
                              options.max_scale_factor,
                              options.scale_factor_step_size, seeds[0])
  crop_height, crop_width = crop_size
  return crop_window.scale_pad_and_crop(
      image, label, scale, crop_height, crop_width, mean_pixel,
      ignore_label, seeds[1], flip=random_flip_decision(seeds[2]))


def _check_fits_crop(image, crop_height, crop_width, name):
  """Eval: an image larger than the crop cannot be padded to it."""
  message = ('image is larger than the eval crop size %dx%d (HxW); raise '
             'the eval crop size or set min/max_resize_value. image, height, '
             'width:' % (crop_height, crop_width))
  static_hw = image.shape[:2].as_list()
  if None not in static_hw and (static_hw[0] > crop_height or
                                static_hw[1] > crop_width):
    raise ConfigError('%s %s, %d, %d' % (message, name if isinstance(
        name, str) else '', static_hw[0], static_hw[1]))
  height, width = image_ops.shape_hw(image)
  fits = tf.logical_and(height <= crop_height, width <= crop_width)
  assertion = tf.Assert(fits, [message, name, height, width])
  with tf.control_dependencies([assertion]):
    return tf.identity(image)


def _pad_for_eval(image, label, crop_size, mean_pixel, ignore_label, name):
  """Eval: pads to at least the crop size (none without one)."""
  image = tf.cast(image, tf.float32)
  if label is not None:
    label = tf.cast(label, tf.int32)
  if crop_size is None:
    return image, label
  crop_height, crop_width = crop_size
  image = _check_fits_crop(image, crop_height, crop_width, name)
  return image_ops.pad_to_at_least(image, label, crop_height, crop_width,
                                   mean_pixel, ignore_label)


def _set_shapes(image, label, crop_size):
  height, width = crop_size if crop_size is not None else (None, None)
  image.set_shape([height, width, 3])
  if label is not None:
    label.set_shape([height, width, 1])


def preprocess_image_and_label(image, label, options, ignore_label=255,
                               is_training=True,
                               mean_pixel=DEFAULT_MEAN_PIXEL,
                               crop_size=FROM_OPTIONS, seed=None, name=''):
  """Preprocesses one image and its label.

  Args:
    image: uint8 or float [H, W, 3].
    label: integer [H, W, 1], or None (eval without ground truth).
    options: PreprocessOptions (resize range, scale augmentation, crop).
    ignore_label: label value used for padding.
    is_training: random scale, crop and flip when True.
    mean_pixel: RGB value the image is padded with (the backbone's mean
      pixel, e.g. 127.5 for xception / mobilenet).
    crop_size: (height, width); FROM_OPTIONS takes `options.crop_size`.
      None (eval only) means no padding: the image keeps its size.
    seed: int32/int64 tensor [2] for the random ops; None draws one.
    name: image name (string or string tensor) for error messages.

  Returns:
    (original_image uint8 [H', W', 3] (resized if a resize range is set),
     image float32 [crop_h, crop_w, 3] (eval: padded to at least the crop),
     label int32 [crop_h, crop_w, 1] or None).

  Raises:
    ConfigError: training without a label or without a crop size.
  """
  if crop_size == FROM_OPTIONS:
    crop_size = options.crop_size
  if is_training and label is None:
    raise ConfigError('training needs labels (this split has none)')
  if is_training and crop_size is None:
    raise ConfigError('training needs a crop size '
                      '({PreprocessOptions.crop_size})')

  original_image = image
  if options.min_resize_value or options.max_resize_value:
    image, label = image_ops.resize_to_range(
        tf.cast(image, tf.float32),
        None if label is None else tf.cast(label, tf.int32),
        options.min_resize_value, options.max_resize_value,
        options.resize_factor)
    original_image = tf.saturate_cast(tf.round(image), tf.uint8)

  if is_training:
    image, label = _augment(image, label, options, crop_size, mean_pixel,
                            ignore_label, seed)
  else:
    image, label = _pad_for_eval(image, label, crop_size, mean_pixel,
                                 ignore_label, name)
  _set_shapes(image, label, crop_size)
  return tf.cast(original_image, tf.uint8), image, label
