"""A trained BatchNorm after a widening 1x1 convolution, with the batch
moments of the output taken from the input's (layers.expanded_batch_norm,
inside layers.batch_norm_from_input_moments): the same outputs, gradients
and moving-average updates as the convolution and the BN op; in graphs
for the bf16 rewrite centred, its offset and activation compiled by XLA
(layers.offset_and_activation_in_xla), and as close to float32 as the BN
op in bfloat16."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config

import model_testing


def _trained_params(activation=tf.nn.relu6):
  # A fast decay, so that the moving variance's update shows whether it
  # moves towards the unbiased batch variance (198 pixels: 0.5 % apart).
  return layers.ConvParams(
      batch_norm=layers.BatchNormParams(epsilon=1e-3, decay=0.5),
      bn_training=True, activation=activation)


def _build(x_value, num_outputs, from_input, activation=tf.nn.relu6,
           centred_in_xla=False, mixed_precision='none'):
  """(variable names, [output, d/dx, d/dvariables..., moving mean and
  variance after the update], op types, {name: value} of the trainable
  variables, the output gradient) of conv2d with trained BN; with
  centred_in_xla, the form of graphs for the bf16 rewrite (the moments'
  product centred, activations compiled by XLA)."""
  def build(x):
    with layers.batch_norm_from_input_moments(from_input,
                                              centred=centred_in_xla), \
        layers.activations_in_xla(centred_in_xla):
      return layers.conv2d(x, num_outputs, 1, _trained_params(activation),
                           'expand')
  names, values, graph, params, dy_value = model_testing.trained_bn_layer_run(
      build, x_value, np.random.RandomState(1),
      mixed_precision=mixed_precision)
  op_types = {op.type for op in graph.get_operations()}
  return names, values, op_types, params, dy_value


def _input(shape, mean=0.0, seed=0):
  rng = np.random.RandomState(seed)
  return (mean + rng.standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize('centred_in_xla', [False, True],
                         ids=['float32 form', 'bf16 graphs\' form'])
@pytest.mark.parametrize('activation', [tf.nn.relu6, tf.nn.relu, None],
                         ids=['relu6', 'relu', 'linear'])
@pytest.mark.parametrize('mean', [0.0, 2.0], ids=['centred', 'offset'])
def test_moments_from_the_input_equal_the_batch_norm_op(activation, mean,
                                                        centred_in_xla):
  x = _input((2, 9, 11, 6), mean)
  names, plain, plain_ops, _, _ = _build(x, 24, False, activation)
  names_new, new, new_ops, _, _ = _build(x, 24, True, activation,
                                         centred_in_xla)
  # In bf16 graphs' form the offset is added with the activation (XLA),
  # not by a BiasAdd, and its gradient is no BiasAddGrad.
  in_xla = centred_in_xla and activation is not None
  assert ('BiasAdd' in new_ops) != in_xla, sorted(new_ops)
  assert ('BiasAddGrad' in new_ops) != in_xla, sorted(new_ops)
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


@pytest.mark.parametrize('activation', [tf.nn.relu6, tf.nn.relu],
                         ids=['relu6', 'relu'])
def test_offset_and_activation_in_xla_equal_the_ops(activation):
  """Values and gradients of activation(y + offset), one cluster for the
  add and the activation, one for its gradient, the offset's gradient a
  product with a row of ones."""
  rng = np.random.RandomState(3)
  y_value = rng.uniform(-8, 8, (2, 5, 7, 6)).astype(np.float32)
  offset_value = rng.uniform(-1, 1, 6).astype(np.float32)
  dz_value = rng.uniform(-1, 1, y_value.shape).astype(np.float32)
  with tf.Graph().as_default() as graph:
    y, offset = tf.constant(y_value), tf.constant(offset_value)
    dz = tf.constant(dz_value)
    z = layers.offset_and_activation_in_xla(y, offset, activation)
    grads = tf.gradients(z, [y, offset], dz)
    reference = activation(y + offset)
    reference_grads = tf.gradients(reference, [y, offset], dz)
    compiled = [op for op in graph.get_operations()
                if op.node_def.attr['_XlaCompile'].b]
    with tf.Session() as sess:
      got, expected = sess.run([[z] + grads, [reference] + reference_grads])
  compiled_types = {op.type for op in compiled}
  name = {tf.nn.relu6: 'Relu6', tf.nn.relu: 'Relu'}[activation]
  assert {'AddV2', name, name + 'Grad'} <= compiled_types, compiled_types
  assert 'MatMul' in {op.type for op in graph.get_operations()
                      if 'gradients/' in op.name and op not in compiled}
  for label, a, b in zip(['output', 'd/dy', 'd/doffset'], expected, got):
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-5, err_msg=label)


@model_testing.NATIVE_BF16
def test_bf16_form_as_close_to_float32_as_the_batch_norm_op():
  """Under the real bf16 rewrite the moments' product is rounded to
  bfloat16: centred, an input whose mean is 8 times its spread keeps its
  variance. Each value's largest difference from float32's BN op, against
  the BN op's under the rewrite (measured: at most 2.6x it, the moving
  variance's 4.9e-3 of its largest value against 1.9e-3; without the
  centring the output was 0.35 off and the moving variance 0.67)."""
  x = _input((4, 21, 21, 16), 8.0)
  names, reference, _, _, _ = _build(x, 96, False)
  _, op_bf16, _, _, _ = _build(x, 96, False, mixed_precision='bf16')
  _, form_bf16, form_ops, _, _ = _build(x, 96, True, centred_in_xla=True,
                                        mixed_precision='bf16')
  assert not any('FusedBatchNorm' in t for t in form_ops), form_ops
  labels = (['output', 'd/dx'] + ['d/d' + n for n in names]
            + ['moving_mean', 'moving_variance'])
  for label, r, a, b in zip(labels, reference, op_bf16, form_bf16):
    scale = float(np.max(np.abs(r)))
    op_error = float(np.max(np.abs(a - r))) / scale
    form_error = float(np.max(np.abs(b - r))) / scale
    # The rewrite ran: bfloat16 (8 bits of mantissa) is off float32.
    assert op_error > 1e-4, label
    assert form_error <= 3 * op_error + 5e-3, (label, form_error, op_error)


@pytest.mark.parametrize('features, mixed_precision, taken', [
    ({'avx512f': True, 'avx512_bf16': True, 'amx': True}, 'bf16', True),
    ({'avx512f': True, 'avx512_bf16': True}, 'bf16', False),
    ({'avx512f': True, 'avx512_bf16': True, 'amx': True}, 'none', True),
], ids=['bf16 on AMX', 'bf16 without AMX', 'float32'])
def test_towers_take_the_moments_in_bf16_graphs_on_amx(
    monkeypatch, features, mixed_precision, taken):
  """mobilenet_v2's expansions (1x1, widening, trained BN): float32
  graphs take the moments from the input on a oneDNN CPU, graphs for the
  bf16 rewrite where oneDNN runs on AMX tiles (centred, the offset with
  the activation in XLA)."""
  if not session_config.onednn_kernels_on():
    pytest.skip("oneDNN's kernels are off")
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: features)
  graph = model_testing.mobilenet_v2_os8_training_graph(mixed_precision).graph
  expansions_bn = [op.name for op in graph.get_operations()
                   if op.type == 'FusedBatchNormV3' and '/expand/' in op.name]
  centred = [op.name for op in graph.get_operations()
             if op.name.startswith('tower_0/') and '/expand/' in op.name
             and op.name.endswith('/BatchNorm/centred')]
  assert (not expansions_bn) == taken, expansions_bn
  assert bool(centred) == (taken and mixed_precision == 'bf16'), centred


@pytest.mark.parametrize('from_input', [False, True],
                         ids=['matmul form', 'moments from the input'])
def test_output_shape_is_a_constant_where_the_input_size_is_known(from_input):
  """A 1x1 convolution's output takes its shape from a constant where the
  input's size is known when the graph is built (a training crop), and
  from the input where it is not (inference on any image size)."""
  def build(shape):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, shape)
      with layers.batch_norm_from_input_moments(from_input):
        y = layers.conv2d(x, 8, 1, _trained_params(), 'expand')
    return graph, x, y

  graph, _, y = build([2, 5, 5, 4])
  assert y.shape.as_list() == [2, 5, 5, 8]
  reshapes = [op for op in graph.get_operations() if op.type == 'Reshape']
  assert reshapes
  assert {op.inputs[1].op.type for op in reshapes} == {'Const'}

  graph, x, y = build([None, None, None, 4])
  assert 'Shape' in {op.type for op in graph.get_operations()}
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    for shape in ([1, 3, 7, 4], [2, 6, 2, 4]):
      out = sess.run(y, {x: _input(shape)})
      assert out.shape == tuple(shape[:3]) + (8,)
