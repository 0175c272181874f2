"""The training loss against numpy: ignore pixels, label weights, upsampled
logits or downsampled labels, top-k pixel mining and its schedule; the
per-image form of CPU towers; and the gradient multipliers."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.train import graph as graph_lib
from deeplab_train.train import losses
from deeplab_train.train import scopes

IGNORE = 255


def _run(build):
  with tf.Graph().as_default():
    fetch = build()
    with tf.Session() as sess:
      return sess.run(fetch)


def _pixel_losses(logits, labels, num_classes):
  """Per-pixel softmax cross-entropy, 0 where the label is ignored."""
  z = logits.reshape(-1, num_classes).astype(np.float64)
  z = z - z.max(axis=1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
  flat = labels.reshape(-1)
  out = np.zeros(flat.shape)
  ok = flat != IGNORE
  out[ok] = -logp[np.nonzero(ok)[0], flat[ok]]
  return out, ok


def _bilinear_align_corners(x, out_h, out_w):
  """numpy resize of [B,h,w,C] with align_corners=True."""
  b, h, w, c = x.shape
  ys = np.arange(out_h) * ((h - 1) / (out_h - 1))
  xs = np.arange(out_w) * ((w - 1) / (out_w - 1))
  y0 = np.floor(ys).astype(int)
  x0 = np.floor(xs).astype(int)
  y1 = np.minimum(y0 + 1, h - 1)
  x1 = np.minimum(x0 + 1, w - 1)
  wy = (ys - y0)[None, :, None, None]
  wx = (xs - x0)[None, None, :, None]
  top = x[:, y0][:, :, x0] * (1 - wx) + x[:, y0][:, :, x1] * wx
  bottom = x[:, y1][:, :, x0] * (1 - wx) + x[:, y1][:, :, x1] * wx
  return top * (1 - wy) + bottom * wy


def _data(num_classes=4, size=9, logits_size=9, seed=0):
  rng = np.random.RandomState(seed)
  logits = rng.normal(0, 2, (2, logits_size, logits_size, num_classes))
  labels = rng.randint(0, num_classes, (2, size, size, 1))
  labels[0, :3, :4] = IGNORE
  return logits.astype(np.float32), labels.astype(np.int32)


def test_mean_over_non_ignored_pixels():
  logits, labels = _data()
  got = _run(lambda: losses.pixel_loss(tf.constant(logits), tf.constant(labels),
                                       4, IGNORE))
  per_pixel, ok = _pixel_losses(logits, labels, 4)
  np.testing.assert_allclose(got, per_pixel.sum() / ok.sum(), rtol=1e-5)


def test_upsampled_logits_match_numpy_bilinear():
  logits, labels = _data(logits_size=3)
  got = _run(lambda: losses.pixel_loss(tf.constant(logits), tf.constant(labels),
                                       4, IGNORE, upsample_logits=True))
  big = _bilinear_align_corners(logits.astype(np.float64), 9, 9)
  per_pixel, ok = _pixel_losses(big, labels, 4)
  np.testing.assert_allclose(got, per_pixel.sum() / ok.sum(), rtol=1e-5)


def test_labels_downsampled_with_nearest_neighbour():
  logits, labels = _data(logits_size=5)
  got = _run(lambda: losses.pixel_loss(tf.constant(logits), tf.constant(labels),
                                       4, IGNORE, upsample_logits=False))
  # align_corners nearest from 9 to 5 samples rows/cols 0, 2, 4, 6, 8.
  small = labels[:, ::2, ::2]
  per_pixel, ok = _pixel_losses(logits, small, 4)
  np.testing.assert_allclose(got, per_pixel.sum() / ok.sum(), rtol=1e-5)


def test_label_weights_scale_each_class_but_not_the_count():
  logits, labels = _data()
  weights = [0.5, 2.0, 1.0, 3.0]
  got = _run(lambda: losses.pixel_loss(tf.constant(logits), tf.constant(labels),
                                       4, IGNORE, label_weights=weights))
  per_pixel, ok = _pixel_losses(logits, labels, 4)
  flat = labels.reshape(-1)
  w = np.where(ok, np.asarray(weights)[np.minimum(flat, 3)], 0.0)
  np.testing.assert_allclose(got, (per_pixel * w).sum() / ok.sum(), rtol=1e-5)


def test_label_weights_of_wrong_length_are_refused():
  with pytest.raises(ValueError, match='3 values for 4 classes'):
    _run(lambda: losses.label_weight_mask(tf.constant([1, 2]), IGNORE, 4,
                                          [1.0, 1.0, 1.0]))


@pytest.mark.parametrize('step,mining_step,expected_share', [
    (0, 0, 0.25),        # mining from the start
    (50, 100, 0.625),    # half-way: 0.5 * 0.25 + 0.5
    (0, 100, 1.0),       # not started
    (300, 100, 0.25),    # after the schedule
])
def test_top_k_pixels_against_numpy(step, mining_step, expected_share):
  logits, labels = _data()

  def build():
    return losses.pixel_loss(
        tf.constant(logits), tf.constant(labels), 4, IGNORE,
        top_k_percent_pixels=0.25, hard_example_mining_step=mining_step,
        global_step=tf.constant(step, tf.int64))
  got = _run(build)
  per_pixel, _ = _pixel_losses(logits, labels, 4)
  k = int(np.float32(expected_share) * np.float32(per_pixel.size))
  top = np.sort(per_pixel)[::-1][:k]
  np.testing.assert_allclose(got, top.sum() / np.count_nonzero(top),
                             rtol=1e-5)


def test_scales_loss_sums_every_scale():
  logits, labels = _data()
  scales = {'merged_logits': logits, 'logits_1.00': logits * 0.5}

  def build():
    total, per_scale = losses.scales_loss(
        {k: tf.constant(v) for k, v in scales.items()}, tf.constant(labels),
        4, IGNORE)
    return total, per_scale
  total, per_scale = _run(build)
  expected = {}
  for name, value in scales.items():
    per_pixel, ok = _pixel_losses(value, labels, 4)
    expected[name] = per_pixel.sum() / ok.sum()
  assert sorted(per_scale) == sorted(expected)
  for name in expected:
    np.testing.assert_allclose(per_scale[name], expected[name], rtol=1e-5)
  np.testing.assert_allclose(total, sum(expected.values()), rtol=1e-5)


def test_all_ignored_gives_zero_loss():
  logits, labels = _data()
  labels[:] = IGNORE
  got = _run(lambda: losses.pixel_loss(tf.constant(logits), tf.constant(labels),
                                       4, IGNORE))
  assert got == 0.0


def test_gradient_multipliers_follow_the_original():
  with tf.Graph().as_default():
    names = ['MobilenetV2/Conv/weights', 'aspp0/weights', 'aspp1_depthwise/'
             'depthwise_weights', 'logits/semantic/weights',
             'logits/semantic/biases', 'decoder/feature_projection0/weights',
             'MobilenetV2/Conv/BatchNorm/gamma', 'other/biases']
    variables = [tf.get_variable(n, [1]) for n in names]
    mult = {v.op.name: m for v, m in scopes.gradient_multipliers(
        variables, ['logits', 'aspp'], 10.0).items()}
  assert mult == {'aspp0/weights': 10.0, 'aspp1_depthwise/depthwise_weights':
                  10.0, 'logits/semantic/weights': 10.0,
                  'logits/semantic/biases': 20.0, 'other/biases': 2.0}


@pytest.mark.parametrize('kwargs', [
    dict(upsample_logits=True),
    dict(upsample_logits=False, label_weights=[0.5, 2.0, 1.0, 3.0]),
    dict(upsample_logits=True, top_k_percent_pixels=0.4),
])
def test_per_image_ops_give_the_one_op_loss_and_gradient(kwargs):
  rng = np.random.RandomState(3)
  logits = rng.normal(0, 2, (3, 5, 5, 4)).astype(np.float32)
  labels = rng.randint(0, 4, (3, 9, 9, 1)).astype(np.int32)
  labels[1, :3, :4] = IGNORE

  def run(split):
    with tf.Graph().as_default() as graph:
      x = tf.constant(logits)
      with losses.per_image(split):
        loss = losses.pixel_loss(x, tf.constant(labels), 4, IGNORE, **kwargs)
      xents = [op for op in graph.get_operations()
               if op.type == 'SparseSoftmaxCrossEntropyWithLogits']
      with tf.Session() as sess:
        return sess.run((loss, tf.gradients(loss, x)[0])) + (len(xents),)

  one_loss, one_grad, one_ops = run(False)
  split_loss, split_grad, split_ops = run(True)
  assert (one_ops, split_ops) == (1, 3)
  np.testing.assert_allclose(split_loss, one_loss, rtol=1e-6)
  np.testing.assert_allclose(split_grad, one_grad, rtol=1e-6, atol=1e-9)
  assert np.abs(one_grad).max() > 0


def test_cpu_training_towers_score_each_image_in_ops_of_its_own():
  """A training graph on a CPU: one softmax loss op per image of the
  tower's batch, and a step runs."""
  model = config.ModelOptions(
      num_classes=3, model_variant='mobilenet_v2', crop_size=(33, 33),
      output_stride=16, depth_multiplier=0.25).validate()
  train = config.TrainOptions(
      train_batch_size=2, training_number_of_steps=10,
      clone_on_cpu=True).validate()

  def input_fn():
    return {'image': tf.zeros([2, 33, 33, 3]),
            'label': tf.ones([2, 33, 33, 1], tf.int32)}
  built = graph_lib.build_training_graph(model, train, ignore_label=IGNORE,
                                         input_fn=input_fn)
  xents = [op.name for op in built.graph.get_operations()
           if op.type == 'SparseSoftmaxCrossEntropyWithLogits']
  assert len(xents) == 2, xents
  with built.graph.as_default(), tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    _, loss = sess.run([built.train_op, built.total_loss])
  assert np.isfinite(loss)
