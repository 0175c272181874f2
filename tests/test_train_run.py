"""The run loop with a toy model: NaN guard, stop reasons, resume, the lock,
the JSON result; and the loss falling on sample images (slow)."""
import json
import os
import shutil
import socket

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.runtime import hooks as hooks_lib
from deeplab_train.runtime import lock as lock_lib
from deeplab_train.runtime import result as result_lib
from deeplab_train.runtime import run as run_lib

import timeouts
import train_testing as tt


def _train(logdir, steps=4, input_fn=None, model_fn=None, options=None,
           num_classes=tt.NUM_CLASSES, preprocess_options=None, dataset=None,
           **run_flags):
  images, labels = tt.synthetic_batch(2, 33)
  train = options or config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=False, base_learning_rate=0.01,
      training_number_of_steps=steps).validate()
  run_flags.setdefault('save_interval_secs', 0)
  run_flags.setdefault('save_summaries_secs', 0)
  run_flags.setdefault('log_steps', 1)
  runs = config.RunOptions(train_logdir=str(logdir), **run_flags).validate()
  return run_lib.train(
      tt.tiny_model_options(num_classes), train, runs, ignore_label=255,
      input_fn=input_fn or tt.constant_input_fn(images, labels),
      model_fn=model_fn or tt.toy_model_fn(), last_layer_scopes=['logits'],
      handle_signals=False, preprocess_options=preprocess_options,
      dataset=dataset)


def _nan_from_step(step):
  """input_fn whose images turn NaN once the global step reaches `step`."""
  images, labels = tt.synthetic_batch(2, 33)

  def input_fn():
    bad = tf.train.get_global_step() >= step
    image = tf.where(bad, tf.fill(images.shape, np.nan), tf.constant(images))
    return {'image': image, 'label': tf.constant(labels)}
  return input_fn


def _all_finite(prefix):
  return all(np.all(np.isfinite(v)) for v in tt.read_checkpoint(prefix).values()
             if np.issubdtype(np.asarray(v).dtype, np.floating))


def test_nan_loss_stops_without_saving_the_nan_step(tmp_path):
  result = _train(tmp_path, steps=50, input_fn=_nan_from_step(5),
                  save_interval_steps=2)
  assert result.status == 'non_finite_loss' and result.exit_code == 3
  assert result.global_step == 6  # the update of step 5 -> 6 went bad
  # Saved at 0, 2, 4; the periodic save due at 6 and the final save at end()
  # were both skipped.
  assert tt.checkpoint_steps(tmp_path) == [0, 2, 4]
  assert result.checkpoint.endswith('model.ckpt-4')
  assert _all_finite(result.checkpoint)
  # The library names the option; a command shows it as its flag.
  assert result.message.endswith(
      'Lower base_learning_rate or check the input labels.'), result.message
  assert app.user_message(result.detail).endswith(
      'Lower --base_learning_rate or check the input labels.')


def test_nan_weights_with_a_finite_loss_are_caught(tmp_path):
  # From step 3 on, the logits' gradient is NaN while their value (and so
  # the loss) stays finite: only the check of the updated weights sees it.
  def poison(logits):
    bad = tf.train.get_global_step() >= 3

    @tf.custom_gradient
    def nan_gradient(x):
      def grad(dy):
        return dy * tf.where(bad, np.float32(np.nan), np.float32(1.0))
      return tf.identity(x), grad
    return nan_gradient(logits)
  result = _train(tmp_path, steps=50, model_fn=tt.toy_model_fn(extra=poison),
                  save_interval_steps=2)
  assert result.status == 'non_finite_loss'
  assert result.global_step == 4 and np.isfinite(result.loss)
  assert tt.checkpoint_steps(tmp_path) == [0, 2]
  assert _all_finite(result.checkpoint)
  # fp16: the loss scale skips such steps, halving the scale down to 1;
  # they were skipped there for ever too, without a word (exit 0 at the
  # time budget, else never). Ten in a row at 1 end the run.
  fp16 = tmp_path / 'fp16'
  result = _train(fp16, steps=50, model_fn=tt.toy_model_fn(extra=poison),
                  save_interval_steps=2, max_run_seconds=timeouts.HANG_SECONDS,
                  options=config.TrainOptions(
                      train_batch_size=2, fine_tune_batch_norm=False,
                      base_learning_rate=0.01, training_number_of_steps=50,
                      mixed_precision='fp16').validate())
  assert result.status == 'non_finite_loss' and result.exit_code == 3
  assert result.global_step == 3 and np.isfinite(result.loss)
  assert tt.checkpoint_steps(fp16) == [0, 2]


