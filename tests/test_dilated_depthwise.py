"""A dilated depthwise convolution in one op (layers.dilated_depthwise_in_one_op)
or in bands (layers.dilated_depthwise_in_bands): the same output and
gradients as TensorFlow's space-to-batch form, only for the cases each
covers, and in the training towers only where they run (oneDNN's CPU
kernels; a CPU). The input gradient of a strided depthwise convolution
at stride 1 (layers.strided_depthwise_input_gradient_at_stride_1):
TensorFlow's, and in the towers of bf16 graphs on a oneDNN CPU only."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config
from deeplab_train.train import towers

import model_testing

ONEDNN_ON = session_config.onednn_kernels_on()
PLAIN = layers.ConvParams(batch_norm=None, activation=None)
NATIVE_BF16 = model_testing.NATIVE_BF16


def _dilated_ops(graph):
  """The depthwise ops of `graph` that compute a dilation themselves."""
  return [op for op in graph.get_operations()
          if op.type == 'DepthwiseConv2dNative'
          and list(op.get_attr('dilations')) != [1, 1, 1, 1]]


def _output_and_gradients(one_op, kernel, rate, multiplier=1,
                          shape=(2, 13, 11, 4)):
  """[y, dy/dx, dy/dweights] of a depthwise layer, and its dilated ops."""
  def build(x):
    with layers.dilated_depthwise_in_one_op(one_op):
      return layers.depthwise_conv2d(x, kernel, PLAIN, 'dw', rate=rate,
                                     depth_multiplier=multiplier,
                                     use_bias=False)
  values, graph = model_testing.layer_output_and_gradients(build, shape)
  return values, _dilated_ops(graph)


# (kernel, rate, depth multiplier, whether the one-op form applies).
CASES = {
    '3x3 rate 2': (3, 2, 1, True),
    '3x3 rate 4': (3, 4, 1, True),
    '5x5 rate 2': (5, 2, 1, True),
    '3x3 rate 1x2': (3, (1, 2), 1, True),
    '3x3 rate 6 (too large)': (3, 6, 1, False),
    '2x2 rate 2 (even kernel)': (2, 2, 1, False),
    '3x3 rate 2 multiplier 2': (3, 2, 2, False),
    '3x3 rate 1': (3, 1, 1, False),
}


@pytest.mark.skipif(not ONEDNN_ON, reason='the one-op form needs oneDNN '
                    'kernels, which TF_ENABLE_ONEDNN_OPTS=0 turns off')
@pytest.mark.parametrize('name', sorted(CASES))
def test_one_op_form_equals_space_to_batch(name):
  kernel, rate, multiplier, applies = CASES[name]
  plain, plain_ops = _output_and_gradients(False, kernel, rate, multiplier)
  one_op, one_op_ops = _output_and_gradients(True, kernel, rate, multiplier)
  assert not plain_ops
  # The dilated op computes the output and the input gradient.
  assert len(one_op_ops) == (2 if applies else 0), one_op_ops
  model_testing.assert_same_output_and_gradients(plain, one_op)


@pytest.mark.parametrize('onednn', [True, False])
def test_towers_choose_the_one_op_form_by_device(monkeypatch, onednn):
  monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: onednn)
  monkeypatch.setattr(session_config, 'gpus_visible', lambda: False)
  # Without a GPU, '/gpu:0' is soft-placed on the CPU.
  for device in ('/cpu:0', '/gpu:0', '/job:worker/task:1/device:CPU:0'):
    assert towers.runs_on_onednn_cpu(device) == onednn, device
  monkeypatch.setattr(session_config, 'gpus_visible', lambda: True)
  assert not towers.runs_on_onednn_cpu('/gpu:0')
  assert not towers.runs_on_onednn_cpu('/job:worker/task:0/gpu:1')
  assert towers.runs_on_onednn_cpu('/cpu:1') == onednn


def _dilation_rates(graph):
  return {tuple(op.get_attr('dilations'))[1] for op in _dilated_ops(graph)}


def test_training_towers_run_the_one_op_form_where_onednn_runs(monkeypatch):
  """mobilenet_v2 OS8 has depthwise rates 2 and 4: its fp32 training graph
  computes them in one op exactly when this process runs oneDNN's kernels,
  and a step runs; a graph for the bf16 rewrite keeps space-to-batch
  unless oneDNN runs on AMX tiles."""
  built = model_testing.mobilenet_v2_os8_training_graph('none')
  dilated = _dilated_ops(built.graph)
  assert _dilation_rates(built.graph) == ({2, 4} if ONEDNN_ON else set())
  assert all(op.name.startswith('tower_0/') for op in dilated)
  with built.graph.as_default(), tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    _, loss = sess.run([built.train_op, built.total_loss])
  assert np.isfinite(loss)
  for amx in (False, True):
    monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda amx=amx: {'amx': amx})
    graph = model_testing.mobilenet_v2_os8_training_graph('bf16').graph
    assert _dilation_rates(graph) == (
        {2, 4} if amx and cpu_lib.onednn_amx({'amx': True}) and ONEDNN_ON
        else set())


def _bf16_output_and_gradients(one_op, rate, shape=(2, 21, 21, 16)):
  """The values of _output_and_gradients under the bf16 rewrite, and the
  dilated ops."""
  def build(x):
    with layers.dilated_depthwise_in_one_op(one_op):
      return layers.depthwise_conv2d(x, 3, PLAIN, 'dw', rate=rate,
                                     use_bias=False)
  values, graph = model_testing.layer_output_and_gradients(
      build, shape, mixed_precision='bf16')
  return values, _dilated_ops(graph)


@NATIVE_BF16
@pytest.mark.parametrize('rate', [2, 4])
def test_one_op_form_under_the_bf16_rewrite_is_as_close_as_space_to_batch(
    rate):
  fp32, _ = _output_and_gradients(False, 3, rate, shape=(2, 21, 21, 16))
  plain, plain_ops = _bf16_output_and_gradients(False, rate)
  one_op, one_op_ops = _bf16_output_and_gradients(True, rate)
  assert (len(plain_ops), len(one_op_ops)) == (0, 2)
  _assert_as_close_in_bf16(fp32, plain, one_op)


def _assert_as_close_in_bf16(fp32, plain, form):
  """`plain` (space-to-batch) and `form` ([output, d/dx, d/dweights], each
  under the bf16 rewrite) both ran in bfloat16 (8 bits of mantissa: errors
  above 1e-4 of the largest float32 value) and `form` is as close to
  `fp32` as `plain`."""
  for label, reference, a, b in zip(['output', 'd/dx', 'd/dweights'], fp32,
                                    plain, form):
    scale = float(np.max(np.abs(reference)))
    plain_error = float(np.max(np.abs(a - reference))) / scale
    form_error = float(np.max(np.abs(b - reference))) / scale
    assert 1e-4 < plain_error < 2e-2, (label, plain_error)
    assert 1e-4 < form_error < 1.5 * plain_error, (label, form_error,
                                                    plain_error)


def _space_to_batch_ops(graph):
  return [op for op in graph.get_operations()
          if op.type in ('SpaceToBatchND', 'BatchToSpaceND')]


# (kernel, rate, input shape, whether the banded form applies: twice each
# rate above 1 at least the input's size in that dimension).
BAND_CASES = {
    '3x3 rate 7 on 13x11': (3, 7, (2, 13, 11, 4), True),
    '3x3 rate 12 on 21x21': (3, 12, (1, 21, 21, 3), True),
    '3x3 rate 18 on 21x21': (3, 18, (1, 21, 21, 3), True),
    '3x3 rate 30 on 21x21 (centre tap only)': (3, 30, (1, 21, 21, 3), True),
    '5x5 rate 7 on 13x11': (5, 7, (2, 13, 11, 4), True),
    '5x5 rate 6 on 13x11 (rate too small)': (5, 6, (2, 13, 11, 4), False),
    '3x3 rate 1x6 on 13x11': (3, (1, 6), (2, 13, 11, 4), True),
    '3x3 rate 6 on 21x21 (rate too small)': (3, 6, (1, 21, 21, 3), False),
    '3x3 rate 6x12 on 21x21 (height rate too small)': (
        3, (6, 12), (1, 21, 21, 3), False),
    '3x3 rate 1': (3, 1, (2, 13, 11, 4), False),
}


@pytest.mark.parametrize('name', sorted(BAND_CASES))
def test_banded_form_equals_space_to_batch(name):
  kernel, rate, shape, applies = BAND_CASES[name]

  def output_and_gradients(banded):
    def build(x):
      with layers.dilated_depthwise_in_bands(banded):
        return layers.depthwise_conv2d(x, kernel, PLAIN, 'dw', rate=rate,
                                       use_bias=False)
    return model_testing.layer_output_and_gradients(build, shape)

  plain, plain_graph = output_and_gradients(False)
  banded, banded_graph = output_and_gradients(True)
  dilated = max(np.atleast_1d(rate)) > 1
  assert bool(_space_to_batch_ops(plain_graph)) == dilated
  assert bool(_space_to_batch_ops(banded_graph)) == (dilated and not applies)
  model_testing.assert_same_output_and_gradients(plain, banded)


@pytest.mark.parametrize('device,forms,banded', [
    ('/cpu:0', True, True), ('/cpu:0', False, False),
    ('/gpu:0', True, False)])
def test_towers_build_the_banded_form_on_a_cpu(monkeypatch, device, forms,
                                               banded):
  """ASPP-like: rate 12 on a 13x13 input is banded in fp32 CPU towers only;
  a step's gradient is the space-to-batch form's."""
  monkeypatch.setattr(session_config, 'gpus_visible', lambda: True)
  rng = np.random.RandomState(0)
  x_value = rng.uniform(-1, 1, (2, 13, 13, 3)).astype(np.float32)

  def tower_fn(_):
    y = layers.depthwise_conv2d(tf.constant(x_value), 3, PLAIN, 'dw',
                                rate=12, use_bias=False)
    return tf.reduce_sum(tf.square(y)), {}, {}

  with tf.Graph().as_default() as graph:
    (tower,) = towers.build_towers(tower_fn, [device], onednn_forms=forms)
    assert bool(_space_to_batch_ops(graph)) != banded
    if device == '/cpu:0':
      grad = tf.gradients(tower.data_loss, tf.trainable_variables())[0]
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        got, weights = sess.run([grad, tf.trainable_variables()[0]])
      x = tf.constant(x_value)
      w = tf.constant(weights)
      y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], 'SAME',
                                 dilations=[12, 12])
      want = tf.gradients(tf.reduce_sum(tf.square(y)), w)[0]
      with tf.Session() as sess:
        np.testing.assert_allclose(got, sess.run(want), rtol=1e-5,
                                   atol=1e-5)


def test_bands_pay_where_each_band_is_at_most_max_band():
  # The default (float32 graphs) is twice the rate at least the size.
  for size in (13, 21, 33):
    for rate in range(2, 40):
      assert layers._bands_pay((1, size, size, 3), (rate, rate)) == (
          2 * rate >= size), (size, rate)
  quarter = layers.MAX_BF16_BAND
  # 21x21 (crop 321 at output stride 16): bands of 21 - rate rows.
  assert layers._bands_pay((1, 21, 21, 3), (18, 18), quarter)   # 3 rows
  assert layers._bands_pay((1, 21, 21, 3), (16, 16), quarter)   # 5
  assert not layers._bands_pay((1, 21, 21, 3), (15, 15), quarter)  # 6
  assert not layers._bands_pay((1, 21, 21, 3), (12, 12), quarter)  # 9
  assert layers._bands_pay((1, 21, 21, 3), (30, 30), quarter)   # centre only
  # 33x33 (crop 513): rate 18 leaves bands of 15 rows, banded in float32
  # graphs only.
  assert layers._bands_pay((1, 33, 33, 3), (18, 18), layers.MAX_BAND)
  assert not layers._bands_pay((1, 33, 33, 3), (18, 18), quarter)
  # Each dilated dimension must pay.
  assert not layers._bands_pay((1, 21, 33, 3), (18, 18), quarter)
  assert layers._bands_pay((1, 33, 21, 3), (1, 18), quarter)


def _aspp_like_tower_graph(monkeypatch, amx, onednn_forms, bf16_forms):
  """A CPU tower with depthwise layers at rates 18 and 12 on a 21x21
  input (ASPP's at crop 321), on a CPU with or without AMX."""
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: {'amx': amx})

  def tower_fn(_):
    x = tf.zeros([1, 21, 21, 3])
    loss = 0.
    for rate in (18, 12):
      y = layers.depthwise_conv2d(x, 3, PLAIN, 'dw%d' % rate, rate=rate,
                                  use_bias=False)
      loss += tf.reduce_sum(y)
    return loss, {}, {}

  with tf.Graph().as_default() as graph:
    towers.build_towers(tower_fn, ['/cpu:0'], onednn_forms=onednn_forms,
                        bf16_forms=bf16_forms)
  return graph


