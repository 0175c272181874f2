"""The weight decay taken through the momentum accumulator: the same
updates as momentum on the whole gradient (data loss + weight decay), in
the optimizer alone and in the training graph."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.model import layers
from deeplab_train.train import graph as graph_lib
from deeplab_train.train import momentum as momentum_lib

import reference_checkpoint
import train_testing as tt

LEARNING_RATE = 0.1
MOMENTUM = 0.9


def _run_optimizer(make_optimizer, decayed_gradient, steps=4):
  """Values of three variables after `steps` updates with gradients that
  change at each step; `decayed_gradient` adds factor * w to them first."""
  rng = np.random.RandomState(0)
  shapes = {'a': (3, 4), 'b': (5,), 'c': (2, 2)}
  factors = {'a': 0.5, 'c': 0.3}  # 'b' has no weight decay
  with tf.Graph().as_default():
    variables = {name: tf.get_variable(
        name, initializer=rng.randn(*shape).astype(np.float32),
        use_resource=True) for name, shape in shapes.items()}
    feeds = {name: tf.placeholder(tf.float32, shape)
             for name, shape in shapes.items()}
    pairs = []
    for name, var in variables.items():
      grad = feeds[name]
      if decayed_gradient and name in factors:
        grad = grad + factors[name] * var
      pairs.append((grad, var))
    optimizer = make_optimizer(
        {variables[n]: f for n, f in factors.items()})
    train_op = optimizer.apply_gradients(pairs)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      for _ in range(steps):
        sess.run(train_op, {feeds[n]: rng.randn(*s).astype(np.float32)
                            for n, s in shapes.items()})
      return sess.run(variables)


def test_updates_equal_momentum_on_the_decayed_gradient():
  ours = _run_optimizer(
      lambda decays: momentum_lib.MomentumWithDecayInAccumulator(
          LEARNING_RATE, MOMENTUM, decays), decayed_gradient=False)
  reference = _run_optimizer(
      lambda decays: tf.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM),
      decayed_gradient=True)
  without_decay = _run_optimizer(
      lambda decays: tf.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM),
      decayed_gradient=False)
  for name in reference:
    np.testing.assert_allclose(ours[name], reference[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
  # The decay moves 'a' and 'c' far beyond that tolerance.
  for name in ('a', 'c'):
    assert np.abs(without_decay[name] - reference[name]).max() > 0.05, name


def test_momentum_must_be_positive():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match='momentum > 0'):
      momentum_lib.MomentumWithDecayInAccumulator(0.1, 0.0, {})


def _value_for(name, shape):
  if name == 'global_step':
    return np.int64(0)
  return reference_checkpoint.value_for(name, shape)


def _train(train, wrap_optimizer=None, steps=3):
  """(graph, {'grads': the fetched gradients at the start, 'after': the
  model variables after `steps` steps}) of a tiny DeepLab from a fixed
  initialisation."""
  options = tt.tiny_model_options(crop=33, output_stride=16)
  images, labels = tt.synthetic_batch(2, 33, seed=1)
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels),
      device_pattern='/cpu:%d', wrap_optimizer=wrap_optimizer)
  variables = g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.variables_initializer(variables))
    tt.load_values(sess, g.model_variables, lambda v: _value_for(
        v.op.name, v.shape.as_list()))
    grads = sess.run({v.op.name: grad for grad, v in g.grads_and_vars})
    for _ in range(steps):
      sess.run(g.train_op)
    after = sess.run({v.op.name: v for v in g.model_variables
                      if v is not g.global_step})
  return g, {'grads': grads, 'after': after}


@pytest.fixture(scope='module')
def decayed_and_gradient_path():
  # A large decay and a last-layer multiplier, so that both matter.
  train = config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=False, weight_decay=0.05,
      last_layer_gradient_multiplier=3.0, base_learning_rate=0.05,
      seed=0).validate()
  ours = _train(train)
  # A wrapped optimizer takes the weight decay's gradient instead.
  through_gradients = _train(train, wrap_optimizer=lambda opt: opt)
  no_decay = _train(train.replace(weight_decay=0.0))
  return ours, through_gradients, no_decay


def _op_types(graph):
  return {op.type for op in graph.get_operations()}


def test_training_graph_takes_the_decay_through_the_accumulator(
    decayed_and_gradient_path):
  (g, _), (g_grad, _), _ = decayed_and_gradient_path
  assert isinstance(g.optimizer, momentum_lib.MomentumWithDecayInAccumulator)
  assert not isinstance(g_grad.optimizer,
                        momentum_lib.MomentumWithDecayInAccumulator)
  assert 'ResourceApplyGradientDescent' in _op_types(g.graph)
  assert 'ResourceApplyGradientDescent' not in _op_types(g_grad.graph)
  # No gradient of the L2 losses is built (the gradient path has one per
  # weight).
  assert not [op for op in g.graph.get_operations()
              if 'L2Loss' in op.name and '_grad' in op.name]
  assert [op for op in g_grad.graph.get_operations()
          if 'L2Loss' in op.name and '_grad' in op.name]


def _check_equal_and_moved_by_decay(kind, paths, rtol, moved_rtol):
  """Our `kind` ('after' or 'grads') values equal the gradient path's
  within rtol (atol rtol / 10 of each value's largest magnitude), and at
  least ten of them differ from the run without weight decay beyond
  moved_rtol with atol ten times rtol of the largest magnitude."""
  ours, through_gradients, no_decay = [values[kind] for _, values in paths]
  assert sorted(ours) == sorted(through_gradients)
  moved_by_decay = 0
  for name, value in through_gradients.items():
    assert np.isfinite(value).all() and np.isfinite(ours[name]).all(), name
    scale = np.abs(value).max()
    np.testing.assert_allclose(ours[name], value, rtol=rtol,
                               atol=rtol / 10 * scale, err_msg=name)
    moved_by_decay += not np.allclose(no_decay[name], value,
                                      rtol=moved_rtol, atol=10 * rtol * scale)
  assert moved_by_decay >= 10, kind


def test_training_graph_updates_equal_the_gradient_path(
    decayed_and_gradient_path):
  _check_equal_and_moved_by_decay('after', decayed_and_gradient_path, 1e-4,
                                  0.0)


def test_fetched_gradients_include_the_decay(decayed_and_gradient_path):
  _check_equal_and_moved_by_decay('grads', decayed_and_gradient_path, 1e-5,
                                  1e-3)


def _toy_weights_after(wrap_optimizer, steps=2):
  """{name: (before, after)} of the weights of a toy model with a weight
  outside the loss ('unused/weights'), trained `steps` steps."""
  def extra(logits):
    layers.conv2d(logits, 2, 1, layers.ConvParams(
        weight_decay=0.5, weights_stddev=0.1, batch_norm=None), 'unused')
    return logits
  options = tt.tiny_model_options(crop=33)
  images, labels = tt.synthetic_batch(2, 33, seed=1)
  train = config.TrainOptions(train_batch_size=2, base_learning_rate=0.1,
                              seed=0).validate()
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels),
      model_fn=tt.toy_model_fn(extra=extra), device_pattern='/cpu:%d',
      wrap_optimizer=wrap_optimizer)
  weights = {v.op.name: v for v in g.trainable_variables
             if v.op.name.endswith('weights')}
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.variables_initializer(
        g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)))
    before = sess.run(weights)
    for _ in range(steps):
      sess.run(g.train_op)
    after = sess.run(weights)
  return {name: (before[name], after[name]) for name in weights}


def test_a_weight_outside_the_loss_decays_as_with_the_gradient():
  ours = _toy_weights_after(None)
  through_gradients = _toy_weights_after(lambda opt: opt)
  assert 'unused/weights' in ours
  for name, (before, after) in through_gradients.items():
    np.testing.assert_array_equal(ours[name][0], before, err_msg=name)
    np.testing.assert_allclose(ours[name][1], after, rtol=1e-5, atol=1e-7,
                               err_msg=name)
  before, after = ours['unused/weights']
  # Gradient 0.5 w, learning rate 0.1, momentum 0.9: the accumulation is
  # 0.5 w0, then 0.9 * 0.5 w0 + 0.5 * 0.95 w0 = 0.925 w0, so w1 = 0.95 w0
  # and w2 = w1 - 0.0925 w0 = 0.8575 w0.
  np.testing.assert_allclose(after, 0.8575 * before, rtol=1e-4)