def test_finish_resume_nothing_to_do_and_num_steps_more(tmp_path):
  first = _train(tmp_path, steps=3)
  assert (first.status, first.stop_reason, first.global_step) == (
      'ok', 'finished', 3)
  assert first.checkpoint.endswith('model.ckpt-3') and first.loss > 0
  saved = tt.read_checkpoint(first.checkpoint)
  # What an exact resume needs: step, momentum slots, BN statistics.
  assert saved['global_step'] == 3
  assert any(n.endswith('/Momentum') for n in saved)
  assert 'features/BatchNorm/moving_mean' in saved

  again = _train(tmp_path, steps=3)
  assert (again.status, again.stop_reason, again.global_step) == (
      'ok', 'nothing_to_do', 3)
  assert again.exit_code == 0

  more = _train(tmp_path, steps=100, num_steps_more=2)
  assert (more.stop_reason, more.global_step) == ('num_steps_more', 5)
  assert tt.latest_step(tmp_path) == 5

  # Another optimizer's slots are not in the checkpoint: before, a
  # TensorFlow traceback of 250 lines (exit 1). The run config is left as it
  # was (the run wrote its options there, and the next run was checked
  # against them).
  adam = _train(tmp_path, options=config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=False, optimizer='adam',
      training_number_of_steps=100).validate(),
      preprocess_options=config.PreprocessOptions(), dataset={'name': 's'})
  assert not (tmp_path / config.RUN_CONFIG_FILENAME).exists()
  assert (adam.status, adam.exit_code) == ('bad_input', 2)
  assert adam.message.startswith(
      'the last checkpoint in %s lacks ' % tmp_path)
  assert adam.message.endswith(
      "/Adam, a variable of this run's graph: it was trained with other "
      'options (another optimizer); train on with those, or start a new '
      'train_logdir')
  # A layer the checkpoint lacks is another model flag's, not the
  # optimizer's.
  assert run_lib._OPTIMIZER_SLOT.search('decoder/feature_projection0/'  # pylint: disable=protected-access
                                        'BatchNorm/beta') is None
  assert run_lib._OPTIMIZER_SLOT.search('aspp0/weights/Momentum')  # pylint: disable=protected-access
  assert tt.latest_step(tmp_path) == 5


def test_time_budget_stops_with_a_checkpoint(tmp_path):
  result = _train(tmp_path, steps=1000, max_run_seconds=1e-3)
  assert (result.status, result.stop_reason) == ('ok', 'time_budget')
  assert result.global_step >= 1
  assert tt.latest_step(tmp_path) == result.global_step


def test_summaries_hold_losses_learning_rate_histograms_and_images(tmp_path):
  train = config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=False, base_learning_rate=0.01,
      training_number_of_steps=2, save_summaries_images=True).validate()
  result = _train(tmp_path, options=train, save_summaries_secs=1000)
  assert result.status == 'ok'
  tags = set()
  for name in os.listdir(tmp_path):
    if name.startswith('events.out.tfevents'):
      for event in tf.train.summary_iterator(str(tmp_path / name)):
        tags.update(v.tag for v in event.summary.value)
  assert {'losses/total_loss', 'losses/data_loss',
          'losses/regularization_loss', 'learning_rate',
          'variables/features/weights', 'variables/logits/semantic/biases',
          'variables/features/BatchNorm/moving_mean'} <= tags
  assert any(t.startswith('samples/image') for t in tags)
  assert any(t.startswith('samples/semantic') for t in tags)


def _events_by_kind(logdir):
  """{events file name: {kind of record: count}} of a logdir."""
  found = {}
  for name in sorted(os.listdir(logdir)):
    if name.startswith('events.out.tfevents'):
      kinds = found.setdefault(name, {})
      for event in tf.train.summary_iterator(os.path.join(logdir, name)):
        kind = event.WhichOneof('what')
        kinds[kind] = kinds.get(kind, 0) + 1
  return found


def test_the_graph_goes_into_the_first_runs_events_file_only(tmp_path):
  """A resumed run wrote the graph and meta graph again (twice the size of
  a checkpoint's .meta, on every resume: a cron job's disk filled with
  copies), and a new run wrote the graph twice. A run starting in the same
  second as the one before overwrote its events file."""
  assert _train(tmp_path, steps=2, save_summaries_secs=1000).status == 'ok'
  first = _events_by_kind(tmp_path)
  assert len(first) == 1
  assert list(first.values())[0].get('graph_def') == 1
  assert list(first.values())[0].get('meta_graph_def') == 1
  resumed = _train(tmp_path, steps=4, save_summaries_secs=1000)
  assert (resumed.status, resumed.global_step) == ('ok', 4)
  files = _events_by_kind(tmp_path)
  (second,) = [kinds for name, kinds in files.items() if name not in first]
  assert 'graph_def' not in second and 'meta_graph_def' not in second
  assert second.get('summary', 0) >= 1   # the resumed run's summaries