def _space_to_batch_layers(graph):
  return {op.name.split('/')[1] for op in _space_to_batch_ops(graph)}


@pytest.mark.parametrize('amx', [False, True])
def test_bf16_towers_band_only_rate_18_where_onednn_runs_on_amx(monkeypatch,
                                                               amx):
  """Graphs for the bf16 rewrite band ASPP's rate 18 at crop 321 (bands of
  3 of 21 rows), not rate 12 (9 of 21), and only where oneDNN runs on AMX
  tiles; float32 graphs band both, on any CPU."""
  bf16 = _aspp_like_tower_graph(monkeypatch, amx, onednn_forms=False,
                                bf16_forms=True)
  on_amx = amx and cpu_lib.onednn_amx({'amx': True}) and ONEDNN_ON
  assert _space_to_batch_layers(bf16) == (
      {'dw12'} if on_amx else {'dw12', 'dw18'})
  fp32 = _aspp_like_tower_graph(monkeypatch, amx, onednn_forms=True,
                                bf16_forms=False)
  assert not _space_to_batch_layers(fp32)
  # Neither kind of forms (fp16 graphs): space-to-batch.
  fp16 = _aspp_like_tower_graph(monkeypatch, amx, onednn_forms=False,
                                bf16_forms=False)
  assert _space_to_batch_layers(fp16) == {'dw12', 'dw18'}


