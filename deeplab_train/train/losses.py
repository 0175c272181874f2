"""Per-pixel softmax cross-entropy of the original DeepLab trainer.

For each scale's logits: logits are upsampled to the label size (or labels
downsampled with nearest neighbour when `upsample_logits` is off), pixels
with `ignore_label` get weight 0, others 1 or their class's entry of
`label_weights`; the loss is the weighted sum divided by the number of
non-ignored pixels of the tower's batch. With `top_k_percent_pixels < 1`
only the largest per-pixel losses count (hard pixel mining), their share
shrinking linearly from 100 % to `top_k_percent_pixels` over the first
`hard_example_mining_step` steps.

Because each tower normalises by its own pixel count, the average of the
tower losses equals the loss of the whole batch exactly when every tower has
the same number of non-ignored pixels (e.g. no ignore pixels).
"""
import contextlib
import threading

import tensorflow.compat.v1 as tf

_state = threading.local()


@contextlib.contextmanager
def per_image(enabled=True):
  """Context in which `pixel_loss` resizes and scores each image of the
  batch in ops of its own.

  TensorFlow's CPU kernels for the bilinear resize of the logits, its
  gradient and the sparse softmax cross-entropy run on one thread, at the
  end of the forward pass and the start of the backward pass where no
  other op is ready: per image, the inter-op threads run them side by side.
  Each pixel's loss and gradient are computed as in the one-op form. Used
  by the training towers placed on a CPU; with an unknown or single-image
  batch the loss keeps one op.
  """
  before = getattr(_state, 'per_image', False)
  _state.per_image = enabled
  try:
    yield
  finally:
    _state.per_image = before


def label_weight_mask(labels, ignore_label, num_classes, label_weights=None):
  """Per-pixel weights: 0 for ignored pixels, else 1 or the class weight.

  Args:
    labels: int tensor of any shape.
    ignore_label: the label value that carries no loss.
    num_classes: number of classes.
    label_weights: None, a float, or a sequence of `num_classes` floats.

  Returns:
    float32 tensor shaped like `labels`.

  Raises:
    ValueError: `label_weights` has the wrong length.
  """
  keep = tf.cast(tf.not_equal(labels, ignore_label), tf.float32)
  if label_weights is None:
    return keep
  if isinstance(label_weights, (int, float)):
    return keep * float(label_weights)
  label_weights = [float(w) for w in label_weights]
  if len(label_weights) != num_classes:
    raise ValueError('label_weights has %d values for %d classes'
                     % (len(label_weights), num_classes))
  # Ignored pixels may hold a value outside [0, num_classes): clamp before
  # the lookup; `keep` zeroes them anyway.
  safe = tf.clip_by_value(labels, 0, num_classes - 1)
  return keep * tf.gather(tf.constant(label_weights, tf.float32), safe)


def _safe_mean(total, count):
  """total / count, and 0 when nothing counts (the original's rule)."""
  return tf.cast(count > 0, tf.float32) * tf.math.divide(
      total, tf.maximum(1e-5, count))


def top_k_pixel_count(num_pixels, top_k_percent_pixels,
                      hard_example_mining_step=0, global_step=None):
  """How many pixels the hard-example loss keeps at this step.

  Args:
    num_pixels: float32 scalar tensor.
    top_k_percent_pixels: final share of pixels kept.
    hard_example_mining_step: steps over which the share shrinks from 1 to
      `top_k_percent_pixels` (0: from the start).
    global_step: the step tensor (needed when hard_example_mining_step > 0).

  Returns:
    int32 scalar tensor.
  """
  if hard_example_mining_step == 0:
    share = tf.constant(top_k_percent_pixels, tf.float32)
  else:
    if global_step is None:
      raise ValueError('hard_example_mining_step needs the global step')
    ratio = tf.minimum(
        1.0, tf.cast(global_step, tf.float32) / hard_example_mining_step)
    share = ratio * top_k_percent_pixels + (1.0 - ratio)
  return tf.cast(share * num_pixels, tf.int32)