def test_events_files_of_runs_in_one_second_are_kept_apart(tmp_path):
  """TensorFlow names an events file by its second and host: a run starting
  in the second the one before started truncated the first one's file."""
  for step in (1, 2):
    with tf.Graph().as_default():
      events = hooks_lib.EventsFile(str(tmp_path), None, with_graph=False)
      events.writer.add_summary(tf.Summary(value=[tf.Summary.Value(
          tag='loss', simple_value=float(step))]), step)
      events.close()
  steps = sorted(event.step for name in os.listdir(tmp_path)
                 for event in tf.train.summary_iterator(str(tmp_path / name))
                 if event.summary.value)
  assert steps == [1, 2]


def test_lock_refuses_a_second_holder_and_names_the_pid(tmp_path):
  with lock_lib.LogdirLock(str(tmp_path)):
    with pytest.raises(lock_lib.LogdirLockedError,
                       match='pid %d on host' % os.getpid()):
      lock_lib.LogdirLock(str(tmp_path)).acquire()
    result = _train(tmp_path)
    assert result.status == 'locked' and result.exit_code == 75
    assert 'pid %d' % os.getpid() in result.message
  assert not os.path.exists(tmp_path / lock_lib.LOCK_FILENAME)


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  path = tmp_path / lock_lib.LOCK_FILENAME
  path.write_text(json.dumps({'pid': 2**22 + 12345,
                              'host': socket.gethostname()}))
  with lock_lib.LogdirLock(str(tmp_path)):
    holder = json.loads(path.read_text())
    assert holder['pid'] == os.getpid()
  assert 'stale lock' in caplog.text and str(2**22 + 12345) in caplog.text


def test_result_json_is_written_atomically(tmp_path):
  result = result_lib.RunResult('ok', 'finished', 7, 0.5, '/x/model.ckpt-7', 1.25)
  path = tmp_path / 'out' / 'result.json'
  result_lib.write_result_json(result, str(path))
  assert json.loads(path.read_text()) == {
      'event': 'result', 'status': 'ok', 'stop_reason': 'finished',
      'global_step': 7, 'loss': 0.5, 'checkpoint': '/x/model.ckpt-7',
      'seconds': 1.25, 'message': ''}
  assert os.listdir(path.parent) == ['result.json']
  # JSON has no NaN: a non-finite loss is reported as a string.
  nan = result_lib.RunResult('non_finite_loss', 'non_finite_loss', 3,
                          float('nan'))
  assert json.loads(nan.to_json())['loss'] == 'nan'


def test_bad_labels_met_while_training_are_bad_input(tmp_path):
  import dataclasses  # pylint: disable=g-import-not-at-top
  from deeplab_train.train import inputs  # pylint: disable=g-import-not-at-top
  info = tt.make_tfrecords(tmp_path / 'records', count=1)
  # Records with ids up to 4 read as a 3-class dataset.
  info = dataclasses.replace(info, num_classes=3)
  preprocess = config.PreprocessOptions(crop_size=(33, 33))
  result = _train(tmp_path / 'log', model_fn=tt.toy_model_fn(3), num_classes=3,
                  input_fn=inputs.make_input_fn(
                      str(tmp_path / 'records'), 'train', info, preprocess,
                      2, (127.5, 127.5, 127.5)))
  assert result.status == 'bad_input' and result.exit_code == 2
  assert result.message.startswith('bad input data: label values outside '
                                   '[0, 3)')
  assert 'train_0000' in result.message


def test_cut_short_shard_is_named_with_the_record(tmp_path):
  from deeplab_train.train import inputs  # pylint: disable=g-import-not-at-top
  info = tt.make_tfrecords(tmp_path / 'records', count=3)
  shard, = (tmp_path / 'records').glob('train-*.tfrecord')
  sizes = [len(r) + 16 for r in tf.io.tf_record_iterator(str(shard))]
  # Cut inside the third record: the first two stay readable.
  data = shard.read_bytes()
  shard.write_bytes(data[:sizes[0] + sizes[1] + 20])
  preprocess = config.PreprocessOptions(crop_size=(33, 33))
  result = _train(tmp_path / 'log', steps=10, input_fn=inputs.make_input_fn(
      str(tmp_path / 'records'), 'train', info, preprocess, 2,
      (127.5, 127.5, 127.5)))
  assert (result.status, result.exit_code) == ('bad_input', 2)
  assert result.message == (
      'corrupted TFRecord input: %s: record 2 (byte offset %d) is damaged '
      'or cut short; convert the data again with deeplab-build-data'
      % (shard, sizes[0] + sizes[1]))


