"""The training graph: towers on two CPU devices give the gradients of one
tower on the whole batch; variables, weight decay and BN updates come from
tower 0 only; scopes and devices are where they should be."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.model import deeplab
from deeplab_train.train import graph as graph_lib

import reference_checkpoint
import train_testing as tt


def _deeplab_eval_mode(options, weight_decay=4e-5):
  """DeepLab with dropout off and BN frozen (deterministic per tower)."""
  def model_fn(images):
    return deeplab.multi_scale_logits(
        images, options, weight_decay=weight_decay, is_training=False,
        fine_tune_batch_norm=False)['semantic']
  return model_fn


def _gradients(num_clones, device_pattern, value_for):
  options = tt.tiny_model_options(crop=33, output_stride=16, decoder=(4,))
  train = config.TrainOptions(
      train_batch_size=4, num_clones=num_clones, fine_tune_batch_norm=False,
      weight_decay=4e-5, last_layer_gradient_multiplier=3.0).validate()
  images, labels = tt.synthetic_batch(4, 33, seed=1)  # no ignore pixels
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels),
      model_fn=_deeplab_eval_mode(options), device_pattern=device_pattern)
  session_config = tf.ConfigProto(device_count={'CPU': 2})
  with tf.Session(graph=g.graph, config=session_config) as sess:
    sess.run(tf.variables_initializer(g.graph.get_collection(
        tf.GraphKeys.GLOBAL_VARIABLES)))
    tt.load_values(sess, g.model_variables,
                   lambda v: value_for(v.op.name, v.shape.as_list()))
    grads = {v.op.name: grad for grad, v in g.grads_and_vars}
    values = sess.run({'grads': grads, 'loss': g.total_loss,
                       'reg': g.regularization_loss})
  return g, values


@pytest.fixture(scope='module')
def one_and_two_towers():
  value_for = reference_checkpoint.value_for
  return (_gradients(1, '/cpu:%d', value_for),
          _gradients(2, '/cpu:%d', value_for))


def test_two_towers_average_to_the_whole_batch_gradient(one_and_two_towers):
  (g1, one), (g2, two) = one_and_two_towers
  assert sorted(one['grads']) == sorted(two['grads'])
  assert len(one['grads']) == len(g1.trainable_variables)
  np.testing.assert_allclose(two['loss'], one['loss'], rtol=1e-5)
  np.testing.assert_allclose(two['reg'], one['reg'], rtol=1e-6)
  for name, grad in one['grads'].items():
    scale = np.abs(grad).max()
    assert scale > 0, name
    # Float32 sums in another order: relative to the gradient's scale.
    np.testing.assert_allclose(two['grads'][name], grad, rtol=1e-4,
                               atol=1e-4 * scale, err_msg=name)


def test_towers_share_one_set_of_variables(one_and_two_towers):
  (g1, _), (g2, _) = one_and_two_towers
  names1 = sorted(v.op.name for v in g1.model_variables)
  names2 = sorted(v.op.name for v in g2.model_variables)
  assert names1 == names2
  assert not any('tower' in n for n in names2)
  # Weight decay is recorded once, by the tower that creates the variables.
  towers = g2.towers
  assert towers[0].regularization_losses
  assert not towers[1].regularization_losses


def test_scopes_and_devices(one_and_two_towers):
  _, _ = one_and_two_towers[0]
  g2 = one_and_two_towers[1][0]
  graph = g2.graph
  ops = graph.get_operations()
  for scope in ('input/', 'tower_0/', 'tower_1/', 'train/',
                'average_gradients/'):
    assert any(op.name.startswith(scope) for op in ops), scope
  conv0 = [op for op in ops if op.name.startswith('tower_0/') and
           op.type in ('Conv2D', 'MatMul')]
  conv1 = [op for op in ops if op.name.startswith('tower_1/') and
           op.type in ('Conv2D', 'MatMul')]
  assert conv0 and conv1
  assert {_canonical(op.device) for op in conv0} == {'/device:CPU:0'}
  assert {_canonical(op.device) for op in conv1} == {'/device:CPU:1'}
  for var in g2.model_variables:
    assert _canonical(var.op.device) == '/device:CPU:0', var.op.name


def _canonical(device):
  return tf.DeviceSpec.from_string(device).to_string()


def _control_inputs(op, seen=None):
  """Every op a grouped op waits for (tf.group nests NoOps by device)."""
  seen = set() if seen is None else seen
  for dep in op.control_inputs:
    if dep not in seen:
      seen.add(dep)
      if dep.type == 'NoOp':
        _control_inputs(dep, seen)
  return seen


def test_batch_norm_updates_of_tower_0_run_with_the_train_op():
  options = tt.tiny_model_options(crop=33, output_stride=32)
  train = config.TrainOptions(train_batch_size=2, num_clones=2,
                              fine_tune_batch_norm=True).validate()
  images, labels = tt.synthetic_batch(2, 33)
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels),
      device_pattern='/cpu:%d')
  updates0, updates1 = [t.update_ops for t in g.towers]
  assert updates0 and updates1
  assert all(isinstance(op, tf.Operation) for op in updates0 + updates1)
  assert all(op.name.startswith('tower_0/') for op in updates0)
  waits_for = _control_inputs(g.train_op)
  assert set(updates0) <= waits_for
  assert not set(updates1) & waits_for
  # The optimizer's update (which also increments the global step).
  assert any(op.name.startswith('train/Momentum') for op in waits_for)