def pixel_loss(logits, labels, num_classes, ignore_label, label_weights=None,
               upsample_logits=True, top_k_percent_pixels=1.0,
               hard_example_mining_step=0, global_step=None, name=None):
  """The softmax cross-entropy loss of one scale's logits.

  Args:
    logits: float [B, h, w, num_classes].
    labels: int [B, H, W, 1].
    num_classes: number of classes.
    ignore_label: label value with no loss.
    label_weights: None, a float or one float per class.
    upsample_logits: resize the logits to the labels (bilinear,
      align_corners) rather than the labels to the logits (nearest).
    top_k_percent_pixels: share of the hardest pixels kept (1: all).
    hard_example_mining_step: see `top_k_pixel_count`.
    global_step: step tensor for the hard-example schedule.
    name: name scope.

  Returns:
    float32 scalar loss.
  """
  with tf.name_scope(name, 'pixel_loss', [logits, labels]):
    logits = tf.cast(logits, tf.float32)
    images = tf.compat.dimension_value(logits.shape[0])
    if not (getattr(_state, 'per_image', False) and images and images > 1):
      images = 1

    def split(tensor):
      return tf.split(tensor, images) if images > 1 else [tensor]

    def join(parts):
      return parts[0] if images == 1 else tf.concat(parts, 0)

    flat_logits, flat_labels = [], []
    for part_logits, part_labels in zip(split(logits), split(labels)):
      if upsample_logits:
        part_logits = tf.image.resize_bilinear(
            part_logits, tf.shape(part_labels)[1:3], align_corners=True)
      else:
        part_labels = tf.image.resize_nearest_neighbor(
            part_labels, tf.shape(part_logits)[1:3], align_corners=True)
      flat_logits.append(tf.reshape(part_logits, [-1, num_classes]))
      flat_labels.append(tf.reshape(part_labels, [-1]))
    labels = join(flat_labels)
    weights = label_weight_mask(labels, ignore_label, num_classes,
                                label_weights)
    # The sparse loss equals the original's one-hot softmax cross-entropy
    # (the same per-pixel values and gradients) without building the
    # [pixels, classes] one-hot targets. Pixels outside [0, num_classes)
    # (the ignore label) read class 0 and get weight 0: the one-hot loss of
    # such a pixel is 0 too.
    in_range = tf.logical_and(labels >= 0, labels < num_classes)
    classes = tf.where(in_range, labels, tf.zeros_like(labels))
    weights *= tf.cast(in_range, tf.float32)
    # split(classes) cuts equal parts: every image has as many pixels.
    losses = join([
        tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=part_classes, logits=part_logits,
            name='pixel_losses' if images == 1 else 'pixel_losses_%d' % k)
        for k, (part_classes, part_logits) in enumerate(
            zip(split(classes), flat_logits))])
    losses *= weights
    if top_k_percent_pixels == 1.0:
      count = tf.reduce_sum(tf.cast(tf.not_equal(labels, ignore_label),
                                    tf.float32))
      return _safe_mean(tf.reduce_sum(losses), count)
    k = top_k_pixel_count(tf.cast(tf.shape(losses)[0], tf.float32),
                          top_k_percent_pixels, hard_example_mining_step,
                          global_step)
    hardest, _ = tf.nn.top_k(losses, k=k, sorted=True, name='top_k_pixels')
    # The original counts the kept pixels whose loss is not exactly 0.
    count = tf.reduce_sum(tf.cast(tf.not_equal(hardest, 0.0), tf.float32))
    return _safe_mean(tf.reduce_sum(hardest), count)


def scales_loss(scales_to_logits, labels, num_classes, ignore_label,
                **loss_kwargs):
  """Sum of `pixel_loss` over every scale's logits (merged and per scale).

  Args:
    scales_to_logits: {'merged_logits': T, 'logits_1.00': T, ...}.
    labels: int [B, H, W, 1].
    num_classes, ignore_label: as for `pixel_loss`.
    **loss_kwargs: the other `pixel_loss` arguments.

  Returns:
    (total float32 scalar, {scale name: loss}).
  """
  per_scale = {}
  for scale in sorted(scales_to_logits):
    per_scale[scale] = pixel_loss(scales_to_logits[scale], labels,
                                  num_classes, ignore_label,
                                  name='loss_' + scale.replace('.', '_'),
                                  **loss_kwargs)
  total = tf.add_n(list(per_scale.values()), name='data_loss')
  return total, per_scale