@pytest.mark.slow
def test_loss_falls_when_overfitting_sample_images(tmp_path):
  """The real model and input pipeline on four sample images."""
  from deeplab_train.data import datasets  # pylint: disable=g-import-not-at-top
  from deeplab_train.train import inputs  # pylint: disable=g-import-not-at-top
  info = tt.make_tfrecords(tmp_path / 'records', count=2)
  # Resize each image to fit the crop: every step sees the whole images.
  preprocess = config.PreprocessOptions(
      crop_size=(49, 49), min_resize_value=49, max_resize_value=49)
  model = tt.tiny_model_options(crop=49)
  train = config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=False,
      base_learning_rate=0.02, training_number_of_steps=40).validate()
  losses = []
  runs = config.RunOptions(train_logdir=str(tmp_path / 'log'), log_steps=1,
                           save_interval_secs=0,
                           save_summaries_secs=0).validate()
  from deeplab_train.runtime import hooks  # pylint: disable=g-import-not-at-top
  original = hooks.ProgressHook._line

  def spy(self, r, sec):
    losses.append(self.loss)
    return original(self, r, sec)
  hooks.ProgressHook._line = spy
  try:
    result = run_lib.train(
        model, train, runs, ignore_label=info.ignore_label,
        input_fn=inputs.make_input_fn(
            str(tmp_path / 'records'), 'train', datasets.load_dataset_info(
                'shapes', str(tmp_path / 'records')),
            preprocess, 2, (127.5, 127.5, 127.5), seed=1),
        handle_signals=False)
  finally:
    hooks.ProgressHook._line = original
  assert result.status == 'ok' and result.global_step == 40
  assert len(losses) == 40
  assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses


@pytest.mark.parametrize('damage', ['missing', 'garbage', 'empty',
                                    'names_gone'])
def test_lost_checkpoint_state_resumes_from_the_newest_complete_checkpoint(
    tmp_path, damage, caplog):
  assert _train(tmp_path, steps=3).global_step == 3
  state = tmp_path / 'checkpoint'
  if damage == 'missing':
    state.unlink()
  elif damage == 'garbage':
    state.write_bytes(b'\xff\x00 not a state file')
  elif damage == 'empty':
    state.write_bytes(b'')
  else:  # names a checkpoint whose files were deleted
    state.write_text('model_checkpoint_path: "%s"\n' % (tmp_path /
                                                        'model.ckpt-9'))
  # A checkpoint missing its data file is not complete: not resumed from.
  (tmp_path / 'model.ckpt-7.index').write_bytes(b'')
  first = (tmp_path / 'model.ckpt-0.index').read_bytes()
  with caplog.at_level('WARNING'):
    result = _train(tmp_path, steps=5)
  assert result.status == 'ok' and result.global_step == 5
  assert sorted(int(p.name[len('model.ckpt-'):-len('.index')])
                for p in tmp_path.glob('model.ckpt-*.index')) == [0, 3, 5, 7]
  # Resumed at 3 (no new step-0 checkpoint over the old one).
  assert (tmp_path / 'model.ckpt-0.index').read_bytes() == first
  assert 'resuming from the newest complete checkpoint on disk' in caplog.text
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith('model.ckpt-5')


def test_a_state_file_repaired_under_a_relative_logdir_names_its_own_files(
    tmp_path, monkeypatch):
  """The repair wrote absolute paths; under a relative --train_logdir the
  next save made them relative again ('../model.ckpt-0'), and the saver's
  rotation deleted those files in the folder above the logdir."""
  parent = tmp_path / 'par'
  (parent / 'run').mkdir(parents=True)
  monkeypatch.chdir(parent)
  assert _train('run', steps=3).global_step == 3
  (parent / 'run' / 'checkpoint').write_bytes(b'')  # a crash left it empty
  for ext in ('index', 'meta', 'data-00000-of-00001'):
    (parent / ('model.ckpt-0.' + ext)).write_text('not ours')
  assert _train('run', steps=5, keep_checkpoint_max=1).global_step == 5
  assert sorted(p.name for p in parent.glob('model.ckpt-0.*')) == [
      'model.ckpt-0.data-00000-of-00001', 'model.ckpt-0.index',
      'model.ckpt-0.meta']
  state = (parent / 'run' / 'checkpoint').read_text()
  assert '..' not in state, state
  # Rotation removed the logdir's own older ones, keeping the last one.
  assert sorted(p.name for p in (parent / 'run').glob('*.index')) == [
      'model.ckpt-5.index']


