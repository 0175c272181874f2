"""A frozen BatchNorm folded into its convolution in the training towers:
the same outputs and gradients as the BN op, and no BN op left in a
frozen-BN training graph."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers

import model_testing

CHANNELS = 6


def _frozen_params():
  return layers.ConvParams(batch_norm=layers.BatchNormParams(epsilon=1e-3),
                           bn_training=False, activation=tf.nn.relu6)


def _set_batch_norm_variables(sess, rng):
  """Gives every BatchNorm variable values far from its initial ones."""
  for v in tf.global_variables():
    if '/BatchNorm/' not in v.op.name:
      continue
    n = int(v.shape[0])
    low, high = ((0.2, 3.0) if v.op.name.endswith(('gamma', 'variance'))
                 else (-1.5, 1.5))
    v.load(rng.uniform(low, high, n).astype(np.float32), sess)


LAYERS = {
    'pointwise': lambda x, p: layers.conv2d(x, 5, 1, p, 'conv'),
    '3x3': lambda x, p: layers.conv2d(x, 5, 3, p, 'conv'),
    '3x3 stride 2': lambda x, p: layers.conv2d(x, 5, 3, p, 'conv', stride=2),
    '3x3 rate 2': lambda x, p: layers.conv2d(x, 5, 3, p, 'conv', rate=2),
    'depthwise': lambda x, p: layers.depthwise_conv2d(x, 3, p, 'dw'),
    'depthwise rate 2': lambda x, p: layers.depthwise_conv2d(x, 3, p, 'dw',
                                                             rate=2),
    'depthwise multiplier 2 stride 2': lambda x, p: layers.depthwise_conv2d(
        x, 3, p, 'dw', depth_multiplier=2, stride=2),
}


def _outputs_and_gradients(layer, fold):
  rng = np.random.RandomState(0)
  x_value = rng.uniform(-2, 2, (2, 9, 11, CHANNELS)).astype(np.float32)
  with tf.Graph().as_default():
    tf.set_random_seed(1)
    x = tf.constant(x_value)
    if fold:
      with layers.folding_frozen_batch_norm():
        y = layer(x, _frozen_params())
    else:
      y = layer(x, _frozen_params())
    variables = sorted(tf.trainable_variables(), key=lambda v: v.op.name)
    names = [v.op.name for v in variables]
    dy = tf.constant(rng.uniform(-1, 1, y.shape.as_list()).astype(np.float32))
    grads = tf.gradients(y, [x] + variables, dy)
    op_types = {op.type for op in tf.get_default_graph().get_operations()}
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      _set_batch_norm_variables(sess, rng)
      values = sess.run([y] + grads)
  return names, values, op_types


@pytest.mark.parametrize('name', sorted(LAYERS))
def test_folded_frozen_batch_norm_equals_the_batch_norm_op(name):
  names, plain, plain_ops = _outputs_and_gradients(LAYERS[name], fold=False)
  folded_names, folded, folded_ops = _outputs_and_gradients(LAYERS[name],
                                                            fold=True)
  assert folded_names == names
  assert any('BatchNorm/gamma' in n for n in names), names
  assert any('FusedBatchNorm' in t for t in plain_ops)
  assert not any('FusedBatchNorm' in t for t in folded_ops), folded_ops
  labels = ['output', 'd/dx'] + ['d/d' + n for n in names]
  for label, a, b in zip(labels, plain, folded):
    assert a.shape == b.shape, label
    scale = max(float(np.max(np.abs(a))), 1e-3)
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-5 * scale,
                               err_msg=label)


def test_folded_offset_gradient_is_a_product_not_a_reduction():
  """The offset's gradient is the product with a row of ones
  (layers._folded_offset_add_gradient), not the add's reduction, slower
  on the CPU."""
  with tf.Graph().as_default() as graph:
    x = tf.zeros([2, 9, 11, CHANNELS])
    with layers.folding_frozen_batch_norm():
      y = layers.conv2d(x, 5, 1, _frozen_params(), 'conv', activation=None)
    beta = [v for v in tf.trainable_variables()
            if v.op.name.endswith('BatchNorm/beta')]
    grad, = tf.gradients(y, beta)
    add_grad = {op.type for op in graph.get_operations()
                if '/Add_grad/' in op.name}
  assert 'MatMul' in add_grad and 'Sum' not in add_grad, add_grad
  assert grad.shape.as_list() == [5]


def _training_graph(fine_tune_batch_norm, model_variant='mobilenet_v2',
                    **model_fields):
  return model_testing.small_training_graph(
      model_variant, output_stride=16,
      fine_tune_batch_norm=fine_tune_batch_norm, **model_fields)


def _training_graph_op_types(fine_tune_batch_norm):
  built = _training_graph(fine_tune_batch_norm, depth_multiplier=0.25)
  return {op.type for op in built.graph.get_operations()}


def test_training_graph_folds_only_frozen_batch_norm():
  frozen = _training_graph_op_types(fine_tune_batch_norm=False)
  assert not any('FusedBatchNorm' in t for t in frozen), sorted(frozen)
  trained = _training_graph_op_types(fine_tune_batch_norm=True)
  assert 'FusedBatchNormV3' in trained
  assert 'FusedBatchNormGradV3' in trained


def test_grappler_optimises_a_folded_xception_training_step(capfd):
  """TensorFlow's graph optimiser (grappler) takes the whole frozen-BN
  xception_65 training graph: with the folded offsets as BiasAdd ops its
  remapper failed on the shortcut's convolution and residual add, logged
  "remapper failed" and left the graph without any of its fusions."""
  built = _training_graph(False, model_variant='xception_65')
  with built.graph.as_default(), tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    capfd.readouterr()
    sess.run(built.train_op)
    err = capfd.readouterr().err
  failures = [line for line in err.splitlines()
              if 'meta_optimizer' in line and 'failed' in line]
  assert not failures, failures
