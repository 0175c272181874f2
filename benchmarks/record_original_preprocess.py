"""Records the original DeepLab's training preprocessing as reference facts.

Run with the original's environment (see record_original_step.py):

    source DIR/env.sh
    python benchmarks/record_original_preprocess.py \
        --out tests/reference/preprocess.npz

Deterministic parts, on fixed images smaller and larger than the crop: the
original's own preprocess_utils functions resize to a range, scale by a
given factor, pad with the mean pixel / ignore label, crop at a given offset
and flip, in the order of its input_preprocess. Random parts: how often its
scale, crop-offset and flip draws take each value over many draws.
"""
import argparse
import os

import numpy as np

CROP = 33
MEAN = 127.5
IGNORE = 255
# (height, width, (min_resize_value, max_resize_value, resize_factor) or None)
IMAGES = ((23, 30, None), (90, 120, None), (61, 150, (40, 80, 8)))
SCALES = (0.5, 1.25)
FLIPS = (False, True)
DRAWS = 4000
SCALE_RANGE = (0.5, 2.0)
STEP = 0.25
OFFSET_IMAGE = (40, 50)  # a padded image of this size, cropped to CROP


def fixed_image(height, width, seed):
  rng = np.random.default_rng(seed)
  image = rng.integers(0, 256, (height, width, 3)).astype(np.uint8)
  label = rng.integers(0, 21, (height, width, 1)).astype(np.uint8)
  return image, label


def offsets(height, width):
  """Three crop offsets of a padded height x width image: corners, middle."""
  tops, lefts = max(height, CROP) - CROP, max(width, CROP) - CROP
  return ((0, 0), (tops, lefts), (tops // 2, lefts // 3))


def deterministic(tf, utils):
  """{key: array} of the pipeline's outputs for every fixed setting."""
  out = {}
  for index, (height, width, resize) in enumerate(IMAGES):
    image, label = fixed_image(height, width, index)
    out['image_%d' % index], out['label_%d' % index] = image, label
    for scale in SCALES:
      with tf.Graph().as_default(), tf.Session() as sess:
        img = tf.cast(tf.constant(image), tf.float32)
        lab = tf.cast(tf.constant(label), tf.int32)
        if resize:
          img, lab = utils.resize_to_range(
              img, lab, min_size=resize[0], max_size=resize[1],
              factor=resize[2], align_corners=True)
        img, lab = utils.randomly_scale_image_and_label(
            img, lab, tf.constant(scale, tf.float32))
        shape = tf.shape(img)
        target_h = tf.maximum(shape[0], CROP)
        target_w = tf.maximum(shape[1], CROP)
        mean = tf.reshape(tf.constant([MEAN] * 3, tf.float32), [1, 1, 3])
        img = utils.pad_to_bounding_box(img, 0, 0, target_h, target_w, mean)
        lab = utils.pad_to_bounding_box(lab, 0, 0, target_h, target_w, IGNORE)
        padded_h, padded_w = sess.run([target_h, target_w])
        for k, (top, left) in enumerate(offsets(padded_h, padded_w)):
          for flip in FLIPS:
            # pylint: disable=protected-access
            crop_img = utils._crop(img, top, left, CROP, CROP)
            crop_lab = utils._crop(lab, top, left, CROP, CROP)
            # pylint: enable=protected-access
            if flip:  # flip_dim with probability 1: always flipped
              crop_img, crop_lab, _ = utils.flip_dim([crop_img, crop_lab],
                                                     1.0, dim=1)
            got_img, got_lab = sess.run([crop_img, crop_lab])
            key = '%d_%g_%d_%d' % (index, scale, k, int(flip))
            out['out_image_' + key] = got_img.astype(np.float32)
            out['out_label_' + key] = got_lab.astype(np.uint8)
            out['offset_' + key] = np.array([top, left])
  return out


def distributions(tf, utils):
  """Counts of each value taken by the random draws over DRAWS draws."""
  with tf.Graph().as_default(), tf.Session() as sess:
    stepped = utils.get_random_scale(SCALE_RANGE[0], SCALE_RANGE[1], STEP)
    uniform = utils.get_random_scale(SCALE_RANGE[0], SCALE_RANGE[1], 0)
    box = tf.zeros(OFFSET_IMAGE + (1,))
    marker = tf.reshape(tf.range(OFFSET_IMAGE[0] * OFFSET_IMAGE[1]),
                        OFFSET_IMAGE + (1,))
    crop = utils.random_crop([box, marker], CROP, CROP)[1][0, 0, 0]
    flipped = utils.flip_dim([tf.zeros([1, 2, 1])], 0.5, dim=1)[1]
    draws = [sess.run([stepped, uniform, crop, flipped])
             for _ in range(DRAWS)]
  steps = np.array([np.asarray(d[0]).ravel()[0] for d in draws])
  uniform = np.array([np.asarray(d[1]).ravel()[0] for d in draws])
  corner = np.array([d[2] for d in draws])
  values = np.linspace(SCALE_RANGE[0], SCALE_RANGE[1],
                       int((SCALE_RANGE[1] - SCALE_RANGE[0]) / STEP + 1))
  return {
      'scale_step_values': values,
      'scale_step_counts': np.array([np.sum(np.isclose(steps, v))
                                     for v in values]),
      'scale_uniform_counts': np.histogram(uniform, 10, SCALE_RANGE)[0],
      'offset_top_counts': np.bincount(corner // OFFSET_IMAGE[1],
                                       minlength=OFFSET_IMAGE[0] - CROP + 1),
      'offset_left_counts': np.bincount(corner % OFFSET_IMAGE[1],
                                        minlength=OFFSET_IMAGE[1] - CROP + 1),
      'flip_count': np.array(sum(bool(d[3]) for d in draws)),
      'draws': np.array(DRAWS)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  args = parser.parse_args()
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from deeplab.core import preprocess_utils  # pylint: disable=g-import-not-at-top
  facts = deterministic(tf, preprocess_utils)
  facts.update(distributions(tf, preprocess_utils))
  np.savez_compressed(args.out, **facts)
  print('wrote', args.out, len(facts), 'arrays')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  main()