def test_a_lower_keep_count_on_resume_is_kept_to(tmp_path):
  """A run resumed with a lower keep_checkpoint_max than the run before
  recovered the longer list, and the saver dropped one checkpoint a save:
  the folder kept 4 where 2 were asked for, for good."""
  assert _train(tmp_path, steps=4, save_interval_steps=1,
                keep_checkpoint_max=4).global_step == 4
  indexes = lambda: sorted(p.name for p in tmp_path.glob('*.index'))
  assert indexes() == ['model.ckpt-%d.index' % i for i in (1, 2, 3, 4)]
  assert _train(tmp_path, steps=5, save_interval_steps=1,
                keep_checkpoint_max=2).global_step == 5
  assert indexes() == ['model.ckpt-4.index', 'model.ckpt-5.index']
  assert not list(tmp_path.glob('model.ckpt-[123].*'))
  state = tf.train.get_checkpoint_state(str(tmp_path))
  assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
      'model.ckpt-4', 'model.ckpt-5']


def test_a_damaged_state_file_without_checkpoints_starts_at_step_0(
    tmp_path, caplog):
  """An empty state file and no checkpoint (a crash during the first save):
  the run stopped with TensorFlow's ValueError and a traceback, every
  time it was started again."""
  (tmp_path / 'checkpoint').write_bytes(b'')
  with caplog.at_level('WARNING'):
    result = _train(tmp_path, steps=2)
  assert result.status == 'ok' and result.global_step == 2
  assert ('%s cannot be read (empty, or not a state file), and %s holds no '
          'checkpoint: starting at step 0' % (tmp_path / 'checkpoint',
                                              tmp_path)) in caplog.text
  assert (tmp_path / 'checkpoint.damaged').read_bytes() == b''
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith('model.ckpt-2')


def test_a_copied_logdir_resumes_from_its_own_checkpoints(tmp_path, caplog):
  """The original writes absolute paths in the state file: a logdir copied
  from another folder resumed from that folder's checkpoint, and the saver
  then deleted that folder's checkpoints (kept only --keep_checkpoint_max
  of the list). The copy's own files are used now, the source left alone."""
  source, copy = tmp_path / 'source', tmp_path / 'copy'
  _train(source, steps=3, save_interval_steps=1)
  shutil.copytree(source, copy)
  steps = sorted(p.name for p in source.glob('model.ckpt-*.index'))
  state = 'model_checkpoint_path: "%s/model.ckpt-3"\n' % source + ''.join(
      'all_model_checkpoint_paths: "%s/%s"\n' % (source, name[:-6])
      for name in steps)
  (copy / 'checkpoint').write_text(state)
  before = sorted(os.listdir(source))
  with caplog.at_level('WARNING'):
    result = _train(copy, steps=5, save_interval_steps=1,
                    keep_checkpoint_max=1)
  assert result.status == 'ok' and result.global_step == 5
  assert 'names %s/model.ckpt-3, outside this folder' % source in caplog.text
  assert sorted(os.listdir(source)) == before
  assert tf.train.latest_checkpoint(str(copy)) == str(copy / 'model.ckpt-5')
  # Its latest in the folder, older ones in the source (the original's run
  # in a copy leaves that): the source's were deleted in turn.
  mixed = tmp_path / 'mixed'
  shutil.copytree(source, mixed)
  (mixed / 'checkpoint').write_text(
      'model_checkpoint_path: "%s/model.ckpt-3"\n' % mixed + ''.join(
          'all_model_checkpoint_paths: "%s/%s"\n' % (source, name[:-6])
          for name in steps[:-1]) +
      'all_model_checkpoint_paths: "%s/model.ckpt-3"\n' % mixed)
  caplog.clear()
  with caplog.at_level('WARNING'):
    result = _train(mixed, steps=6, save_interval_steps=1,
                    keep_checkpoint_max=1)
  assert result.status == 'ok' and result.global_step == 6
  assert ('lists checkpoints outside this folder (e.g. %s/%s), which the '
          'saver would delete in turn' % (source, steps[0][:-6])
          ) in caplog.text
  assert sorted(os.listdir(source)) == before
  # A state file naming another folder, beside no checkpoint of its own.
  empty = tmp_path / 'empty'
  empty.mkdir()
  (empty / 'checkpoint').write_text(state)
  result = _train(empty, steps=6)
  assert result.status == 'bad_input'
  assert ('outside this folder, and the folder holds no checkpoint of its '
          'own') in result.message


