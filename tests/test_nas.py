"""The NAS backbones (nas_pnasnet, nas_hnasnet) and their drop path.

The variables and the outputs are checked against the original by
test_manifests.py and test_reference_numeric.py; here: the cell layout over
output strides, the options the original refuses or ignores, the drop-path
schedule (identity at inference and at step 0, random when it is on), its
refusal for other backbones, and two training steps of each backbone.
Models are tiny: crop 33, 4 stem filters.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import train as train_cli
from deeplab_train.model import deeplab
from deeplab_train.model import nas_cell
from deeplab_train.model import nas_network
from deeplab_train.model import registry
from deeplab_train.train import graph as graph_lib

import model_testing as mt
import train_testing as tt

CROP = 33


def _options(variant, output_stride=None, **changes):
  if output_stride is None:
    output_stride = 8 if variant == 'nas_hnasnet' else 16
  return config.ModelOptions(
      num_classes=tt.NUM_CLASSES, model_variant=variant,
      crop_size=(CROP, CROP), output_stride=output_stride,
      nas_stem_output_num_conv_filters=4, **changes).validate()


def _random_op_types(graph):
  return [op.type for op in graph.get_operations()
          if op.type.startswith('Random')]


# Cell layout.


def test_pnasnet_strides_at_the_fifth_cell_for_output_stride_16():
  steps = nas_network._cell_steps(nas_network._PNASNET_BACKBONES[16], False)
  assert [s.stride for s in steps] == [2, 1, 1, 1, 2] + [1] * 7
  assert [s.output_stride for s in steps] == [8] * 4 + [16] * 8
  assert [s.filter_scaling for s in steps] == [2.0] * 4 + [4.0] * 8
  assert not any(s.upsample_input for s in steps)


def test_hnasnet_goes_down_to_32_and_back_up_to_8():
  steps = nas_network._cell_steps(nas_network._HNASNET_BACKBONE, False)
  assert [s.output_stride for s in steps] == [4, 4, 4, 8, 16, 8, 16, 16, 32,
                                              32, 16, 8]
  assert [i for i, s in enumerate(steps) if s.upsample_input] == [5, 10, 11]
  assert [i for i, s in enumerate(steps) if s.stride == 2] == [3, 4, 6, 8]
  assert steps[-1].filter_scaling == 2.0


def test_remove_os32_stride_keeps_level_3_at_stride_16():
  steps = nas_network._cell_steps(nas_network._HNASNET_BACKBONE, True)
  assert [s.output_stride for s in steps] == [4, 4, 4, 8, 16, 8, 16, 16, 16,
                                              16, 16, 8]
  # Back from level 3 without upsampling; the filters still halve.
  assert [i for i, s in enumerate(steps) if s.upsample_input] == [5, 11]
  assert steps[10].filter_scaling == 4.0


def test_classification_head_convs_turn_atrous_past_the_output_stride():
  # From the last cell at stride 8 to output stride 16: one strided conv,
  # then rate 2.
  assert nas_network._head_convs(8, 16) == [(16, 2, 1), (32, 1, 2)]
  assert nas_network._head_convs(8, 8) == [(16, 1, 2), (32, 1, 4)]
  assert nas_network._head_convs(32, 32) == []


@pytest.mark.parametrize('variant,output_stride,message', [
    ('nas_pnasnet', 4, 'use 8, 16 or 32'),
    ('nas_hnasnet', 16, 'output stride 8'),
])
def test_unreachable_output_strides_are_refused(variant, output_stride,
                                                message):
  options = _options(variant, output_stride)
  with tf.Graph().as_default():
    with pytest.raises(config.ConfigError, match=message):
      mt.build_logits(options, batch_size=1)


def test_classification_head_and_decoder_variables():
  options = _options('nas_hnasnet', 16, nas_use_classification_head=True,
                     decoder_output_stride=(4,))
  graph = tf.Graph()
  with graph.as_default():
    _, outputs, _ = mt.build_logits(options, batch_size=1)
  shapes = dict(mt.variable_shapes(graph))
  # The last cell (level 1) has 2 * 4 filters per hidden state, 5 states.
  assert shapes['hnasnet/downsample_os16_conv/weights'] == (3, 3, 40, 512)
  assert shapes['hnasnet/downsample_os32_conv/weights'] == (3, 3, 512, 1024)
  assert shapes['hnasnet/classification_head_conv/weights'] == (
      1, 1, 1024, 2048)
  assert 'hnasnet/classification_head_bn/moving_mean' in shapes
  assert shapes['aspp0/weights'] == (1, 1, 2048, 256)
  # The stride-4 decoder end point of hnasnet: Cell_2 (5 * 4 channels).
  assert shapes['decoder/feature_projection0/weights'] == (1, 1, 20, 48)
  logits = outputs['semantic']['merged_logits']
  assert logits.shape.as_list() == [1, 9, 9, tt.NUM_CLASSES]


def test_hnasnet_on_images_of_unknown_size_as_on_a_fixed_crop():
  # The upsampling and resizing between levels also work on dynamic shapes
  # (eval and vis without a crop size).
  options = _options('nas_hnasnet')
  images, _ = tt.synthetic_batch(1, CROP)
  graph = tf.Graph()
  with graph.as_default():
    fixed = deeplab.predict_labels(tf.constant(images), options)
    placeholder = tf.placeholder(tf.float32, [1, None, None, 3])
    dynamic = deeplab.predict_labels(placeholder,
                                     options.replace(crop_size=None))
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      mt.randomize_variables(sess)
      fixed, dynamic = sess.run(
          [fixed['semantic_prob'], dynamic['semantic_prob']],
          {placeholder: images})
  np.testing.assert_allclose(dynamic, fixed, rtol=1e-4, atol=1e-5)


# Drop path.


def test_keep_probability_falls_over_cells_and_steps():
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    schedule = nas_cell.DropPath(keep_prob=0.6, total_steps=100,
                                 global_step=step)
    last = schedule.keep_prob_of_cell(11, 12)
    middle = schedule.keep_prob_of_cell(5, 12)
    sess = tf.Session()
  with sess:
    def at(s):
      return sess.run([last, middle], {step: s})
    np.testing.assert_allclose(at(0), [1.0, 1.0])
    np.testing.assert_allclose(at(50), [0.8, 0.9], rtol=1e-6)
    np.testing.assert_allclose(at(100), [0.6, 0.8], rtol=1e-6)
    # Past the end of training the final values stay.
    np.testing.assert_allclose(at(1000), [0.6, 0.8], rtol=1e-6)


def test_drop_path_keeps_or_zeroes_whole_images():
  with tf.Graph().as_default() as graph:
    tf.set_random_seed(1)
    ones = tf.ones([4000, 3, 3, 2])
    dropped = nas_cell.drop_path(ones, tf.constant(0.8))
  with tf.Session(graph=graph) as sess:
    value = sess.run(dropped)
  per_image = value.reshape(4000, -1)
  # One decision per image: all its values 0, or all 1 / 0.8.
  assert np.all(per_image.min(axis=1) == per_image.max(axis=1))
  np.testing.assert_allclose(np.unique(per_image), [0.0, 1.25], rtol=1e-6)
  kept = float((per_image[:, 0] > 0).mean())
  assert 0.77 < kept < 0.83
  # Unbiased: the mean stays about 1.
  assert abs(per_image.mean() - 1.0) < 0.05


@pytest.fixture(scope='module')
def drop_path_outputs():
  """pnasnet features on one batch, built with and without drop path in
  training mode (BN trained) and in inference mode, sharing the variables
  (the backbone alone: the head's dropout is random too)."""
  options = _options('nas_pnasnet')
  images, _ = tt.synthetic_batch(2, CROP)
  graph = tf.Graph()
  with graph.as_default():
    step = tf.placeholder(tf.int64, [])
    schedule = nas_cell.DropPath(keep_prob=0.5, total_steps=10,
                                 global_step=step)
    normalized = registry.zero_mean_unit_range(tf.constant(images))

    def features(bn_training, **kwargs):
      with tf.variable_scope('', reuse=tf.AUTO_REUSE):
        return nas_network.build_pnasnet(
            normalized, options, is_training=bn_training,
            bn_training=bn_training, weight_decay=4e-5, **kwargs)[0]

    plain = features(True)
    with tf.name_scope('with_drop_path'):
      dropped = features(True, drop_path=schedule)
    with tf.name_scope('inference'):
      inference = features(False, drop_path=schedule)
      inference_plain = features(False)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      mt.randomize_variables(sess)
      run = lambda t, s: sess.run(t, {step: s})
      return {
          'graph': graph,
          'plain': run(plain, 0),
          'dropped_at_0': run(dropped, 0),
          'dropped_at_end': [run(dropped, 10) for _ in range(2)],
          'inference': run(inference, 10),
          'inference_plain': run(inference_plain, 10),
      }


def test_drop_path_is_the_identity_at_inference(drop_path_outputs):
  out = drop_path_outputs
  np.testing.assert_array_equal(out['inference'], out['inference_plain'])
  inference_ops = [op for op in out['graph'].get_operations()
                   if op.name.startswith('inference/')]
  assert inference_ops
  assert not [op.name for op in inference_ops if 'drop_path' in op.name]


def test_drop_path_is_the_identity_at_step_0(drop_path_outputs):
  out = drop_path_outputs
  np.testing.assert_array_equal(out['dropped_at_0'], out['plain'])


def test_drop_path_drops_at_the_end_of_training(drop_path_outputs):
  out = drop_path_outputs
  first, second = out['dropped_at_end']
  # Random paths: two runs differ from each other and from no drop path.
  assert not np.allclose(first, second)
  assert not np.allclose(first, out['plain'])
  assert np.all(np.isfinite(first)) and np.all(np.isfinite(second))


def test_drop_path_follows_batch_norm_training_as_the_original():
  options = _options('nas_hnasnet')
  graph = tf.Graph()
  with graph.as_default():
    schedule = nas_cell.DropPath(keep_prob=0.5, total_steps=10,
                                 global_step=tf.constant(5, tf.int64))
    images = tf.zeros([1, CROP, CROP, 3])
    deeplab.multi_scale_logits(images, options, is_training=True,
                               fine_tune_batch_norm=False,
                               drop_path=schedule)
  # Only the dropout after concat_projection is random.
  assert not [op.name for op in graph.get_operations()
              if 'drop_path' in op.name]


def test_drop_path_is_refused_for_other_backbones():
  options = tt.tiny_model_options()
  train = config.TrainOptions(train_batch_size=1,
                              drop_path_keep_prob=0.8).validate()
  images, labels = tt.synthetic_batch(1, CROP)
  with pytest.raises(config.ConfigError) as error:
    graph_lib.build_training_graph(
        options, train, ignore_label=255,
        input_fn=tt.constant_input_fn(images, labels))
  message = str(error.value)
  assert 'drop_path_keep_prob=0.8' in message
  assert 'NAS backbones' in message and 'mobilenet_v2' in message


def test_deeplab_train_refuses_drop_path_for_other_backbones(tmp_path):
  records = tmp_path / 'records'
  tt.make_tfrecords(records, count=2)
  args = tt.tiny_cli_args(tmp_path / 'log', str(records), 5,
                          '--fine_tune_batch_norm=true',
                          '--drop_path_keep_prob=0.8')
  code, _, result = tt.main_in_process('deeplab-train', train_cli.main, args)
  assert code == 2 and result['status'] == 'bad_input'
  assert '--drop_path_keep_prob=0.8' in result['message']
  assert '--model_variant=mobilenet_v2' in result['message']
  assert not (tmp_path / 'log' / config.RUN_CONFIG_FILENAME).exists()


@pytest.mark.parametrize('changes,message', [
    (dict(drop_path_keep_prob=0.0), r'must be in \(0, 1\]'),
    (dict(drop_path_keep_prob=1.5), r'must be in \(0, 1\]'),
    (dict(drop_path_keep_prob=0.7, fine_tune_batch_norm=False),
     'needs fine_tune_batch_norm=true'),
])
def test_bad_drop_path_options(changes, message):
  with pytest.raises(config.ConfigError, match=message):
    config.TrainOptions(**changes).validate()


# Training.


def _train_two_steps(variant, drop_path_keep_prob):
  """Total losses of 2 training steps, and of 2 forward passes at the end
  of the drop-path schedule."""
  options = _options(variant)
  train = config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=True, seed=0,
      training_number_of_steps=2, base_learning_rate=1e-3,
      drop_path_keep_prob=drop_path_keep_prob).validate()
  images, labels = tt.synthetic_batch(2, CROP, seed=3)
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels))
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.global_variables_initializer())
    losses = [sess.run([g.train_op, g.total_loss])[1] for _ in range(2)]
    assert sess.run(g.global_step) == 2
    forward = [sess.run(g.total_loss) for _ in range(2)]
  return g, losses, forward


@pytest.mark.slow
def test_pnasnet_trains_with_drop_path():
  g, losses, forward = _train_two_steps('nas_pnasnet', 0.7)
  assert np.all(np.isfinite(losses + forward))
  assert [op for op in g.graph.get_operations() if 'drop_path' in op.name]
  # At the end of the schedule the random paths change the loss from one
  # run to the next (the concat_projection dropout alone would too, so
  # the check above proves drop path is in the graph).
  assert forward[0] != forward[1]


@pytest.mark.slow
def test_hnasnet_trains():
  g, losses, _ = _train_two_steps('nas_hnasnet', 1.0)
  assert np.all(np.isfinite(losses))
  assert not [op for op in g.graph.get_operations()
              if 'drop_path' in op.name]
