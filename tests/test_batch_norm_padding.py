"""A trained BatchNorm with its channels padded to a multiple of
layers.BATCH_NORM_CHANNEL_BLOCK (layers.batch_norm_channels_padded): the
same outputs, gradients and moving-average updates as the BN op on the
real channels, only for the channel counts off the block, and in the
towers where oneDNN's kernels use AVX-512 (in bf16 graphs, with native
bfloat16)."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config
from deeplab_train.train import towers

import model_testing

ONEDNN_ON = session_config.onednn_kernels_on()
NATIVE_BF16 = model_testing.NATIVE_BF16


def _trained_params():
  # A fast decay, so that the moving averages' updates show the batch
  # moments.
  return layers.ConvParams(
      batch_norm=layers.BatchNormParams(epsilon=1e-3, decay=0.5),
      bn_training=True, activation=tf.nn.relu6)


def _bn_input_channels(graph):
  """The channel count of each FusedBatchNormV3's input in `graph`."""
  return sorted(int(op.inputs[0].shape[-1]) for op in graph.get_operations()
                if op.type == 'FusedBatchNormV3')


def _build(padded, channels, shape=(2, 9, 7, 5), mixed_precision='none'):
  """([output, d/dx, d/dvariables..., moving mean and variance after the
  update], the BN ops' input channel counts) of a 1x1 conv2d with trained
  BN and ReLU6 (model_testing.trained_bn_layer_run)."""
  rng = np.random.RandomState(0)
  x_value = rng.uniform(-2, 2, shape).astype(np.float32)

  def build(x):
    with layers.batch_norm_channels_padded(padded):
      return layers.conv2d(x, channels, 1, _trained_params(), 'project')
  _, values, graph, _, _ = model_testing.trained_bn_layer_run(
      build, x_value, rng, mixed_precision)
  return values, _bn_input_channels(graph)


@pytest.mark.parametrize('channels', [24, 5])
def test_padded_batch_norm_equals_the_batch_norm_op(channels):
  plain, plain_bn = _build(False, channels)
  padded, padded_bn = _build(True, channels)
  assert plain_bn == [channels]
  assert padded_bn == [-(-channels // 16) * 16]
  assert len(plain) == len(padded) == 7  # y, dx, dbeta, dgamma, dw, mean, var
  for a, b in zip(plain, padded):
    assert a.shape == b.shape
    # Per channel the same sums; oneDNN's kernels for the two widths may
    # add in another order.
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('channels, padded_to', [
    (24, 32), (5, 16), (200, 208), (728, 736), (16, 16), (32, 32),
    (256, 256)])
def test_padded_only_off_the_block(channels, padded_to):
  with tf.Graph().as_default() as graph:
    x = tf.zeros([1, 3, 3, 4])
    with layers.batch_norm_channels_padded():
      layers.conv2d(x, channels, 1, _trained_params(), 'project')
    frozen = layers.ConvParams(batch_norm=layers.BatchNormParams())
    with layers.batch_norm_channels_padded():
      layers.conv2d(x, channels, 1, frozen, 'frozen')
    # Outside the context nothing is padded.
    layers.conv2d(x, channels, 1, _trained_params(), 'outside')
  assert _bn_input_channels(graph) == sorted(
      [padded_to, channels, channels])


@NATIVE_BF16
def test_padded_form_under_the_bf16_rewrite_equals_the_op():
  """Under the real rewrite the padded BN runs oneDNN's blocked bfloat16
  kernel, the plain one its generic kernel: the same values to within
  bfloat16's rounding (measured: equal but for 4.5e-4 of d/dx's largest
  value), both computed in bfloat16."""
  fp32, _ = _build(False, 24, shape=(2, 21, 21, 8))
  plain, _ = _build(False, 24, shape=(2, 21, 21, 8), mixed_precision='bf16')
  padded, _ = _build(True, 24, shape=(2, 21, 21, 8), mixed_precision='bf16')
  labels = ['output', 'd/dx', 'd/dbeta', 'd/dgamma', 'd/dweights',
            'moving mean', 'moving variance']
  for label, reference, a, b in zip(labels, fp32, plain, padded):
    scale = float(np.max(np.abs(a)))
    # The rewrite ran: bfloat16 (8 bits of mantissa) is off float32.
    assert float(np.max(np.abs(a - reference))) / scale > 1e-4, label
    difference = float(np.max(np.abs(b - a))) / scale
    assert difference < 4e-3, (label, difference)


def test_onednn_native_bf16_reads_the_cpu_and_the_environment():
  assert cpu_lib.onednn_native_bf16({'avx512_bf16': True}, {})
  assert cpu_lib.onednn_native_bf16({'amx': True}, {})
  assert not cpu_lib.onednn_native_bf16({'avx512f': True}, {})
  assert not cpu_lib.onednn_native_bf16({'amx': True},
                                        {'TF_ENABLE_ONEDNN_OPTS': '0'})
  assert not cpu_lib.onednn_native_bf16(
      {'amx': True}, {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE'})
  assert cpu_lib.onednn_native_bf16(
      {'avx512_bf16': True}, {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE_BF16'})


def _padded_bn_layers(graph):
  return {op.name for op in graph.get_operations()
          if op.type == 'FusedBatchNormV3' and '/padded_channels/' in
          op.inputs[0].name}


@pytest.mark.parametrize('mixed_precision', ['none', 'bf16'])
@pytest.mark.parametrize('features', [
    {'avx512f': True, 'amx': True, 'avx512_bf16': True},
    {'avx512f': True}, {'avx2': True}],
                         ids=['native bf16', 'avx512', 'avx2'])
def test_towers_pad_where_onednn_uses_avx512(monkeypatch, mixed_precision,
                                             features):
  """mobilenet_v2 at depth multiplier 0.25 has trained BN on 8, 24, ...
  channels: a float32 graph pads them where oneDNN uses AVX-512, a graph
  for the bf16 rewrite where it has native bfloat16 too."""
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: features)
  graph = model_testing.mobilenet_v2_os8_training_graph(mixed_precision).graph
  padded = _padded_bn_layers(graph)
  expected = (cpu_lib.onednn_avx512(features) and ONEDNN_ON and (
      mixed_precision == 'none' or cpu_lib.onednn_native_bf16(features)))
  assert bool(padded) == expected
  assert all(name.startswith('tower_0/') for name in padded)


@pytest.mark.parametrize('onednn_forms, bf16_forms, padded', [
    (True, False, True), (False, True, True), (False, False, False)],
                         ids=['float32', 'bf16', 'neither (fp16)'])
def test_towers_pad_only_float32_and_bf16_graphs(monkeypatch, onednn_forms,
                                                 bf16_forms, padded):
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: {
      'avx512f': True, 'amx': True, 'avx512_bf16': True})
  monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: True)
  monkeypatch.setattr(cpu_lib, 'bf16_held_back', lambda environ=None: None)
  monkeypatch.setattr(cpu_lib, 'onednn_avx512',
                      lambda features, environ=None: True)

  def tower_fn(_):
    # Narrowing, as mobilenet_v2's projections: float32 graphs would take
    # a widening layer's moments from its input, without a BN op.
    y = layers.conv2d(tf.zeros([1, 5, 5, 48]), 24, 1, _trained_params(),
                      'project')
    return tf.reduce_sum(y), {}, {}

  with tf.Graph().as_default() as graph:
    towers.build_towers(tower_fn, ['/cpu:0'], onednn_forms=onednn_forms,
                        bf16_forms=bf16_forms)
  assert _bn_input_channels(graph) == [32 if padded else 24]
