"""Initialisation from a checkpoint: a 21-class checkpoint into a 5-class
model, with and without the last layers; shape mismatches; bad paths."""
import glob
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import train as train_cli
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.model import deeplab
from deeplab_train.model import layers
from deeplab_train.train import checkpoint_init
from deeplab_train.train import graph as graph_lib

import train_testing as tt

EXTRA_SCOPES = ('logits', 'image_pooling', 'aspp', 'concat_projection',
                'decoder', 'meta_architecture')


def _value(name, shape):
  """Deterministic values, positive where BN needs it."""
  rng = np.random.RandomState(abs(hash(name)) % (2**31))
  if name.endswith('moving_variance') or name.endswith('gamma'):
    return rng.uniform(0.8, 1.2, shape).astype(np.float32)
  return rng.normal(0, 0.1, shape).astype(np.float32)


def _model_variables(options):
  """Builds DeepLab in the current graph; returns its variables."""
  images = tf.zeros([1, 33, 33, 3])
  with layers.recording():
    deeplab.multi_scale_logits(images, options, is_training=True,
                               fine_tune_batch_norm=True)
  return tf.global_variables()


@pytest.fixture(scope='module')
def checkpoint_21(tmp_path_factory):
  """A 21-class checkpoint of the tiny model (with decoder) and its values."""
  prefix = str(tmp_path_factory.mktemp('ckpt21') / 'model.ckpt')
  options = tt.tiny_model_options(num_classes=21, decoder=(4,))
  with tf.Graph().as_default():
    variables = _model_variables(options)
    saver = tf.train.Saver(variables)
    with tf.Session() as sess:
      tt.load_values(sess, variables,
                     lambda v: _value(v.op.name, v.shape.as_list()))
      saver.save(sess, prefix, write_meta_graph=False)
  return prefix, tt.read_checkpoint(prefix)


def _init_5_classes(prefix, **train_flags):
  """Builds the 5-class training graph, runs its init; returns values."""
  options = tt.tiny_model_options(num_classes=5, decoder=(4,))
  train = config.TrainOptions(train_batch_size=2, fine_tune_batch_norm=False,
                              **train_flags).validate()
  images, labels = tt.synthetic_batch(2, 33)
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels), init_checkpoint=prefix,
      device_pattern='/cpu:%d')
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.variables_initializer(
        g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)))
    g.scaffold.init_fn(sess)  # what the session manager calls
    values = sess.run({v.op.name: v for v in g.model_variables})
  return g.init_plan, values


def test_logits_only_restores_everything_but_the_logits(checkpoint_21):
  prefix, ckpt = checkpoint_21
  plan, values = _init_5_classes(prefix, initialize_last_layer=False,
                                 last_layers_contain_logits_only=True)
  logits = sorted(n for n in values if n.startswith('logits'))
  assert logits == ['logits/semantic/biases', 'logits/semantic/weights']
  assert sorted(plan.excluded) == logits
  assert not plan.missing and not plan.mismatched
  assert sorted(plan.restored) == sorted(set(values) - set(logits))
  assert any(n.startswith('decoder/') for n in plan.restored)
  for name in plan.restored:
    np.testing.assert_array_equal(values[name], ckpt[name], err_msg=name)
  assert values['logits/semantic/weights'].shape == (1, 1, 256, 5)
  assert 'global_step' not in plan.restored


def test_without_logits_only_all_extra_layers_are_left_out(checkpoint_21):
  prefix, ckpt = checkpoint_21
  plan, values = _init_5_classes(prefix, initialize_last_layer=False,
                                 last_layers_contain_logits_only=False)
  extra = sorted(n for n in values if n.startswith(EXTRA_SCOPES))
  assert {n.split('/')[0] for n in extra} >= {
      'logits', 'image_pooling', 'aspp0', 'concat_projection', 'decoder'}
  assert sorted(plan.excluded) == extra
  assert all(n.startswith('MobilenetV2/') for n in plan.restored)
  assert len(plan.restored) == len(values) - len(extra)
  for name in plan.restored:
    np.testing.assert_array_equal(values[name], ckpt[name], err_msg=name)
  # Left at their initial values, not the checkpoint's.
  for name in extra:
    if values[name].shape == ckpt[name].shape:
      assert not np.array_equal(values[name], ckpt[name]), name