def test_resuming_on_a_dataset_of_another_class_count_says_so(tmp_path):
  """The original's logdir (no deeplab_config.json) resumed with records
  of another class count blamed 'other model flags (--model_variant,
  --depth_multiplier, ...)' and never the dataset."""
  prefix = str(tmp_path / 'model.ckpt-3')
  with tf.Graph().as_default():
    tf.get_variable('logits/semantic/weights', [1, 1, 8, 21])
    tf.get_variable('logits/semantic/biases', [21])
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      tf.train.Saver().save(session, prefix, write_meta_graph=False)
  graph = tf.Graph()
  with graph.as_default():
    tf.get_variable('logits/semantic/weights', [1, 1, 8, 5])
    tf.get_variable('logits/semantic/biases', [5])
  with pytest.raises(config.ConfigError) as error:
    run_lib._check_shapes_resumable(prefix, graph, str(tmp_path))
  assert str(error.value) == (
      'the last checkpoint in %s (model.ckpt-3) has logits of 21 classes, '
      'this run 5: it was trained on another dataset. Resume it on that '
      'one, or fine-tune it on this one in a new train_logdir with '
      'tf_initial_checkpoint=%s initialize_last_layer=false'
      % (tmp_path, prefix))


def _truncate(path):
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])


def test_cut_short_latest_checkpoint_resumes_from_the_one_before(tmp_path,
                                                                caplog):
  _train(tmp_path, steps=2, save_interval_steps=1)
  first = (tmp_path / 'model.ckpt-1.index').read_bytes()
  _truncate(tmp_path / 'model.ckpt-2.data-00000-of-00001')
  with caplog.at_level('WARNING'):
    result = _train(tmp_path, steps=4)
  assert result.status == 'ok' and result.global_step == 4
  assert 'model.ckpt-2, which cannot be read' in caplog.text
  assert (tmp_path / 'model.ckpt-1.index').read_bytes() == first


def test_no_readable_checkpoint_is_bad_input_not_a_fresh_start(tmp_path):
  _train(tmp_path, steps=2)  # model.ckpt-0 and -2
  for step in (0, 2):
    _truncate(tmp_path / ('model.ckpt-%d.data-00000-of-00001' % step))
  result = _train(tmp_path, steps=4)
  assert (result.status, result.exit_code) == ('bad_input', 2)
  assert 'cannot be read' in result.message
  assert tt.latest_step(tmp_path) == 2  # nothing was written over them


def test_stop_follows_the_step_read_after_the_update():
  """Other replicas' updates can move the global step by more than one
  while a step runs; the run stops at the first step that reaches the last
  one, not one step later (in synchronous training that extra step waits
  for a token that never comes)."""
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    # Two updates per step, as when another replica's update lands too.
    train_op = tf.assign_add(global_step, 2)
    with tf.control_dependencies([train_op]):
      step_after = tf.identity(global_step.read_value())

    def steps_run(hook):
      runs = 0
      with tf.train.MonitoredSession(hooks=[hook]) as sess:
        while not sess.should_stop():
          sess.run(train_op)
          runs += 1
      return runs

    assert steps_run(hooks_lib.LastStepHook(step_after, 4)) == 2
    assert steps_run(hooks_lib.LastStepHook(step_after, 5)) == 3
    # (TensorFlow's StopAtStepHook is no reference here: it fetches the step
    # in the same run as the update, unordered with it, so it reads either
    # value; it ran 3 steps here at 4 most of the time, and 2 in one CI run.)


