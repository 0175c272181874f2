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

In training, steps 2-4 run fused (`scale_pad_and_crop`): only the pixels of
the crop window are interpolated, and the flip only reorders the columns
sampled, with the same result.

Images are resized bilinearly and labels by nearest neighbour, both with
`align_corners=True`. Randomness comes from stateless ops driven by a
`seed` tensor of shape [2], so a seeded tf.data pipeline is reproducible
even with parallel map calls. All functions work eagerly and in graphs.
"""
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError

FLIP_PROBABILITY = 0.5
DEFAULT_MEAN_PIXEL = (127.5, 127.5, 127.5)

# Sentinel: take the crop size from the PreprocessOptions.
FROM_OPTIONS = 'from_options'


def _shape_hw(tensor):
  shape = tf.shape(tensor)
  return shape[0], shape[1]


# The raw ops are the kernels behind the original's tf.image.resize_bilinear /
# resize_nearest_neighbor(align_corners=True), without deprecation warnings.
def resize_bilinear(image, size):
  """float image [H, W, C] -> [size[0], size[1], C], corners aligned."""
  return tf.raw_ops.ResizeBilinear(images=image[tf.newaxis], size=size,
                                  align_corners=True,
                                  half_pixel_centers=False)[0]


def resize_nearest(label, size):
  """label [H, W, C] -> [size[0], size[1], C], nearest, corners aligned."""
  return tf.raw_ops.ResizeNearestNeighbor(images=label[tf.newaxis],
                                         size=size, align_corners=True,
                                         half_pixel_centers=False)[0]


def resize_to_range_size(height, width, min_size=None, max_size=None,
                         factor=None):
  """The output size of `resize_to_range`, as an int32 tensor [2].

  The short side becomes `min_size` unless the long side would then exceed
  `max_size`, in which case the long side becomes `max_size` (lowered first
  to a multiple of `factor` plus one). Finally both sides are rounded up to
  a multiple of `factor` plus one.
  """
  h = tf.cast(height, tf.float32)
  w = tf.cast(width, tf.float32)
  if max_size is not None:
    max_size = float(max_size)
    if factor is not None:
      max_size -= (max_size - 1) % factor
  small_size = None
  if max_size is not None:
    small_scale = max_size / tf.maximum(h, w)
    small_size = tf.cast(tf.floor(tf.stack([h, w]) * small_scale), tf.int32)
  if min_size is not None:
    large_scale = float(min_size) / tf.minimum(h, w)
    new_size = tf.cast(tf.floor(tf.stack([h, w]) * large_scale), tf.int32)
    if small_size is not None:
      new_size = tf.cond(
          tf.cast(tf.reduce_max(new_size), tf.float32) > max_size,
          lambda: small_size, lambda: new_size)
  else:
    new_size = small_size
  if factor is not None:
    new_size += (factor - (new_size - 1) % factor) % factor
  return new_size


def resize_to_range(image, label=None, min_size=None, max_size=None,
                    factor=None):
  """Resizes image (bilinear) and label (nearest) into the size range.

  Args:
    image: float32 [H, W, 3].
    label: int32 [H, W, 1] or None.
    min_size / max_size / factor: see `resize_to_range_size`.

  Returns:
    (image, label) resized (label None if not given).
  """
  height, width = _shape_hw(image)
  new_size = resize_to_range_size(height, width, min_size, max_size, factor)
  image = resize_bilinear(image, new_size)
  if label is not None:
    label = resize_nearest(label, new_size)
  return image, label


def random_scale_factor(min_scale, max_scale, step_size, seed):
  """A random scale: fixed, uniform in [min, max), or one of the steps.

  Returns:
    A python float when min == max, else a float32 scalar tensor.

  Raises:
    ConfigError: min < 0 or min > max.
  """
  if min_scale < 0 or min_scale > max_scale:
    raise ConfigError('--min_scale_factor must be in [0, --max_scale_factor]'
                      ', got %g and %g' % (min_scale, max_scale))
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


def scale_image_and_label(image, label, scale):
  """Scales both by `scale` (sizes truncated to integers)."""
  if isinstance(scale, float) and scale == 1.0:
    return image, label
  new_size = tf.stack(_scaled_size(*_shape_hw(image), scale))
  image = resize_bilinear(image, new_size)
  if label is not None:
    label = resize_nearest(label, new_size)
  return image, label


def pad_to_size(tensor, target_height, target_width, pad_value,
                pad_left=False):
  """Pads the bottom and the right (or left) of [H, W, C] up to the target.

  Args:
    tensor: [H, W, C].
    target_height / target_width: the padded size (>= H, W).
    pad_value: a number, a per-channel sequence of numbers, or a tensor
      broadcastable to [1, 1, C].
    pad_left: pad on the left instead of the right (bool or bool tensor;
      for flipped windows).

  Values inside stay exactly as they are. (The original padded
  `tensor - pad_value` with zeros and added `pad_value` back, which rounds
  interpolated pixels by up to one float32 ulp, 1.5e-5 at 255; the
  direct padding here also saves two passes over the image.)
  """
  height, width = _shape_hw(tensor)
  extra_width = target_width - width
  columns = [0, extra_width]
  if pad_left is not False:
    columns = tf.where(pad_left, [extra_width, 0], [0, extra_width])
  paddings = tf.stack([[0, target_height - height], columns, [0, 0]])
  if isinstance(pad_value, (tuple, list)) and len(set(pad_value)) == 1:
    pad_value = pad_value[0]
  if isinstance(pad_value, (int, float)):
    return tf.pad(tensor, paddings,
                  constant_values=tf.cast(pad_value, tensor.dtype))
  if isinstance(pad_value, (tuple, list)):
    pad_value = tf.reshape(tf.constant(pad_value, tf.float32), [1, 1, -1])
  # Per-channel values: zero padding plus (1 where padded) * value.
  padded = tf.pad(tf.zeros_like(tensor[:, :, :1]), paddings,
                  constant_values=tf.cast(1, tensor.dtype))
  return tf.pad(tensor, paddings) + padded * tf.cast(pad_value, tensor.dtype)


def random_crop_offsets(height, width, crop_height, crop_width, seed):
  """(top, left) of a random crop window in a height x width image."""
  seeds = tf.random.experimental.stateless_split(seed, 2)
  top = tf.random.stateless_uniform([], seeds[0], minval=0,
                                    maxval=height - crop_height + 1,
                                    dtype=tf.int32)
  left = tf.random.stateless_uniform([], seeds[1], minval=0,
                                     maxval=width - crop_width + 1,
                                     dtype=tf.int32)
  return top, left


def random_crop(image, label, crop_height, crop_width, seed):
  """The same random [crop_height, crop_width] window of image and label.

  Both must be at least the crop size (pad first).
  """
  height, width = _shape_hw(image)
  top, left = random_crop_offsets(height, width, crop_height, crop_width,
                                  seed)
  image = tf.slice(image, [top, left, 0], [crop_height, crop_width, -1])
  label = tf.slice(label, [top, left, 0], [crop_height, crop_width, -1])
  return image, label


def _source_coordinates(start, size, in_size, out_size):
  """Where output pixels start..start+size-1 of an align_corners resize from
  in_size to out_size sample the input: the resize kernels' own float32
  arithmetic (scale (in-1)/(out-1), coordinate = index * scale)."""
  scale = tf.where(out_size > 1,
                   tf.cast(in_size - 1, tf.float32) /
                   tf.cast(tf.maximum(out_size - 1, 1), tf.float32), 0.0)
  return tf.cast(tf.range(start, start + size), tf.float32) * scale


def _bilinear_window(image, rows, cols):
  """ResizeBilinear (align_corners) evaluated at the given source rows and
  columns only: float32 [len(rows), len(cols), C].

  As the kernel does, each output is the vertical interpolation of two
  horizontally interpolated source rows. The horizontal step runs once per
  source row of the band that `rows` reach (fewer rows than the output
  when enlarging), then the two rows of each output row are gathered.
  `rows` must be increasing; `cols` may run either way (a flipped window).
  """
  height, width = _shape_hw(image)
  def taps(coords, size):
    low = tf.floor(coords)
    upper = tf.minimum(tf.cast(tf.math.ceil(coords), tf.int32), size - 1)
    return tf.maximum(tf.cast(low, tf.int32), 0), upper, coords - low
  top, bottom, y_lerp = taps(rows, height)
  left, right, x_lerp = taps(cols, width)
  first_row = top[0]
  band = image[first_row:bottom[-1] + 1]
  lefts = tf.cast(tf.gather(band, left, axis=1), tf.float32)
  rights = tf.cast(tf.gather(band, right, axis=1), tf.float32)
  lines = lefts + (rights - lefts) * x_lerp[tf.newaxis, :, tf.newaxis]
  upper = tf.gather(lines, top - first_row)
  lower = tf.gather(lines, bottom - first_row)
  return upper + (lower - upper) * y_lerp[:, tf.newaxis, tf.newaxis]


def _nearest_window(label, rows, cols):
  """ResizeNearestNeighbor (align_corners) at the given source coordinates:
  rounded half away from zero, as the kernel's roundf."""
  height, width = _shape_hw(label)
  def nearest(coords, size):
    whole = tf.floor(coords)
    index = whole + tf.cast(coords - whole >= 0.5, tf.float32)
    return tf.minimum(tf.cast(index, tf.int32), size - 1)
  return tf.gather(tf.gather(label, nearest(rows, height)),
                   nearest(cols, width), axis=1)


