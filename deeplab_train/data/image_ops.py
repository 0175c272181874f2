"""Resize, scale and pad of one image and label, as the original's steps.

The building blocks of `preprocess`: the original DeepLab's
`preprocess_utils` resizes with the same kernels and corner alignment
(images bilinear, labels nearest neighbour, `align_corners=True`) and pads
bottom/right, the image with the backbone's mean pixel and the label with
`ignore_label`. All functions work eagerly and in graphs.
"""
import tensorflow.compat.v1 as tf


def shape_hw(tensor):
  """(height, width) of [H, W, C] as int32 scalar tensors."""
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
  a multiple of `factor` plus one. A side is at least 1: a 3x1000 image
  at max_size 129 had a side of 0, which no resize takes (the original's
  rule too; with a factor its rounding made it 1).
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
  new_size = tf.maximum(new_size, 1)
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
  height, width = shape_hw(image)
  new_size = resize_to_range_size(height, width, min_size, max_size, factor)
  image = resize_bilinear(image, new_size)
  if label is not None:
    label = resize_nearest(label, new_size)
  return image, label


def scale_image_and_label(image, label, scale):
  """Scales both by `scale` (sizes truncated to integers)."""
  if isinstance(scale, float) and scale == 1.0:
    return image, label
  new_size = tf.stack(scaled_size(*shape_hw(image), scale))
  image = resize_bilinear(image, new_size)
  if label is not None:
    label = resize_nearest(label, new_size)
  return image, label


def scaled_size(height, width, scale):
  """The size `scale_image_and_label` gives: sides truncated, and at least
  1 (a 1-pixel side scaled below 1 was 0, which no resize takes)."""
  scaled = tf.maximum(tf.cast(tf.cast(tf.stack([height, width]), tf.float32)
                              * scale, tf.int32), 1)
  return scaled[0], scaled[1]


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
  height, width = shape_hw(tensor)
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


def pad_to_at_least(image, label, crop_height, crop_width, mean_pixel,
                    ignore_label):
  """Pads bottom/right to at least the crop size: image with the mean
  pixel, label (may be None) with the ignore label."""
  height, width = shape_hw(image)
  target_height = tf.maximum(height, crop_height)
  target_width = tf.maximum(width, crop_width)
  image = pad_to_size(image, target_height, target_width, mean_pixel)
  if label is not None:
    label = pad_to_size(label, target_height, target_width, ignore_label)
  return image, label