def _bf16_banded_output_and_gradients(banded, rate, shape=(2, 21, 21, 16),
                                      bf16=True):
  """The values of a 3x3 depthwise layer (banded as in bf16 graphs, or by
  space-to-batch) whose input is x times a matrix, under the bf16 rewrite
  (or not), and the space-to-batch ops: the rewrite runs that matmul in
  bfloat16, and with it the banded form's elementwise ops after it."""
  mixing = np.random.RandomState(2).uniform(
      -0.5, 0.5, shape[-1:] * 2).astype(np.float32)

  def build(x):
    product = tf.reshape(tf.matmul(
        tf.reshape(x, [-1, shape[-1]]),
        tf.Variable(mixing, trainable=False)), shape)
    with layers.dilated_depthwise_in_bands(banded, layers.MAX_BF16_BAND):
      return layers.depthwise_conv2d(product, 3, PLAIN, 'dw', rate=rate,
                                     use_bias=False)
  values, graph = model_testing.layer_output_and_gradients(
      build, shape, mixed_precision='bf16' if bf16 else 'none')
  return values, _space_to_batch_ops(graph)


@NATIVE_BF16
def test_banded_form_under_the_bf16_rewrite_is_as_close_as_space_to_batch():
  fp32, _ = _bf16_banded_output_and_gradients(False, 18, bf16=False)
  plain, plain_ops = _bf16_banded_output_and_gradients(False, 18)
  banded, banded_ops = _bf16_banded_output_and_gradients(True, 18)
  assert plain_ops and not banded_ops
  # Measured: 1.9e-3 to 4.0e-3 of the largest value, each.
  _assert_as_close_in_bf16(fp32, plain, banded)