def test_logits_of_another_class_count_are_skipped_with_a_hint(checkpoint_21):
  prefix, ckpt = checkpoint_21
  plan, values = _init_5_classes(prefix, initialize_last_layer=True)
  assert plan.mismatched == [
      ('logits/semantic/biases', (21,), (5,)),
      ('logits/semantic/weights', (1, 1, 256, 21), (1, 1, 256, 5))]
  text = '\n'.join(map(str, plan.summary_lines()))
  assert ('logits have 21 classes in the checkpoint, the model 5: pass '
          'initialize_last_layer=false') in text
  assert '2 skipped with a shape mismatch' in text
  assert len(plan.restored) == len(values) - 2
  np.testing.assert_array_equal(values['aspp0/weights'], ckpt['aspp0/weights'])


def test_deeplab_train_names_the_hints_options_as_flags(
    checkpoint_21, tmp_path, caplog):
  """The class-count hint of deeplab-train's log read 'pass
  initialize_last_layer=false last_layers_contain_logits_only=true': the
  library's field names, not the flags to type."""
  prefix, _ = checkpoint_21
  records = tmp_path / 'records'
  tt.make_tfrecords(records, count=2)
  caplog.set_level(logging.INFO)
  code, _, result = tt.main_in_process('deeplab-train', train_cli.main, (
      tt.tiny_cli_args(tmp_path / 'log', records, 1,
                       '--decoder_output_stride=4',
                       '--tf_initial_checkpoint=' + prefix)))
  assert (code, result['stop_reason']) == (0, 'finished'), result
  hints = [r.getMessage() for r in caplog.records if 'hint:' in
           r.getMessage()]
  assert hints == [
      '  hint: logits have 21 classes in the checkpoint, the model 5: pass '
      '--initialize_last_layer=false --last_layers_contain_logits_only=true '
      'to start them afresh'], caplog.text


def _write_checkpoint(prefix, named_shapes):
  with tf.Graph().as_default():
    variables = [tf.get_variable(n, s) for n, s in named_shapes]
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tf.train.Saver(variables).save(sess, prefix, write_meta_graph=False)


def test_damaged_initial_checkpoint_is_named(checkpoint_21, tmp_path):
  prefix, _ = checkpoint_21
  copy = str(tmp_path / 'model.ckpt')
  for suffix in ('.index', '.data-00000-of-00001'):
    shutil.copy(prefix + suffix, copy + suffix)
  data = tmp_path / 'model.ckpt.data-00000-of-00001'
  data.write_bytes(data.read_bytes()[:1000])
  with pytest.raises(config.ConfigError,
                     match='checkpoint %s cannot be read: its data is '
                     'damaged or cut short' % copy):
    _init_5_classes(copy, initialize_last_layer=False)


