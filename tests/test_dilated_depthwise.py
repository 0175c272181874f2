"""A dilated depthwise convolution in one op (layers.dilated_depthwise_in_one_op):
the same output and gradients as TensorFlow's space-to-batch form, only for
the cases it covers, and in the training towers only where oneDNN's CPU
kernels run it."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.model import layers
from deeplab_train.runtime import session_config
from deeplab_train.train import graph as graph_lib
from deeplab_train.train import towers

import model_testing

ONEDNN_ON = session_config.onednn_kernels_on()
PLAIN = layers.ConvParams(batch_norm=None, activation=None)


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


def _mobilenet_os8_training_graph(mixed_precision):
  model = config.ModelOptions(
      num_classes=3, model_variant='mobilenet_v2', crop_size=(33, 33),
      output_stride=8, depth_multiplier=0.25).validate()
  train = config.TrainOptions(
      train_batch_size=2, training_number_of_steps=10,
      fine_tune_batch_norm=True, clone_on_cpu=True,
      mixed_precision=mixed_precision).validate()

  def input_fn():
    return {'image': tf.zeros([2, 33, 33, 3]),
            'label': tf.zeros([2, 33, 33, 1], tf.int32)}
  return graph_lib.build_training_graph(model, train, ignore_label=255,
                                        input_fn=input_fn)


def test_training_towers_run_the_one_op_form_where_onednn_runs():
  """mobilenet_v2 OS8 has depthwise rates 2 and 4: its fp32 training graph
  computes them in one op exactly when this process runs oneDNN's kernels,
  and a step runs; a graph for the bf16 rewrite keeps space-to-batch."""
  built = _mobilenet_os8_training_graph('none')
  dilated = _dilated_ops(built.graph)
  rates = {tuple(op.get_attr('dilations'))[1] for op in dilated}
  assert rates == ({2, 4} if ONEDNN_ON else set()), rates
  assert all(op.name.startswith('tower_0/') for op in dilated)
  with built.graph.as_default(), tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    _, loss = sess.run([built.train_op, built.total_loss])
  assert np.isfinite(loss)
  assert not _dilated_ops(_mobilenet_os8_training_graph('bf16').graph)