def _strided_input_gradient_ops(graph):
  """The depthwise input gradient ops of `graph` at a stride above 1."""
  return [op for op in graph.get_operations()
          if op.type == 'DepthwiseConv2dNativeBackpropInput'
          and list(op.get_attr('strides')) != [1, 1, 1, 1]]


# (kernel, stride, padding, input shape, depth multiplier, whether the
# stride-1 input gradient applies).
STRIDED_CASES = {
    '3x3 stride 2 SAME on 13x11': (3, 2, 'SAME', (2, 13, 11, 4), 1, True),
    '3x3 stride 2 SAME on 12x10': (3, 2, 'SAME', (2, 12, 10, 4), 1, True),
    '3x3 stride 2 VALID on 13x11': (3, 2, 'VALID', (2, 13, 11, 4), 1, True),
    '3x3 stride 2 VALID on 12x10': (3, 2, 'VALID', (2, 12, 10, 4), 1, True),
    '5x5 stride 2 SAME on 13x11': (5, 2, 'SAME', (1, 13, 11, 3), 1, True),
    '5x5 stride 3 VALID on 14x13': (5, 3, 'VALID', (1, 14, 13, 3), 1, True),
    '3x3 stride 3 SAME on 14x13': (3, 3, 'SAME', (1, 14, 13, 3), 1, True),
    '2x2 stride 2 SAME on 13x11': (2, 2, 'SAME', (1, 13, 11, 3), 1, True),
    '3x3 stride 2 multiplier 2': (3, 2, 'SAME', (2, 13, 11, 4), 2, False),
    '3x3 stride 1': (3, 1, 'SAME', (2, 13, 11, 4), 1, False),
}