def test_incomplete_checkpoint_is_named_as_such(checkpoint_21, tmp_path):
  """An index copied without its data: it was 'deleted while it was being
  read (the training run writing it keeps only its newest checkpoints)'.
  Found when the restore is planned, before the session: the restore found
  it after the graph was built, leaving an events file in the logdir."""
  prefix, _ = checkpoint_21
  copy = str(tmp_path / 'model.ckpt-5')
  shutil.copy(prefix + '.index', copy + '.index')
  incomplete = ('checkpoint %s is incomplete: it has its .index but no '
                r'\.data-\* file' % copy)
  # A data shard of two missing.
  two = str(tmp_path / 'model.ckpt-6')
  shutil.copy(prefix + '.index', two + '.index')
  shutil.copy(prefix + '.data-00000-of-00001', two + '.data-00000-of-00002')
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options(num_classes=21,
                                                       decoder=(4,)))
    with pytest.raises(config.ConfigError, match=incomplete):
      checkpoint_init.make_init_plan(copy, variables)
    with pytest.raises(config.ConfigError,
                       match=r'but \.data-00001-of-00002 \('):
      checkpoint_init.make_init_plan(two, variables)
    # An .index cut short: TensorFlow's bare 'not an sstable (bad magic
    # number)', with no advice.
    cut = str(tmp_path / 'model.ckpt-7')
    shutil.copy(prefix + '.data-00000-of-00001',
                cut + '.data-00000-of-00001')
    with open(prefix + '.index', 'rb') as f:
      index = f.read()
    with open(cut + '.index', 'wb') as f:
      f.write(index[:len(index) // 2])
    with pytest.raises(config.ConfigError) as e:
      checkpoint_init.make_init_plan(cut, variables)
    assert e.value.render().startswith(
        'checkpoint %s cannot be read: its .index file is damaged or cut '
        'short (' % cut), e.value.render()
    assert e.value.render().endswith(
        '); use another checkpoint or copy this one again')
  with pytest.raises(config.ConfigError, match=incomplete):
    _init_5_classes(copy, initialize_last_layer=False)


def test_momentum_slots_and_other_float_types_restore_as_the_original(
    tmp_path):
  """As the original's init (every variable but the step and the excluded
  last layers): the momentum accumulators a checkpoint holds are restored
  (they started from zero), and a variable stored as float64 or float16 is
  cast (a traceback and exit 1 'Restoring from checkpoint failed')."""
  prefix = str(tmp_path / 'model.ckpt')
  options = tt.tiny_model_options(num_classes=5, decoder=(4,))
  with tf.Graph().as_default():
    model = [(v.op.name, v.shape.as_list(), v.trainable)
             for v in _model_variables(options)]
  types = {'MobilenetV2/Conv/weights': tf.float64,
           'aspp0/weights/Momentum': tf.float16}
  stored = {}
  with tf.Graph().as_default():
    variables = []
    for name, shape, trainable in model:
      for slot in ('', '/Momentum') if trainable else ('',):
        value = _value(name + slot, shape)
        dtype = types.get(name + slot, tf.float32)
        stored[name + slot] = value.astype(dtype.as_numpy_dtype)
        variables.append(tf.get_variable(
            name + slot, initializer=stored[name + slot], dtype=dtype))
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tf.train.Saver(variables).save(sess, prefix, write_meta_graph=False)

  train = config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=False,
      initialize_last_layer=False,
      last_layers_contain_logits_only=True).validate()
  images, labels = tt.synthetic_batch(2, 33)
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels), init_checkpoint=prefix,
      device_pattern='/cpu:%d')
  slots = {v.op.name + '/Momentum': g.optimizer.get_slot(v, 'momentum')
           for v in g.trainable_variables}
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.variables_initializer(
        g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)))
    g.scaffold.init_fn(sess)
    values = sess.run(dict({v.op.name: v for v in g.model_variables},
                           **slots))
  logits = [n for n in stored if n.startswith('logits')]
  assert sorted(logits) == [
      'logits/semantic/biases', 'logits/semantic/biases/Momentum',
      'logits/semantic/weights', 'logits/semantic/weights/Momentum']
  for name, value in values.items():
    if name in logits:  # excluded, slots and all: zeros and initial values
      assert not np.array_equal(value, stored[name]), name
      continue
    np.testing.assert_allclose(value, stored[name].astype(np.float32),
                               err_msg=name)
  assert values['MobilenetV2/Conv/weights'].dtype == np.float32
  plan = g.init_plan
  assert plan.optimizer_restored == sorted(
      n for n in slots if n not in logits)
  assert plan.cast == [('MobilenetV2/Conv/weights', 'float64', 'float32'),
                       ('aspp0/weights/Momentum', 'float16', 'float32')]
  assert plan.unused == 0
  # The excluded layers' slots the checkpoint holds are counted too (they
  # were in no count of the log line).
  assert plan.optimizer_excluded == [n for n in sorted(logits)
                                     if n.endswith('/Momentum')]
  text = '\n'.join(map(str, plan.summary_lines()))
  assert ('and %d of the optimizer\'s variables (e.g. ' % len(
      plan.optimizer_restored)) in text
  assert ', 2 excluded with the last layers' in text
  # Another class count with the last layer left on: the logits' slots
  # have another shape too, and are counted (they were in no count).
  four = graph_lib.build_training_graph(
      tt.tiny_model_options(num_classes=4, decoder=(4,)),
      config.TrainOptions(train_batch_size=2,
                          fine_tune_batch_norm=False).validate(),
      ignore_label=255,
      input_fn=tt.constant_input_fn(*tt.synthetic_batch(2, 33, num_classes=4)),
      init_checkpoint=prefix, device_pattern='/cpu:%d')
  assert four.init_plan.optimizer_skipped == [
      n for n in sorted(logits) if n.endswith('/Momentum')]
  assert ', 2 skipped with another shape or type' in '\n'.join(
      map(str, four.init_plan.summary_lines()))
  assert ('cast to the model\'s type: MobilenetV2/Conv/weights (float64 to '
          'float32), aspp0/weights/Momentum (float16 to float32)') in text

  # A type that does not cast to the model's is named.
  other = str(tmp_path / 'ints.ckpt')
  with tf.Graph().as_default():
    ints = [tf.get_variable(name, initializer=np.zeros(shape, np.int32))
            for name, shape, _ in model]
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      tf.train.Saver(ints).save(sess, other, write_meta_graph=False)
  with tf.Graph().as_default():
    variables = _model_variables(options)
    with pytest.raises(config.ConfigError, match=(
        'checkpoint %s does not fit the model: .* is int32 in the checkpoint, '
        'float32 in the model' % other)):
      checkpoint_init.make_init_plan(other, variables)


