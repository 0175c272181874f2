"""ASPP's concat_projection with the image pooling branch multiplied by its
rows of the weights once per image (layers.broadcast_input_projected_once,
entered by the training towers): the same variables, output, gradients and
moving-average updates as the projection of the concatenation, and the
concatenation kept where the pooled feature is not one value per image."""
import contextlib

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ModelOptions
from deeplab_train.model import head
from deeplab_train.model import layers

FEATURES = (2, 9, 9, 16)


def _options(**changes):
  base = dict(num_classes=3, model_variant='mobilenet_v2', crop_size=(65, 65),
              output_stride=8, aspp_convs_filters=8)
  base.update(changes)
  return ModelOptions(**base)


def _build(options, bn_training, once, fold=False):
  """({variable: shape}, [output, d/dfeatures, d/dvariables..., BN
  moving averages after the update], op types) of ASPP on fixed random
  features, with a fixed random output gradient."""
  rng = np.random.RandomState(0)
  features_value = rng.uniform(-2, 2, FEATURES).astype(np.float32)
  with tf.Graph().as_default() as graph:
    features = tf.constant(features_value)
    params = head.head_params(options, 4e-5, bn_training)
    folding = (layers.folding_frozen_batch_norm() if fold
               else contextlib.nullcontext())
    with layers.recording() as rec, folding, \
        layers.broadcast_input_projected_once(once):
      y = head.aspp(features, options, params)
    variables = sorted(tf.global_variables(), key=lambda v: v.op.name)
    trainable = [v for v in variables if v in tf.trainable_variables()]
    moving = [v for v in variables if 'moving' in v.op.name]
    dy = tf.constant(rng.uniform(-1, 1, y.shape.as_list()).astype(np.float32))
    grads = tf.gradients(y, [features] + trainable, dy)
    assert all(g is not None for g in grads)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      # The same values in both graphs (their initialisers' seeds differ),
      # BN's statistics and scales far from their initial values.
      values_rng = np.random.RandomState(1)
      for v in variables:
        shape = v.shape.as_list()
        v.load(values_rng.uniform(0.5, 2.0, shape) if 'BatchNorm' in v.op.name
               else values_rng.uniform(-0.5, 0.5, shape), sess)
      values = sess.run([y] + grads)
      sess.run(list(rec.update_ops))
      values += sess.run(moving)
  shapes = {v.op.name: v.shape.as_list() for v in variables}
  return shapes, values, {op.type for op in graph.get_operations()}


def _assert_close(expected, got):
  assert len(expected) == len(got)
  for i, (a, b) in enumerate(zip(expected, got)):
    assert a.shape == b.shape, i
    scale = max(float(np.max(np.abs(a))), 1e-3)
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * scale,
                               err_msg='value %d' % i)


@pytest.mark.parametrize('bn', ['trained', 'frozen', 'folded'])
@pytest.mark.parametrize('rates', [(), (1, 2)], ids=['aspp0', 'atrous'])
def test_projected_once_equals_the_projection_of_the_concatenation(bn, rates):
  options = _options(atrous_rates=rates or None)
  bn_training, fold = bn == 'trained', bn == 'folded'
  shapes, plain, plain_ops = _build(options, bn_training, False, fold)
  shapes_once, once, once_ops = _build(options, bn_training, True, fold)
  assert shapes_once == shapes
  assert shapes['concat_projection/weights'] == [
      1, 1, 8 * (2 + len(rates)), 8]
  # The pooled value is no longer resized to the features' size.
  assert 'ResizeBilinear' in plain_ops
  assert 'ResizeBilinear' not in once_ops
  assert ('FusedBatchNormV3' in once_ops) == (not fold)
  _assert_close(plain, once)


def test_pooling_smaller_than_the_features_keeps_the_concatenation():
  """A pooled map of 5x5 is not one value per image: resized and
  concatenated as the original does, in either context."""
  options = _options(image_pooling_crop_size=(33, 33))  # 5x5 pool of 9x9
  _, plain, _ = _build(options, True, False)
  _, once, once_ops = _build(options, True, True)
  assert 'ResizeBilinear' in once_ops
  _assert_close(plain, once)
  for a, b in zip(plain, once):
    np.testing.assert_array_equal(a, b)


def test_squeeze_and_excitation_gate_is_unchanged():
  options = _options(model_variant='mobilenet_v3_small_seg',
                     aspp_with_squeeze_and_excitation=True,
                     aspp_with_concat_projection=False,
                     image_se_uses_qsigmoid=True)
  _, plain, _ = _build(options, True, False)
  _, once, once_ops = _build(options, True, True)
  assert 'ResizeBilinear' in once_ops
  for a, b in zip(plain, once):
    np.testing.assert_array_equal(a, b)


def test_a_widening_projection_is_refused():
  with tf.Graph().as_default():
    per_image = tf.zeros([2, 1, 1, 4])
    x = tf.zeros([2, 3, 3, 4])
    with pytest.raises(ValueError, match='widens 8 channels to 16'):
      layers.pointwise_conv2d_of_broadcast_and(
          per_image, x, 16, layers.ConvParams(), 'p')
