"""Preprocessing: the original's resize rule, random scale steps, and image /
label alignment under scale, pad, crop and flip, eagerly and in tf.data."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import PreprocessOptions
from deeplab_train.data import image_ops
from deeplab_train.data import preprocess
import test_data_common as common

IGNORE = 255
MEAN = (123.15, 115.90, 103.06)
# Vertices of a tetrahedron: no blend of some of them comes near another.
COLOURS = np.array([[250, 10, 10], [10, 250, 10], [10, 10, 250],
                    [250, 250, 250]], dtype=np.float32)
AUGMENT = PreprocessOptions(crop_size=(33, 41), min_scale_factor=0.5,
                            max_scale_factor=2.0, scale_factor_step_size=0.25)


def encoded_pair(seed=0, height=37, width=53):
  """An image whose pixel colours encode their label."""
  ids = common.blocky_label(np.random.RandomState(seed), height, width, 4,
                            block=6)
  return COLOURS[ids].astype(np.uint8), ids[..., None]


def assert_aligned(image, label):
  """Every pixel showing a pure class colour carries that class label; the
  padding is the mean pixel in the image and ignore in the label."""
  lab = label[..., 0]
  valid = lab != IGNORE
  np.testing.assert_allclose(image[~valid], np.broadcast_to(
      MEAN, image[~valid].shape), atol=1e-3)
  dist = ((image[:, :, None, :] - COLOURS[None, None]) ** 2).sum(-1)
  nearest, exact = dist.argmin(-1), dist.min(-1) < 1.0
  checked = valid & exact
  assert checked.sum() > 0.3 * valid.sum()
  np.testing.assert_array_equal(nearest[checked], lab[checked])


def test_resize_to_range_size_follows_the_original_rule():
  # (h, w, min, max, factor) -> size, worked out by hand from the rule:
  # short side -> min unless long side > max (then long side -> max, with
  # max first lowered to k*factor+1), then sides rounded up to k*factor+1.
  cases = [((100, 200, 50, 80, None), (40, 80)),
           ((100, 200, 50, 80, 8), (41, 73)),
           ((100, 200, 50, None, None), (50, 100)),
           ((100, 200, 60, 300, 16), (65, 129)),
           ((100, 200, None, 80, None), (40, 80)),
           ((333, 500, 513, 513, None), (341, 513)),
           # A side of 0 (3 * 129 / 1000) is 1, as the factor's rounding
           # made it: no resize takes 0.
           ((3, 1000, 65, 129, None), (1, 129)),
           ((3, 1000, 65, 129, 16), (1, 129))]

  def build():
    return [image_ops.resize_to_range_size(*args) for args, _ in cases]
  for got, (_, want) in zip(common.run_in_graph(build), cases):
    assert tuple(got) == want


def test_resize_to_range_resizes_image_and_label_together():
  image, label = encoded_pair()
  options = PreprocessOptions(crop_size=None, min_resize_value=50,
                              max_resize_value=80)

  def build():
    return preprocess.preprocess_image_and_label(
        image, label, options, IGNORE, is_training=False, mean_pixel=MEAN)
  original, out_image, out_label = common.run_in_graph(build)
  # 37x53: short side 37 -> 50, long side floor(53 * 50 / 37) = 71 <= 80.
  assert out_image.shape == (50, 71, 3) and out_label.shape == (50, 71, 1)
  assert original.dtype == np.uint8 and original.shape == (50, 71, 3)
  assert_aligned(out_image, out_label)


def test_random_scale_takes_the_discrete_steps():
  def build():
    seeds = [tf.constant([3, i]) for i in range(60)]
    return [preprocess.random_scale_factor(0.5, 2.0, 0.25, s) for s in seeds]
  values = set(np.round(common.run_in_graph(build), 6))
  assert values <= {0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0}
  assert len(values) >= 5


def test_random_scale_uniform_and_fixed():
  def build():
    return [preprocess.random_scale_factor(0.5, 2.0, 0, tf.constant([1, i]))
            for i in range(40)]
  values = np.array(common.run_in_graph(build))
  assert values.min() >= 0.5 and values.max() < 2.0
  assert len(set(values.tolist())) == 40
  assert preprocess.random_scale_factor(1.0, 1.0, 0.25, None) == 1.0
  with pytest.raises(ConfigError, match=r'^min_scale_factor must be in '
                                        r'\[0, max_scale_factor\]'):
    preprocess.random_scale_factor(2.0, 1.0, 0, None)


def test_augmentation_keeps_image_and_label_aligned_eagerly():
  image, label = encoded_pair()
  with common.eager_mode():
    for i in range(16):
      _, out_image, out_label = preprocess.preprocess_image_and_label(
          image, label, AUGMENT, IGNORE, is_training=True, mean_pixel=MEAN,
          seed=tf.constant([5, i]))
      assert out_image.shape == (33, 41, 3)
      assert out_label.shape == (33, 41, 1)
      assert_aligned(out_image.numpy(), out_label.numpy())


def test_augmentation_keeps_image_and_label_aligned_in_tf_data():
  image, label = encoded_pair(seed=1, height=29, width=45)

  def make():
    pairs = tf.data.Dataset.from_tensors((image, label)).repeat(16)
    seeds = tf.data.Dataset.range(16).map(
        lambda i: tf.stack([tf.constant(9, tf.int64), i]))

    def augment(pair, seed):
      _, out_image, out_label = preprocess.preprocess_image_and_label(
          pair[0], pair[1], AUGMENT, IGNORE, is_training=True,
          mean_pixel=MEAN, seed=seed)
      return out_image, out_label
    return tf.data.Dataset.zip((pairs, seeds)).map(
        augment, num_parallel_calls=2)
  outputs = common.take_batches(make)
  assert len(outputs) == 16
  for out_image, out_label in outputs:
    assert_aligned(out_image, out_label)
  # The augmentation actually varies: scales/crops differ between seeds.
  assert len({o[1].tobytes() for o in outputs}) > 8


def test_flip_happens_about_half_the_time_and_moves_both():
  image, label = encoded_pair(height=33, width=41)
  options = PreprocessOptions(crop_size=(33, 41))  # no scale, no crop room
  flips = 0
  with common.eager_mode():
    for i in range(40):
      _, out_image, out_label = preprocess.preprocess_image_and_label(
          image, label, options, IGNORE, is_training=True, mean_pixel=MEAN,
          seed=tf.constant([11, i]))
      flipped = np.array_equal(out_label.numpy(), label[:, ::-1])
      assert flipped or np.array_equal(out_label.numpy(), label)
      np.testing.assert_array_equal(
          out_image.numpy(), (image[:, ::-1] if flipped else image))
      flips += flipped
  assert 8 <= flips <= 32


def test_same_seed_same_output_and_seeds_differ():
  image, label = encoded_pair()
  with common.eager_mode():
    run = lambda s: preprocess.preprocess_image_and_label(
        image, label, AUGMENT, IGNORE, True, MEAN,
        seed=tf.constant(s))[2].numpy()
    np.testing.assert_array_equal(run([1, 2]), run([1, 2]))
    assert any(not np.array_equal(run([1, 2]), run([1, k]))
               for k in range(3, 8))


def test_eval_pads_with_mean_pixel_and_ignore_without_randomness():
  image, label = encoded_pair(height=20, width=30)

  def build():
    return preprocess.preprocess_image_and_label(
        image, label, PreprocessOptions(crop_size=(33, 41)), IGNORE,
        is_training=False, mean_pixel=MEAN)
  original, out_image, out_label = common.run_in_graph(build)
  np.testing.assert_array_equal(original, image)
  np.testing.assert_array_equal(out_image[:20, :30], image)
  np.testing.assert_allclose(out_image[20:], np.broadcast_to(MEAN, (13, 41, 3)),
                             atol=1e-4)
  np.testing.assert_allclose(out_image[:, 30:],
                             np.broadcast_to(MEAN, (33, 11, 3)), atol=1e-4)
  np.testing.assert_array_equal(out_label[:20, :30], label)
  assert (out_label[20:] == IGNORE).all() and (out_label[:, 30:] == IGNORE).all()


def test_eval_without_crop_keeps_the_image_size():
  image, label = encoded_pair(height=20, width=30)
  with common.eager_mode():
    _, out_image, out_label = preprocess.preprocess_image_and_label(
        image, label, PreprocessOptions(crop_size=None), IGNORE,
        is_training=False)
    np.testing.assert_array_equal(out_image.numpy(), image)
    np.testing.assert_array_equal(out_label.numpy(), label)


def test_eval_image_larger_than_crop_is_a_clear_error():
  image, label = encoded_pair(height=40, width=30)
  options = PreprocessOptions(crop_size=(33, 33))
  # Known shape: refused while building the graph.
  with pytest.raises(ConfigError, match='larger than the eval crop size'):
    preprocess.preprocess_image_and_label(image, label, options, IGNORE,
                                          is_training=False, name='big_one')

  # Unknown shape (as in the pipeline): refused when run, naming the image.
  def build():
    image_in = tf.placeholder(tf.uint8, [None, None, 3])
    label_in = tf.placeholder(tf.uint8, [None, None, 1])
    out = preprocess.preprocess_image_and_label(
        image_in, label_in, options, IGNORE, is_training=False,
        name=tf.constant('big_one'))[1]
    with tf.Session() as sess:
      return sess.run(out, {image_in: image, label_in: label})
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'larger than the eval crop size 33x33[\s\S]*big_one'):
    with tf.Graph().as_default():
      build()


def test_training_needs_label_and_crop():
  image, label = encoded_pair()
  with pytest.raises(ConfigError, match='labels'):
    preprocess.preprocess_image_and_label(image, None, AUGMENT, IGNORE, True)
  with pytest.raises(ConfigError, match='crop size'):
    preprocess.preprocess_image_and_label(
        image, label, PreprocessOptions(crop_size=None), IGNORE, True)


def test_a_one_pixel_side_scaled_down_keeps_one_pixel():
  """A 1-pixel-wide image scaled below 1 had a side of 0: training stopped
  with 'output dimensions must be positive' at the first such draw."""
  image = tf.constant(np.full((5, 1, 3), 200, np.uint8))
  label = tf.constant(np.full((5, 1, 1), 3, np.int32))
  scaled_image, scaled_label = image_ops.scale_image_and_label(
      image, label, tf.constant(0.5))
  assert scaled_image.shape.as_list() == [2, 1, 3]
  assert scaled_label.numpy()[:, 0, 0].tolist() == [3, 3]
  crop_image, crop_label = preprocess.scale_pad_and_crop(
      image, label, tf.constant(0.5), 4, 4, (127, 127, 127), 255,
      tf.constant([1, 2]))
  assert crop_image.shape.as_list() == [4, 4, 3]
  # The one scaled column holds the image and its label; the rest is
  # padding.
  assert sorted(np.unique(crop_label.numpy()).tolist()) == [3, 255]
  assert np.isclose(crop_image.numpy()[crop_label.numpy()[..., 0] == 3],
                    200).all()