def random_flip_decision(seed, probability=FLIP_PROBABILITY):
  """A bool scalar, True with `probability` (stateless, from `seed`)."""
  return tf.random.stateless_uniform([], seed) <= probability


def _flip_if(flip, image, label):
  if flip is False:
    return image, label
  return tf.cond(flip,
                 lambda: (tf.reverse(image, [1]), tf.reverse(label, [1])),
                 lambda: (image, label))


def _scale_pad_and_crop_whole(image, label, scale, top, left, crop_height,
                              crop_width, mean_pixel, ignore_label, flip):
  """Scales the whole image, pads it to the crop size, crops, flips."""
  image, label = scale_image_and_label(tf.cast(image, tf.float32),
                                       tf.cast(label, tf.int32), scale)
  image, label = _pad_to_at_least(image, label, crop_height, crop_width,
                                  mean_pixel, ignore_label)
  image = tf.slice(image, [top, left, 0], [crop_height, crop_width, -1])
  label = tf.slice(label, [top, left, 0], [crop_height, crop_width, -1])
  return _flip_if(flip, image, label)


def _pad_to_at_least(image, label, crop_height, crop_width, mean_pixel,
                     ignore_label):
  """Pads bottom/right to at least the crop size: image with the mean
  pixel, label (may be None) with the ignore label."""
  height, width = _shape_hw(image)
  target_height = tf.maximum(height, crop_height)
  target_width = tf.maximum(width, crop_width)
  image = pad_to_size(image, target_height, target_width, mean_pixel)
  if label is not None:
    label = pad_to_size(label, target_height, target_width, ignore_label)
  return image, label