def test_an_archive_or_another_file_is_no_checkpoint(tmp_path):
  """A model zoo download passed as it is: TensorFlow's 'not an sstable
  (bad magic number) ... use a different restore operator' after the
  graph was built, naming neither the flag nor what to do."""
  archive = tmp_path / 'deeplabv3_mnv2_pascal_train_aug_2018_01_29.tar.gz'
  archive.write_bytes(b'\x1f\x8b\x08\x00 not really')
  text = tmp_path / 'notes.txt'
  text.write_text('not a checkpoint\n')
  for resolve in (checkpoint_init.resolve_checkpoint,
                  predictor_lib.resolve_checkpoint):
    with pytest.raises(config.ConfigError, match=(
        '%s is an archive \\(a model zoo download\\?\\): extract it'
        % archive)):
      resolve(str(archive))
    with pytest.raises(config.ConfigError, match=(
        '%s is a file, not a checkpoint: pass a checkpoint prefix' % text)):
      resolve(str(text))


def test_backbone_shape_mismatch_is_an_error(tmp_path):
  prefix = str(tmp_path / 'other.ckpt')
  _write_checkpoint(prefix, [('MobilenetV2/Conv/weights', [3, 3, 3, 32]),
                             ('aspp0/weights', [1, 1, 80, 256])])
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options())
    with pytest.raises(config.ConfigError, match=(
        r'does not fit the model: 1 variables have another shape '
        r'\(MobilenetV2/Conv/weights is \[3, 3, 3, 32\] in the checkpoint, '
        r'\[3, 3, 3, 8\] in the model\)')):
      checkpoint_init.make_init_plan(prefix, variables,
                                     last_layer_scopes=EXTRA_SCOPES)


def test_checkpoint_of_another_network_is_an_error(tmp_path):
  prefix = str(tmp_path / 'resnet.ckpt')
  _write_checkpoint(prefix, [('resnet_v1_50/conv1/weights', [7, 7, 3, 64])])
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options())
    with pytest.raises(config.ConfigError,
                       match='holds none of the model.s .* variables'):
      checkpoint_init.make_init_plan(prefix, variables)


def test_checkpoint_lacking_most_variables_is_refused_unless_allowed(
    tmp_path):
  # Another network's checkpoint that happens to share the logits' names.
  prefix = str(tmp_path / 'other.ckpt')
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options())
    shared = [(v.op.name, v.shape.as_list()) for v in variables
              if v.op.name.startswith('logits/')]
  _write_checkpoint(prefix, shared + [('resnet_v1_50/conv1/weights',
                                       [7, 7, 3, 64])])
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options())
    with pytest.raises(config.ConfigError, match=(
        r'lacks %d of the %d model variables to restore \(e.g. MobilenetV2/'
        r'.*it has e.g. logits/.*another network.*'
        r'allow_partial_initial_checkpoint=true'
        % (len(variables) - len(shared), len(variables)))):
      checkpoint_init.make_init_plan(prefix, variables)
    plan = checkpoint_init.make_init_plan(prefix, variables,
                                          allow_partial=True)
  assert plan.restored == sorted(n for n, _ in shared)
  assert len(plan.missing) == len(variables) - len(shared)


