"""Activations compiled by XLA (layers.activations_in_xla): the same values
and gradients as TensorFlow's kernels, in bf16 and fp32, and in the training
towers of bf16 graphs on a oneDNN CPU only, where the whole network is not
compiled already (--use_xla)."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import session_config

import model_testing

ACTIVATIONS = {'relu': tf.nn.relu, 'relu6': tf.nn.relu6}


def _compiled(op):
  try:
    return op.get_attr('_XlaCompile')
  except ValueError:
    return False


def _activation_ops(graph, types):
  return [op for op in graph.get_operations() if op.type in types]


@pytest.mark.parametrize('dtype', [tf.bfloat16, tf.float32])
@pytest.mark.parametrize('name', sorted(ACTIVATIONS))
def test_compiled_activation_equals_tensorflows(name, dtype):
  """Output and input gradient bit for bit, on values that include the
  kinks (0 and 6), where the gradient is 0."""
  rng = np.random.RandomState(0)
  x_value = rng.uniform(-8, 8, (2, 9, 7, 5)).astype(np.float32)
  x_value.flat[:4] = [0.0, 6.0, -0.0, 5.96875]
  dy_value = rng.uniform(-1, 1, x_value.shape).astype(np.float32)
  fetches = {}
  with tf.Graph().as_default() as graph:
    x = tf.cast(tf.constant(x_value), dtype)
    dy = tf.cast(tf.constant(dy_value), dtype)
    for compiled in (False, True):
      with layers.activations_in_xla(compiled):
        y = layers.activate(ACTIVATIONS[name], x)
      (dx,) = tf.gradients(y, x, dy)
      assert _compiled(y.op) == compiled
      assert _compiled(dx.op) == compiled, dx.op.type
      fetches[compiled] = [tf.cast(y, tf.float32), tf.cast(dx, tf.float32)]
    with tf.Session(graph=graph) as sess:
      got = sess.run(fetches)
  for plain, compiled in zip(got[False], got[True]):
    np.testing.assert_array_equal(compiled, plain)
  # The kinks: no gradient at 0 and 6 (ReLU: at 0 only).
  assert got[True][1].flat[0] == 0
  assert (got[True][1].flat[1] == 0) == (name == 'relu6')


@pytest.mark.parametrize('mixed_precision', ['none', 'bf16'])
def test_bf16_training_towers_compile_their_activations(monkeypatch,
                                                        mixed_precision):
  """Every ReLU6 of mobilenet_v2 (and the head's ReLUs) and their gradients
  are compiled in a graph for the bf16 rewrite on a oneDNN CPU, each in a
  cluster of its own; none otherwise."""
  for onednn in (True, False):
    monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: onednn)
    graph = model_testing.mobilenet_v2_os8_training_graph(
        mixed_precision).graph
    forward = _activation_ops(graph, ('Relu', 'Relu6'))
    backward = _activation_ops(graph, ('ReluGrad', 'Relu6Grad'))
    assert len(forward) > 30 and len(backward) == len(forward)
    compiled = [op for op in forward + backward if _compiled(op)]
    if mixed_precision == 'bf16' and onednn:
      assert compiled == forward + backward
      scopes = {op.get_attr('_XlaScope') for op in forward}
      assert len(scopes) == len(forward)
    else:
      assert not compiled, [op.name for op in compiled]


def test_whole_network_compiled_keeps_one_scope(monkeypatch):
  """With --use_xla the network is one cluster: the activations stay in its
  scope rather than splitting it into clusters of their own."""
  monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: True)
  graph = model_testing.mobilenet_v2_os8_training_graph(
      'bf16', use_xla=True).graph
  forward = _activation_ops(graph, ('Relu', 'Relu6'))
  assert forward and all(_compiled(op) for op in forward)
  assert len({op.get_attr('_XlaScope') for op in forward}) == 1