def test_a_trace_is_written_whole_or_not_at_all(tmp_path, monkeypatch,
                                                caplog):
  """--profile_logdir's traces: TensorFlow's hook wrote timeline-STEP.json
  under its final name, and a run killed with kill -9 meanwhile left it
  empty. Here: a trace that failed leaves nothing, no temp either; one that
  cannot be written (a folder in its way; TensorFlow's hook then ended the
  training with a traceback) is logged and training goes on."""
  from tensorflow.python.client import timeline  # pylint: disable=g-import-not-at-top

  def traces_of_4_steps(folder):
    folder.mkdir(exist_ok=True)
    with tf.Graph().as_default():
      global_step = tf.train.get_or_create_global_step()
      train_op = tf.assign_add(global_step, 1)
      hook = hooks_lib.ChromeTraceHook(save_steps=2, output_dir=str(folder))
      with tf.train.MonitoredSession(hooks=[hook]) as sess:
        for _ in range(4):
          sess.run(train_op)
    return sorted(n for n in os.listdir(folder) if 'timeline' in n)

  assert traces_of_4_steps(tmp_path / 'a') == ['timeline-2.json',
                                               'timeline-4.json']
  with open(tmp_path / 'a' / 'timeline-4.json') as f:
    assert json.load(f)['traceEvents']

  def broken(self, **kwargs):
    raise RuntimeError('killed while the trace was generated')
  with monkeypatch.context() as patch:
    patch.setattr(timeline.Timeline, 'generate_chrome_trace_format', broken)
    with pytest.raises(RuntimeError, match='killed while'):
      traces_of_4_steps(tmp_path / 'b')
  assert not [n for n in os.listdir(tmp_path / 'b') if 'timeline' in n]

  # A folder in the way of the first (as a full disk): no trace, a
  # warning, the steps all run.
  (tmp_path / 'c').mkdir()
  (tmp_path / 'c' / 'timeline-2.json').mkdir()
  with caplog.at_level('WARNING'):
    assert traces_of_4_steps(tmp_path / 'c') == ['timeline-2.json',
                                                 'timeline-4.json']
  assert os.path.isdir(tmp_path / 'c' / 'timeline-2.json')
  assert 'the trace of step 2 was not written' in caplog.text


