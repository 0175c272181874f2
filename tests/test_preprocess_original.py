"""Training preprocessing equals the original's (tests/reference/preprocess.npz,
recorded by benchmarks/record_original_preprocess.py from the original's own
preprocess_utils).

Deterministic parts on fixed images smaller and larger than the crop: the
resize to a range, the scale by a given factor, the padding with the mean
pixel and the ignore label, the crop at a given offset and the flip give
the same pixels. Random parts: the scale factors, crop offsets and flips
drawn over many draws follow the same distribution.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.data import preprocess

CROP = 33
MEAN = (127.5, 127.5, 127.5)
IGNORE = 255
# The recorder's settings: (height, width, resize range or None) per image.
IMAGES = ((23, 30, None), (90, 120, None), (61, 150, (40, 80, 8)))
SCALES = (0.5, 1.25)
DRAWS = 4000
# The original pads `x - mean` with zeros and adds the mean back, which
# rounds interpolated pixels by up to one float32 ulp at 255.
PIXEL_ATOL = 1e-4


@pytest.fixture(scope='module')
def facts(reference_dir):
  return dict(np.load(reference_dir / 'preprocess.npz'))


def _ours(image, label, resize, scale, top, left, flip):
  image = tf.cast(tf.constant(image), tf.float32)
  label = tf.cast(tf.constant(label), tf.int32)
  if resize:
    image, label = preprocess.resize_to_range(image, label, *resize)
  out_image, out_label = preprocess.scale_pad_and_crop_at(
      image, label, tf.constant(scale, tf.float32), top, left, CROP, CROP,
      MEAN, IGNORE, flip=tf.constant(flip))
  return out_image.numpy(), out_label.numpy()


@pytest.mark.parametrize('index', range(len(IMAGES)))
def test_scale_pad_crop_flip_equal_the_original(facts, index):
  _, _, resize = IMAGES[index]
  image, label = facts['image_%d' % index], facts['label_%d' % index]
  checked = 0
  for scale in SCALES:
    for k in range(3):
      for flip in (False, True):
        key = '%d_%g_%d_%d' % (index, scale, k, int(flip))
        top, left = (int(v) for v in facts['offset_' + key])
        got_image, got_label = _ours(image, label, resize, scale, top, left,
                                     flip)
        np.testing.assert_allclose(got_image, facts['out_image_' + key],
                                   atol=PIXEL_ATOL, rtol=0, err_msg=key)
        np.testing.assert_array_equal(got_label,
                                      facts['out_label_' + key].astype(int),
                                      err_msg=key)
        checked += 1
  assert checked == len(SCALES) * 3 * 2


def _draws(fn):
  return np.array([fn(tf.constant([i, 7], tf.int32)) for i in range(DRAWS)])


def _same_distribution(ours, theirs):
  """Counts per value agree within 5 standard errors of the difference."""
  ours, theirs = np.asarray(ours, float), np.asarray(theirs, float)
  assert ours.shape == theirs.shape
  n1, n2 = ours.sum(), theirs.sum()
  p1, p2 = ours / n1, theirs / n2
  pooled = (ours + theirs) / (n1 + n2)
  stderr = np.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
  assert np.all(np.abs(p1 - p2) <= 5 * stderr + 1e-12), (p1, p2)


def test_scale_factor_steps_follow_the_original(facts):
  values = facts['scale_step_values']
  draws = _draws(lambda seed: float(preprocess.random_scale_factor(
      0.5, 2.0, 0.25, seed)))
  counts = [np.sum(np.isclose(draws, v)) for v in values]
  assert sum(counts) == DRAWS  # only the original's values
  _same_distribution(counts, facts['scale_step_counts'])


def test_uniform_scale_factors_follow_the_original(facts):
  draws = _draws(lambda seed: float(preprocess.random_scale_factor(
      0.5, 2.0, 0, seed)))
  assert draws.min() >= 0.5 and draws.max() < 2.0
  _same_distribution(np.histogram(draws, 10, (0.5, 2.0))[0],
                     facts['scale_uniform_counts'])


def test_crop_offsets_follow_the_original(facts):
  draws = _draws(lambda seed: [int(v) for v in preprocess.random_crop_offsets(
      40, 50, CROP, CROP, seed)])
  _same_distribution(np.bincount(draws[:, 0], minlength=40 - CROP + 1),
                     facts['offset_top_counts'])
  _same_distribution(np.bincount(draws[:, 1], minlength=50 - CROP + 1),
                     facts['offset_left_counts'])


def test_flip_rate_follows_the_original(facts):
  flips = _draws(lambda seed: bool(preprocess.random_flip_decision(seed)))
  theirs = int(facts['flip_count'])
  _same_distribution([flips.sum(), DRAWS - flips.sum()],
                     [theirs, int(facts['draws']) - theirs])