def _scaled_size(height, width, scale):
  """The size `scale_image_and_label` gives (sides truncated)."""
  scaled = tf.cast(tf.cast(tf.stack([height, width]), tf.float32) * scale,
                   tf.int32)
  return scaled[0], scaled[1]


def _scale_pad_and_crop_window(image, label, scale, top, left, crop_height,
                               crop_width, mean_pixel, ignore_label, flip):
  """The same result, interpolating only the pixels inside the window.

  A flip reverses the window's source columns before interpolating and
  moves the padding to the left, so it costs no pass over the pixels.
  """
  height, width = _shape_hw(image)
  scaled_height, scaled_width = _scaled_size(height, width, scale)
  # Rows/columns of the window inside the scaled image; the rest is padding.
  rows_inside = tf.minimum(scaled_height - top, crop_height)
  cols_inside = tf.minimum(scaled_width - left, crop_width)
  rows = _source_coordinates(top, rows_inside, height, scaled_height)
  cols = _source_coordinates(left, cols_inside, width, scaled_width)
  if flip is not False:
    cols = tf.where(flip, tf.reverse(cols, [0]), cols)
  image = pad_to_size(_bilinear_window(image, rows, cols), crop_height,
                      crop_width, mean_pixel, pad_left=flip)
  label = pad_to_size(tf.cast(_nearest_window(label, rows, cols), tf.int32),
                      crop_height, crop_width, ignore_label, pad_left=flip)
  return image, label