def test_progress_logs_a_global_step_once():
  """In a synchronous cluster two steps of a fast worker can make one update
  of the global step: each step was logged twice."""
  with tf.Graph().as_default():
    ticks = tf.Variable(0, dtype=tf.int64)
    tick = tf.assign_add(ticks, 1)
    # The global step moves at every second step only.
    with tf.control_dependencies([tick]):
      step_after = tf.identity(tick // 2)
    lines = []
    progress = hooks_lib.ProgressHook(
        {'loss': tf.constant(1.0), 'learning_rate': tf.constant(0.1),
         'step': step_after}, batch_size=2, last_step=3, every_n_steps=1,
        log_fn=lines.append)
    with tf.train.MonitoredSession(hooks=[progress]) as sess:
      for _ in range(6):
        sess.run(tick.op)
  assert [line.split()[1] for line in lines] == ['0/3', '1/3', '2/3', '3/3']
  assert progress.step == 3


def test_final_checkpoint_is_named_by_the_step_it_holds(tmp_path):
  """In an asynchronous cluster another worker may finish a step while the
  chief writes its last checkpoint (seen in a cluster test: model.ckpt-20
  holding global step 21). Here the saver adds that step during the first
  save at the end; the last checkpoint must still be named by its step."""
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    tf.get_variable('w', [2], initializer=tf.zeros_initializer())
    other_worker_step = tf.assign_add(global_step, 1)
    saver = tf.train.Saver()
    saves = []

    class RacingSaver:
      def __getattr__(self, name):  # the rotation's, the saver's own
        return getattr(saver, name)

      def export_meta_graph(self, filename):
        return saver.export_meta_graph(filename)

      def save(self, sess, prefix, global_step, write_meta_graph):
        if len(saves) == 1:  # the first save at the end
          sess.run(other_worker_step)
        saves.append(global_step)
        return saver.save(sess, prefix, global_step=global_step,
                          write_meta_graph=write_meta_graph)

    hook = hooks_lib.CheckpointHook(RacingSaver(), str(tmp_path), global_step,
                                    global_step.read_value())
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      hook.after_create_session(sess, None)   # writes model.ckpt-0
      global_step.load(5, sess)
      hook.end(sess)
  assert saves == [0, 5, 6]
  assert hook.last_checkpoint == str(tmp_path / 'model.ckpt-6')
  assert int(tt.read_checkpoint(hook.last_checkpoint)['global_step']) == 6


class _Killed(BaseException):
  """Stands for a SIGKILL: nothing after it runs."""


def test_the_state_file_never_names_a_checkpoint_without_its_meta(
    tmp_path, monkeypatch):
  """TensorFlow's Saver updates the `checkpoint` state file before it
  writes the .meta; a run killed in between (8 of 9 kills within 0.8 s of
  a save, in stop 60's crash audit) left a latest checkpoint that
  tf.train.import_meta_graph cannot load. Killed right after the state
  file here, the checkpoint it names has its meta graph."""
  from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-import-not-at-top
  update_state = checkpoint_management.update_checkpoint_state_internal

  def killed_after_the_state_file(*args, **kwargs):
    update_state(*args, **kwargs)
    raise _Killed()
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    tf.get_variable('w', [2], initializer=tf.ones_initializer())
    hook = hooks_lib.CheckpointHook(tf.train.Saver(), str(tmp_path),
                                    global_step, global_step.read_value())
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      monkeypatch.setattr(checkpoint_management,
                          'update_checkpoint_state_internal',
                          killed_after_the_state_file)
      with pytest.raises(_Killed):
        hook.after_create_session(sess, None)   # saves model.ckpt-0
  latest = tf.train.latest_checkpoint(str(tmp_path))
  assert latest == str(tmp_path / 'model.ckpt-0')
  with tf.Graph().as_default():
    restorer = tf.train.import_meta_graph(latest + '.meta')
    with tf.Session() as sess:
      restorer.restore(sess, latest)
      w, = [v for v in tf.global_variables() if v.op.name == 'w']
      assert sess.run(w).tolist() == [1.0, 1.0]


def test_what_killed_saves_left_is_removed_on_resume(tmp_path, caplog):
  """A kill during a save leaves TensorFlow's temp files (name + '.tmp' +
  a uuid's hex), the saver's `_temp` folder, or files of a checkpoint
  that never got its index; the next run on the logdir removes them and
  nothing else."""
  assert _train(tmp_path, steps=3).global_step == 3
  uuid = '0123456789abcdef0123456789abcdef'
  leftovers = ['checkpoint.tmp' + uuid, 'model.ckpt-4.meta.tmp' + uuid,
               'model.ckpt-4_temp', 'model.ckpt-6.meta',
               'model.ckpt-6.data-00000-of-00001']
  for name in leftovers:
    if name.endswith('_temp'):
      (tmp_path / name).mkdir()
      (tmp_path / name / 'part-00000-of-00001.index').write_bytes(b'x')
    else:
      (tmp_path / name).write_bytes(b'x')
  kept = ['notes.tmp' + uuid, 'model.ckpt-3.meta', 'model.ckpt-3.index']
  (tmp_path / kept[0]).write_bytes(b'x')
  # The checkpoint pins (hard links) of a killed and of a live reader.
  pins = ['.model.ckpt-2.pin.tmp-%d@%s' % (pid, socket.gethostname())
          for pid in (tt.dead_pid(), os.getppid())]
  for pin in pins:
    (tmp_path / pin).mkdir()
    (tmp_path / pin / 'model.ckpt-2.index').write_bytes(b'x')
  with caplog.at_level('INFO'):
    assert _train(tmp_path, steps=4).global_step == 4
  names = set(os.listdir(tmp_path))
  assert not names & set(leftovers + pins[:1])
  assert set(kept + pins[1:]) <= names
  assert 'removed 5 files that killed saves left in %s' % tmp_path in (
      caplog.text)
  assert 'pins that killed readers left in %s: %s' % (tmp_path, pins[0]) in (
      caplog.text)


def test_stopped_at_once_before_the_session_names_the_checkpoint_it_resumes(
    monkeypatch):
  """A second SIGTERM after the graph was built, before the session: the
  result said "checkpoint": null and 'none written yet' while the logdir's
  checkpoint, from which the next run resumes, was there."""
  latest = '/runs/log/model.ckpt-77'
  spec = run_lib.RunSpec(
      model_options=tt.tiny_model_options(),
      train_options=config.TrainOptions(training_number_of_steps=100),
      run_options=config.RunOptions(train_logdir='/runs/log'),
      ignore_label=255, input_fn=None)
  run = run_lib.TrainingRun(spec)

  class SecondSignal(Exception):
    pass

  def graph_built(init):
    del init
    raise SecondSignal  # where the signal is handled: any moment now
  monkeypatch.setattr(run, '_starting_point', lambda: (latest, 77, None))
  monkeypatch.setattr(run, '_training_graph', graph_built)
  with pytest.raises(SecondSignal):
    run._train_locked()  # pylint: disable=protected-access
  result = run.stopped_now('terminated', 'signal:SIGTERM')
  assert (result.checkpoint, result.global_step) == (latest, 77)
  assert result.message == (
      'stopped at once (signal:SIGTERM again) after step 77; training '
      'resumes from the last checkpoint (%s)' % latest)
