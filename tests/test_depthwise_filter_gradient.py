"""Depthwise filter gradients in TensorFlow's own kernel
(layers.depthwise_filter_gradient_in_tensorflow_kernel): the same output
and gradients as TensorFlow's gradient, only for the widths the rule
takes, run by TensorFlow's kernel even where oneDNN's are on, and in the
training towers only of float32 graphs on a oneDNN CPU without AVX-512."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config

import model_testing

ONEDNN_ON = session_config.onednn_kernels_on()
PLAIN = layers.ConvParams(batch_norm=None, activation=None)


def _explicit_filter_gradients(graph):
  return [op for op in graph.get_operations()
          if op.type == 'DepthwiseConv2dNativeBackpropFilter'
          and op.get_attr('padding') == b'EXPLICIT']


# (kernel, stride, rate, padding, input shape, depth multiplier, one-op
# dilation, whether the form applies: 64 to 1023 channels, 2048 pixels).
CASES = {
    '3x3 SAME': (3, 1, 1, 'SAME', (2, 33, 32, 64), 1, False, True),
    '5x5 SAME': (5, 1, 1, 'SAME', (2, 33, 32, 64), 1, False, True),
    '3x3 stride 2 SAME, odd': (3, 2, 1, 'SAME', (2, 33, 33, 64), 1, False,
                               True),
    '3x3 stride 2 SAME, even': (3, 2, 1, 'SAME', (2, 34, 32, 64), 1, False,
                                True),
    '3x3 stride 2 VALID': (3, 2, 1, 'VALID', (2, 33, 32, 96), 1, False,
                           True),
    '3x3 multiplier 2': (3, 1, 1, 'SAME', (1, 48, 45, 64), 2, False, True),
    '3x3 rate 3, space-to-batch': (3, 1, 3, 'SAME', (2, 33, 32, 64), 1,
                                   False, True),
    '3x3 rate 2, one op': (3, 1, 2, 'SAME', (2, 33, 32, 64), 1, True, True),
    '3x3, 32 channels': (3, 1, 1, 'SAME', (2, 33, 32, 32), 1, False, False),
    '3x3, 1024 channels': (3, 1, 1, 'SAME', (1, 48, 45, 1024), 1, False,
                           False),
    '3x3, 2000 pixels': (3, 1, 1, 'SAME', (2, 25, 40, 64), 1, False, False),
}


def _output_and_gradients(tf_kernel, kernel, stride, rate, padding, shape,
                          multiplier, one_op):
  def build(x):
    with layers.depthwise_filter_gradient_in_tensorflow_kernel(tf_kernel), \
        layers.dilated_depthwise_in_one_op(one_op):
      return layers.depthwise_conv2d(x, kernel, PLAIN, 'dw', stride=stride,
                                     rate=rate, padding=padding,
                                     depth_multiplier=multiplier,
                                     use_bias=False)
  return model_testing.layer_output_and_gradients(build, shape)


@pytest.mark.parametrize('name', sorted(CASES))
def test_filter_gradient_in_tensorflow_kernel_equals_tensorflows(name):
  *case, one_op, applies = CASES[name]
  if one_op and not ONEDNN_ON:
    pytest.skip('the one-op dilation needs oneDNN kernels')
  plain, plain_graph = _output_and_gradients(False, *case, one_op)
  form, form_graph = _output_and_gradients(True, *case, one_op)
  assert not _explicit_filter_gradients(plain_graph)
  assert len(_explicit_filter_gradients(form_graph)) == (1 if applies
                                                          else 0)
  model_testing.assert_same_output_and_gradients(plain, form)


def _kernels_run(tf_kernel):
  """The op types a session ran for a depthwise layer's filter gradient."""
  rng = np.random.RandomState(0)
  with tf.Graph().as_default():
    x = tf.constant(rng.uniform(-1, 1, (2, 33, 32, 64)).astype(np.float32))
    with layers.depthwise_filter_gradient_in_tensorflow_kernel(tf_kernel):
      y = layers.depthwise_conv2d(x, 3, PLAIN, 'dw', use_bias=False)
    (grad,) = tf.gradients(tf.reduce_sum(y * y), tf.trainable_variables())
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      metadata = tf.RunMetadata()
      sess.run(grad, options=tf.RunOptions(
          trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
  labels = [node.timeline_label for dev in metadata.step_stats.dev_stats
            for node in dev.node_stats]
  # A label reads "<node name> = <op type>(<inputs>)".
  types = {label.split(' = ')[1].split('(')[0] for label in labels
           if ' = ' in label}
  return {t for t in types if 'BackpropFilter' in t}


@pytest.mark.skipif(not ONEDNN_ON, reason='compares with oneDNN kernels, '
                    'which TF_ENABLE_ONEDNN_OPTS=0 turns off')
def test_explicit_padding_keeps_tensorflows_kernel_where_onednn_runs():
  assert _kernels_run(False) == {
      '_MklNativeDepthwiseConv2dNativeBackpropFilter'}
  assert _kernels_run(True) == {'DepthwiseConv2dNativeBackpropFilter'}


def _filter_gradients_by_width(graph):
  """(names of the depthwise filter gradients of 64 to 1023 channels,
  names of the others)."""
  inside, outside = [], []
  for op in graph.get_operations():
    if op.type == 'DepthwiseConv2dNativeBackpropFilter':
      channels = int(op.inputs[0].shape[-1])
      (inside if 64 <= channels < 1024 else outside).append(op.name)
  return inside, outside


@pytest.mark.parametrize('features,taken', [
    ({'avx2': True}, True),
    ({'avx2': True, 'avx512f': True}, False),
    ({'avx2': True, 'avx512f': True, 'amx': True}, False)])
def test_float32_towers_take_it_where_onednn_runs_without_avx512(
    monkeypatch, features, taken):
  """A small mobilenet_v2 OS8 (depth multiplier 0.25, inputs too small for
  MIN_TF_KERNEL_FILTER_GRADIENT_PIXELS, set to 1 here): its depthwise
  layers of 64 channels or more take the form in float32 graphs on a
  oneDNN CPU without AVX-512; a graph for the bf16 rewrite never does."""
  monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: True)
  monkeypatch.setattr(layers, 'MIN_TF_KERNEL_FILTER_GRADIENT_PIXELS', 1)
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: dict(features))
  graph = model_testing.mobilenet_v2_os8_training_graph('none').graph
  inside, outside = _filter_gradients_by_width(graph)
  assert len(inside) >= 5 and outside, (inside, outside)
  explicit = sorted(op.name for op in _explicit_filter_gradients(graph))
  assert explicit == (sorted(inside) if taken else [])
  if taken:
    graph = model_testing.mobilenet_v2_os8_training_graph('bf16').graph
    assert not _explicit_filter_gradients(graph)


def test_onednn_avx512_reads_the_cpu_and_the_environment():
  avx512 = {'avx512f': True}
  assert cpu_lib.onednn_avx512(avx512, {})
  assert not cpu_lib.onednn_avx512({'avx2': True}, {})
  assert not cpu_lib.onednn_avx512(avx512, {'TF_ENABLE_ONEDNN_OPTS': '0'})
  assert not cpu_lib.onednn_avx512(avx512, {'ONEDNN_MAX_CPU_ISA': 'AVX2'})
  assert cpu_lib.onednn_avx512(avx512,
                               {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE_AMX'})