@pytest.mark.parametrize('name', sorted(STRIDED_CASES))
def test_strided_input_gradient_at_stride_1_equals_tensorflows(name):
  kernel, stride, padding, shape, multiplier, applies = STRIDED_CASES[name]

  def output_and_gradients(at_stride_1):
    def build(x):
      with layers.strided_depthwise_input_gradient_at_stride_1(at_stride_1):
        return layers.depthwise_conv2d(x, kernel, PLAIN, 'dw', stride=stride,
                                       padding=padding,
                                       depth_multiplier=multiplier,
                                       use_bias=False)
    return model_testing.layer_output_and_gradients(build, shape)

  plain, plain_graph = output_and_gradients(False)
  spread, spread_graph = output_and_gradients(True)
  assert bool(_strided_input_gradient_ops(plain_graph)) == (stride > 1)
  assert bool(_strided_input_gradient_ops(spread_graph)) == (
      stride > 1 and not applies)
  model_testing.assert_same_output_and_gradients(plain, spread)


@pytest.mark.parametrize('mixed_precision', ['none', 'bf16'])
def test_bf16_training_towers_take_strided_input_gradients_at_stride_1(
    monkeypatch, mixed_precision):
  """mobilenet_v2's stride-2 depthwise convolutions: their input gradients
  run at stride 1 in a graph for the bf16 rewrite on a oneDNN CPU only."""
  for onednn in (True, False):
    monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: onednn)
    graph = model_testing.mobilenet_v2_os8_training_graph(
        mixed_precision).graph
    strided = _strided_input_gradient_ops(graph)
    if mixed_precision == 'bf16' and onednn:
      assert not strided
    else:
      # expanded_conv_1 and _3.
      assert len(strided) == 2, [op.name for op in strided]
