"""Training's scale, pad, random crop and flip fused into one step.

The result equals scaling the whole image, padding it to the crop size,
cropping and flipping (`image_ops` and `random_crop`), but when the scaled
image is larger than the crop only the pixels of the crop window are
interpolated, with the resize kernels' own arithmetic, and the flip only
reorders the columns sampled. The cost then no longer grows with the image
size times the scale squared.
"""
import tensorflow.compat.v1 as tf

from deeplab_train.data import image_ops


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

  Both must be at least the crop size (pad first). Training crops through
  `scale_pad_and_crop`; this unfused step is what it is compared with.
  """
  height, width = image_ops.shape_hw(image)
  top, left = random_crop_offsets(height, width, crop_height, crop_width,
                                  seed)
  return _crop_at(image, label, top, left, crop_height, crop_width)


def _crop_at(image, label, top, left, crop_height, crop_width):
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
  height, width = image_ops.shape_hw(image)
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
  height, width = image_ops.shape_hw(label)
  def nearest(coords, size):
    whole = tf.floor(coords)
    index = whole + tf.cast(coords - whole >= 0.5, tf.float32)
    return tf.minimum(tf.cast(index, tf.int32), size - 1)
  return tf.gather(tf.gather(label, nearest(rows, height)),
                   nearest(cols, width), axis=1)


def _flip_if(flip, image, label):
  if flip is False:
    return image, label
  return tf.cond(flip,
                 lambda: (tf.reverse(image, [1]), tf.reverse(label, [1])),
                 lambda: (image, label))


def _scale_pad_and_crop_whole(image, label, scale, top, left, crop_height,
                              crop_width, mean_pixel, ignore_label, flip):
  """Scales the whole image, pads it to the crop size, crops, flips."""
  image, label = image_ops.scale_image_and_label(
      tf.cast(image, tf.float32), tf.cast(label, tf.int32), scale)
  image, label = image_ops.pad_to_at_least(image, label, crop_height,
                                           crop_width, mean_pixel,
                                           ignore_label)
  image, label = _crop_at(image, label, top, left, crop_height, crop_width)
  return _flip_if(flip, image, label)


def _scale_pad_and_crop_window(image, label, scale, top, left, crop_height,
                               crop_width, mean_pixel, ignore_label, flip):
  """The same result, interpolating only the pixels inside the window.

  A flip reverses the window's source columns before interpolating and
  moves the padding to the left, so it costs no pass over the pixels.
  """
  height, width = image_ops.shape_hw(image)
  scaled_height, scaled_width = image_ops.scaled_size(height, width, scale)
  # Rows/columns of the window inside the scaled image; the rest is padding.
  rows_inside = tf.minimum(scaled_height - top, crop_height)
  cols_inside = tf.minimum(scaled_width - left, crop_width)
  rows = _source_coordinates(top, rows_inside, height, scaled_height)
  cols = _source_coordinates(left, cols_inside, width, scaled_width)
  if flip is not False:
    cols = tf.where(flip, tf.reverse(cols, [0]), cols)
  image = image_ops.pad_to_size(_bilinear_window(image, rows, cols),
                                crop_height, crop_width, mean_pixel,
                                pad_left=flip)
  label = image_ops.pad_to_size(
      tf.cast(_nearest_window(label, rows, cols), tf.int32), crop_height,
      crop_width, ignore_label, pad_left=flip)
  return image, label


def scale_pad_and_crop(image, label, scale, crop_height, crop_width,
                       mean_pixel, ignore_label, seed, flip=False):
  """`image_ops.scale_image_and_label`, `image_ops.pad_to_size`,
  `random_crop` and optionally the left-right flip in one step (see
  `scale_pad_and_crop_at`).

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
  height, width = image_ops.shape_hw(image)
  scaled_height, scaled_width = image_ops.scaled_size(height, width, scale)
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
  height, width = image_ops.shape_hw(image)
  scaled_area = (tf.cast(height, tf.float32) * tf.cast(width, tf.float32) *
                 scale * scale)
  return tf.cond(scaled_area > crop_height * crop_width,
                 lambda: _scale_pad_and_crop_window(*args),
                 lambda: _scale_pad_and_crop_whole(*args))
