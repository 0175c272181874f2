"""A trained BatchNorm after a widening 1x1 convolution, with the batch
moments of the output taken from the input's (layers.expanded_batch_norm,
inside layers.batch_norm_from_input_moments): the same outputs, gradients
and moving-average updates as the convolution and the BN op."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers

import model_testing


def _trained_params(activation=tf.nn.relu6):
  # A fast decay, so that the moving variance's update shows whether it
  # moves towards the unbiased batch variance (198 pixels: 0.5 % apart).
  return layers.ConvParams(
      batch_norm=layers.BatchNormParams(epsilon=1e-3, decay=0.5),
      bn_training=True, activation=activation)


def _build(x_value, num_outputs, from_input, activation=tf.nn.relu6):
  """(variable names, [output, d/dx, d/dvariables..., moving mean and
  variance after the update], op types, {name: value} of the trainable
  variables, the output gradient) of conv2d with trained BN."""
  def build(x):
    with layers.batch_norm_from_input_moments(from_input):
      return layers.conv2d(x, num_outputs, 1, _trained_params(activation),
                           'expand')
  names, values, graph, params, dy_value = model_testing.trained_bn_layer_run(
      build, x_value, np.random.RandomState(1))
  op_types = {op.type for op in graph.get_operations()}
  return names, values, op_types, params, dy_value


def _input(shape, mean=0.0, seed=0):
  rng = np.random.RandomState(seed)
  return (mean + rng.standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize('activation', [tf.nn.relu6, None],
                         ids=['relu6', 'linear'])
@pytest.mark.parametrize('mean', [0.0, 2.0], ids=['centred', 'offset'])
def test_moments_from_the_input_equal_the_batch_norm_op(activation, mean):
  x = _input((2, 9, 11, 6), mean)
  names, plain, plain_ops, _, _ = _build(x, 24, False, activation)
  names_new, new, new_ops, _, _ = _build(x, 24, True, activation)
  assert names_new == names
  assert any(n.endswith('BatchNorm/gamma') for n in names), names
  assert any('FusedBatchNorm' in t for t in plain_ops)
  assert not any('FusedBatchNorm' in t for t in new_ops), new_ops
  labels = (['output', 'd/dx'] + ['d/d' + n for n in names]
            + ['moving_mean', 'moving_variance'])
  assert len(plain) == len(new) == len(labels)
  for label, a, b in zip(labels, plain, new):
    assert a.shape == b.shape, label
    scale = max(float(np.max(np.abs(a))), 1e-3)
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * scale,
                               err_msg=label)


def _float64_batch_norm(x, params, dy, epsilon=1e-3):
  """Output and input gradient of the 1x1 convolution and trained BN
  (no activation), in float64."""
  p = {name.split('/')[-1]: v.astype(np.float64) for name, v in params.items()}
  w = p['weights'].reshape(p['weights'].shape[2:])
  pixels = x.reshape(-1, w.shape[0]).astype(np.float64)
  y = pixels @ w
  rstd = 1 / np.sqrt(y.var(0) + epsilon)
  xhat = (y - y.mean(0)) * rstd
  out = xhat * p['gamma'] + p['beta']
  dxhat = dy.reshape(out.shape).astype(np.float64) * p['gamma']
  dy_pre = rstd * (dxhat - dxhat.mean(0) - xhat * (dxhat * xhat).mean(0))
  return [out.reshape(dy.shape), (dy_pre @ w.T).reshape(x.shape)]


def test_as_close_to_float64_as_the_batch_norm_op_on_many_pixels():
  # The BN op sums over the 26244 pixels of each channel in float32; the
  # input's moments come from a matmul.
  x = _input((4, 81, 81, 8), 1.0)
  _, op, _, params, dy = _build(x, 48, False, None)
  _, moments, _, _, _ = _build(x, 48, True, None)
  want = _float64_batch_norm(x, params, dy)
  for label, w, a, b in zip(['output', 'd/dx'], want, op, moments):
    scale = float(np.max(np.abs(w)))
    err_op = float(np.max(np.abs(a - w))) / scale
    err_moments = float(np.max(np.abs(b - w))) / scale
    assert err_moments < 1e-5, (label, err_moments)
    assert err_moments <= 2 * err_op, (label, err_moments, err_op)


@pytest.mark.parametrize('channels,num_outputs,taken', [
    (16, 96, True),      # mobilenet_v2's expansions
    (160, 960, True),
    (64, 256, True),     # resnet's bottleneck
    (128, 256, False),   # the moments would cost more than the BN op
    (256, 1024, False),
    (24, 24, False),     # not widening
    (144, 24, False),
])
def test_taken_only_where_the_moments_pay(channels, num_outputs, taken):
  assert layers._input_moments_pay(channels, num_outputs) == taken
  with tf.Graph().as_default():
    x = tf.zeros([1, 3, 3, channels])
    with layers.batch_norm_from_input_moments():
      layers.conv2d(x, num_outputs, 1, _trained_params(), 'conv')
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
  assert ('FusedBatchNormV3' not in op_types) == taken


def test_frozen_batch_norm_and_other_kernels_keep_their_forms():
  with tf.Graph().as_default():
    x = tf.zeros([1, 5, 5, 8])
    frozen = _trained_params().replace(bn_training=False)
    with layers.batch_norm_from_input_moments():
      layers.conv2d(x, 32, 1, frozen, 'frozen')
      layers.conv2d(x, 32, 3, _trained_params(), 'three_by_three')
    ops = [op for op in tf.get_default_graph().get_operations()
           if op.type == 'FusedBatchNormV3']
  assert sorted(op.name.split('/')[0] for op in ops) == ['frozen',
                                                          'three_by_three']