def test_quantisation_ranges_are_left_out_with_a_hint(tmp_path):
  """A checkpoint of quantisation-aware training (the model zoo's 8-bit
  rows) holds each layer's ranges beside its variables: the float network
  restores from it, and the log says what was left out."""
  prefix = str(tmp_path / 'model.ckpt')
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options())
    model = [(v.op.name, v.shape.as_list()) for v in variables]
  ranges = [('MobilenetV2/Conv/%s_quant/%s' % (kind, end), [])
            for kind in ('weights', 'act') for end in ('min', 'max')]
  _write_checkpoint(prefix, model + ranges)
  with tf.Graph().as_default():
    variables = _model_variables(tt.tiny_model_options())
    plan = checkpoint_init.make_init_plan(prefix, variables)
  assert plan.restored == sorted(n for n, _ in model)
  assert not plan.missing and plan.unused == 4
  text = '\n'.join(map(str, plan.summary_lines()))
  assert ('hint: the checkpoint holds 4 quantisation ranges (e.g. '
          'MobilenetV2/Conv/act_quant/max, MobilenetV2/Conv/act_quant/min) '
          'of quantisation-aware training') in text, text


def test_resolve_checkpoint_prefix_directory_and_missing(tmp_path,
                                                         checkpoint_21,
                                                         caplog):
  prefix, _ = checkpoint_21
  assert checkpoint_init.resolve_checkpoint(prefix) == prefix
  assert checkpoint_init.resolve_checkpoint(os.path.dirname(prefix)) == prefix
  # A folder holding model.ckpt and no state file, as a model zoo tarball
  # does: deeplab-eval, -vis and -export found 'no checkpoint' there. The
  # usual layout: no warning.
  zoo = tmp_path / 'zoo'
  zoo.mkdir()
  for suffix in ('.index', '.data-00000-of-00001'):
    shutil.copy(prefix + suffix, zoo / ('model.ckpt' + suffix))
  with caplog.at_level('INFO'):
    assert predictor_lib.resolve_checkpoint(str(zoo)) == str(
        zoo / 'model.ckpt')
    assert checkpoint_init.resolve_checkpoint(str(zoo)) == str(
        zoo / 'model.ckpt')
  assert 'using %s, the only checkpoint in ' % (zoo / 'model.ckpt') in (
      caplog.text)
  assert not [r for r in caplog.records if r.levelname == 'WARNING'
              and 'the only checkpoint' in r.getMessage()]
  # A state file left empty beside the checkpoint: TensorFlow's ValueError.
  folder = tmp_path / 'emptied'
  folder.mkdir()
  for path in glob.glob(prefix + '.*'):
    shutil.copy(path, folder / os.path.basename(path).replace(
        'model.ckpt', 'model.ckpt-5'))
  (folder / 'checkpoint').write_bytes(b'')
  assert checkpoint_init.resolve_checkpoint(str(folder)) == str(
      folder / 'model.ckpt-5')
  # One of its files, copied from a listing: it was read as a checkpoint
  # (none of the model's variables, or 'not an sstable').
  files = glob.glob(prefix + '.*')
  assert {f[len(prefix):] for f in files} >= {
      '.index', '.data-00000-of-00001'}
  for path in files:
    assert checkpoint_init.resolve_checkpoint(path) == prefix
    assert predictor_lib.resolve_checkpoint(path) == prefix
  with pytest.raises(config.ConfigError, match='no checkpoint there'):
    checkpoint_init.resolve_checkpoint(str(tmp_path / 'nope.ckpt'))
  with pytest.raises(config.ConfigError,
                     match='holds no checkpoint to read'):
    checkpoint_init.resolve_checkpoint(str(tmp_path))
  # A state file naming a checkpoint that is gone: it said there was no
  # state file naming one.
  stale = tmp_path / 'stale'
  stale.mkdir()
  (stale / 'checkpoint').write_text(
      'model_checkpoint_path: "model.ckpt-99"\n'
      'all_model_checkpoint_paths: "model.ckpt-99"\n')
  with pytest.raises(config.ConfigError) as e:
    checkpoint_init.resolve_checkpoint(str(stale))
  assert ('tf_initial_checkpoint=%s holds no checkpoint to read (its '
          '"checkpoint" state file names %s, whose files are gone, no '
          'complete model.ckpt-N, and no .index files)' % (
              stale, stale / 'model.ckpt-99')) in e.value.render()