def scale_pad_and_crop(image, label, scale, crop_height, crop_width,
                       mean_pixel, ignore_label, seed, flip=False):
  """`scale_image_and_label`, `pad_to_size`, `random_crop` and optionally
  the left-right flip in one step (see `scale_pad_and_crop_at`).

  Args:
    image: [H, W, 3] of any real type.
    label: integer [H, W, 1].
    scale: python float or float32 scalar tensor.
    crop_height / crop_width: the crop size.
    mean_pixel: RGB padding value of the image (numbers).
    ignore_label: padding value of the label.
    seed: int tensor [2] choosing the window (as `random_crop` does).
    flip: False, or a bool scalar tensor: flip the crop left-right.

  Returns:
    (image float32 [crop_height, crop_width, 3],
     label int32 [crop_height, crop_width, 1]).
  """
  height, width = _shape_hw(image)
  scaled_height, scaled_width = _scaled_size(height, width, scale)
  top, left = random_crop_offsets(
      tf.maximum(scaled_height, crop_height),
      tf.maximum(scaled_width, crop_width), crop_height, crop_width, seed)
  return scale_pad_and_crop_at(image, label, scale, top, left, crop_height,
                               crop_width, mean_pixel, ignore_label, flip)


def scale_pad_and_crop_at(image, label, scale, top, left, crop_height,
                          crop_width, mean_pixel, ignore_label, flip=False):
  """Scale, pad to the crop size, crop at (top, left), flip: one step.

  When the scaled image is larger than the crop, only the pixels inside the
  crop window are interpolated (with the resize kernels' own arithmetic, so
  the output is the same), the flip is folded into the columns sampled, and
  the cost no longer grows with the image size times the scale squared.
  Smaller images take the whole-image path, which is faster for them.

  Args:
    image, label, scale, crop_height, crop_width, mean_pixel, ignore_label,
      flip: as for `scale_pad_and_crop`.
    top, left: int32 scalars, the window's corner in the scaled image padded
      to at least the crop size.

  Returns:
    (image float32 [crop_height, crop_width, 3],
     label int32 [crop_height, crop_width, 1]).
  """
  args = (image, label, scale, top, left, crop_height, crop_width,
          mean_pixel, ignore_label, flip)
  height, width = _shape_hw(image)
  scaled_area = (tf.cast(height, tf.float32) * tf.cast(width, tf.float32) *
                 scale * scale)
  return tf.cond(scaled_area > crop_height * crop_width,
                 lambda: _scale_pad_and_crop_window(*args),
                 lambda: _scale_pad_and_crop_whole(*args))


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
  height, width = _shape_hw(image)
  fits = tf.logical_and(height <= crop_height, width <= crop_width)
  assertion = tf.Assert(fits, [message, name, height, width])
  with tf.control_dependencies([assertion]):
    return tf.identity(image)


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
    raise ConfigError('training needs a crop size (--train_crop_size)')

  original_image = image
  if options.min_resize_value or options.max_resize_value:
    image, label = resize_to_range(
        tf.cast(image, tf.float32),
        None if label is None else tf.cast(label, tf.int32),
        options.min_resize_value, options.max_resize_value,
        options.resize_factor)
    original_image = tf.saturate_cast(tf.round(image), tf.uint8)

  if is_training:
    if seed is None:
      seed = tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    scale = random_scale_factor(options.min_scale_factor,
                                options.max_scale_factor,
                                options.scale_factor_step_size, seeds[0])
    crop_height, crop_width = crop_size
    # Scale, pad, crop and flip fused: only the crop window is
    # interpolated.
    image, label = scale_pad_and_crop(
        image, label, scale, crop_height, crop_width, mean_pixel,
        ignore_label, seeds[1], flip=random_flip_decision(seeds[2]))
  else:
    image = tf.cast(image, tf.float32)
    if label is not None:
      label = tf.cast(label, tf.int32)

  if crop_size is not None and not is_training:
    crop_height, crop_width = crop_size
    image = _check_fits_crop(image, crop_height, crop_width, name)
    image, label = _pad_to_at_least(image, label, crop_height, crop_width,
                                    mean_pixel, ignore_label)

  if crop_size is not None:
    image.set_shape([crop_height, crop_width, 3])
    if label is not None:
      label.set_shape([crop_height, crop_width, 1])
  else:
    image.set_shape([None, None, 3])
    if label is not None:
      label.set_shape([None, None, 1])
  return tf.cast(original_image, tf.uint8), image, label
