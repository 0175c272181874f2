"""deeplab-eval end to end on a tiny split, and its failure modes."""
import csv
import errno
import glob
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

import eval_testing as et
from deeplab_train import config
from deeplab_train import restore as restore_lib
from deeplab_train.cli import app
from deeplab_train.cli import eval as eval_cli
from deeplab_train.cli import export as export_cli
from deeplab_train.data import datasets
from deeplab_train.evaluation import eval_loop
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.export import freeze


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """A tiny 'val' split and a checkpoint (with its run config) for it."""
  root = str(tmp_path_factory.mktemp('tiny_eval'))
  data = et.write_tiny_dataset(root)
  train = os.path.join(root, 'train')
  checkpoint = et.write_checkpoint(train, et.tiny_model_options())
  return {'root': root, 'data': data, 'train': train,
          'checkpoint': checkpoint}


def _numpy_miou(pairs, num_classes, ignore):
  """mIoU as the original defines it, from label/prediction arrays."""
  inter = np.zeros(num_classes)
  union = np.zeros(num_classes)
  for label, pred in pairs:
    keep = label != ignore
    for c in range(num_classes):
      inter[c] += np.sum((label == c) & (pred == c) & keep)
      union[c] += np.sum(((label == c) | (pred == c)) & keep)
  present = union > 0
  return float(np.mean(inter[present] / union[present]))


def _last_json_line(text):
  return json.loads(text.strip().splitlines()[-1])


def test_eval_matches_exported_graph(tiny, tmp_path, capsys):
  """The issue's contract: eval mIoU == mIoU of the frozen graph's labels."""
  eval_dir = str(tmp_path / 'eval')
  code = et.run_cli(eval_cli, [
      '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
      '--eval_logdir=' + eval_dir, '--eval_crop_size=41,41',
      '--eval_batch_size=3'])
  out = capsys.readouterr().out
  assert code == 0
  result = _last_json_line(out)
  assert result['status'] == 'ok'
  assert result['checkpoint'] == tiny['checkpoint']
  assert result['global_step'] == 7 and result['num_images'] == 4

  pb = str(tmp_path / 'export' / 'frozen.pb')
  assert et.run_cli(export_cli, ['--checkpoint_path=' + tiny['train'],
                                 '--export_path=' + pb,
                                 '--crop_size=41,41']) == 0
  graph_def = freeze.load_frozen_graph(pb)
  pairs = [(label, freeze.run_frozen_graph(graph_def, image)[0])
           for _, image, label in et.tiny_images()]
  want = _numpy_miou(pairs, et.NUM_CLASSES, et.IGNORE)
  assert result['miou'] == pytest.approx(want, rel=0.005)
  # Predictions are not degenerate, so the comparison means something.
  predicted = np.unique(np.concatenate([p.ravel() for _, p in pairs]))
  assert len(predicted) >= 2

  # Outputs: the JSON file equals the stdout line; table; summaries.
  with open(os.path.join(eval_dir, 'eval_result.json')) as f:
    # The file holds the result line's fields but the line's own two.
    assert json.load(f) == {k: v for k, v in result.items()
                            if k not in ('status', 'event')}
  assert 'mIoU %.4f' % result['miou'] in out
  events = glob.glob(os.path.join(eval_dir, 'events.out.tfevents.*'))
  tags = {v.tag for e in tf.train.summary_iterator(events[0])
          for v in e.summary.value}
  assert {'eval/miou_1.0_overall', 'eval/miou_1.0_class_0',
          'eval/pixel_accuracy'} <= tags


def test_evaluations_in_one_second_keep_their_summaries(tmp_path):
  """Each evaluation writes its own events file, which TensorFlow names by
  second and host: in follow mode, a second evaluation within the second
  truncated the first one's file, and its mIoU was lost to TensorBoard."""
  for step in (1, 2):
    eval_loop.write_summaries(str(tmp_path), {
        'global_step': step, 'miou': 0.5, 'pixel_accuracy': 0.75,
        'per_class_iou': {'a': 0.25}}, None)
  steps = sorted(event.step for name in os.listdir(tmp_path)
                 for event in tf.train.summary_iterator(str(tmp_path / name))
                 if event.summary.value)
  assert steps == [1, 2]


def test_confusion_matrix_files_and_confused_pairs(tiny, tmp_path, capsys):
  """The CSV counts every labelled pixel once; PNG and JSON go with it."""
  eval_dir = tmp_path / 'eval'
  code = et.run_cli(eval_cli, [
      '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
      '--eval_logdir=%s' % eval_dir, '--eval_crop_size=41,41'])
  out = capsys.readouterr().out
  assert code == 0
  result = _last_json_line(out)
  with open(eval_dir / 'confusion_matrix.csv', newline='') as f:
    rows = list(csv.reader(f))
  assert rows[0][1:] == ['bg', 'cat', 'dog'] == [r[0] for r in rows[1:]]
  counts = np.array([[int(v) for v in r[1:]] for r in rows[1:]])
  labelled = sum(int(np.sum(label != et.IGNORE))
                 for _, _, label in et.tiny_images())
  assert counts.sum() == labelled == result['num_pixels']
  with Image.open(eval_dir / 'confusion_matrix.png') as image:
    assert image.format == 'PNG' and image.width > 100
  assert not [p for p in os.listdir(eval_dir) if '.tmp-' in p]
  assert set(result['per_class_precision']) == {'bg', 'cat', 'dog'}
  assert result['per_class_recall']['cat'] == pytest.approx(
      counts[1, 1] / counts[1].sum())
  shares = counts / counts.sum(axis=1, keepdims=True)
  np.fill_diagonal(shares, 0)
  top = result['most_confused_pairs'][0]
  assert top['share'] == pytest.approx(shares.max())
  assert top['pixels'] == counts[top['ground_truth_id'], top['predicted_id']]
  assert 'most confused classes' in out and 'precision' in out


def test_eval_at_another_output_stride_than_trained(tiny, tmp_path, capsys,
                                                  caplog):
  """--output_stride changes no variable: deeplab-eval takes it over the
  saved options (the original's recipe evaluates at 8 what it trained at
  16). Before, exit 2."""
  with caplog.at_level('WARNING'):
    code = et.run_cli(eval_cli, [
        '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
        '--eval_logdir=%s' % (tmp_path / 'eval'), '--output_stride=16'])
  assert code == 0, capsys.readouterr().err
  assert 'predicting with --output_stride=16 (trained with 8)' in caplog.text
  assert 0 <= _last_json_line(capsys.readouterr().out)['miou'] <= 1


def test_metrics_are_printed_when_the_results_cannot_be_written(
    tiny, tmp_path, capsys, monkeypatch):
  # Checked writable at the start, then the disk fills up by the end.
  def full_disk(path, value):
    raise OSError(errno.ENOSPC, 'No space left on device', path)
  monkeypatch.setattr(eval_loop.atomic, 'write_json', full_disk)
  eval_dir = tmp_path / 'eval'
  code = et.run_cli(eval_cli, [
      '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
      '--eval_logdir=%s' % eval_dir, '--eval_crop_size=41,41'])
  captured = capsys.readouterr()
  assert code == 1
  result = _last_json_line(captured.out)
  assert result['status'] == 'error'
  assert result['num_images'] == 4 and 0 <= result['miou'] <= 1
  assert 'mIoU %.4f' % result['miou'] in captured.out
  message = ('cannot write the evaluation results to %s/eval_result.json: '
             'No space left on device (the metrics are printed above)'
             % eval_dir)
  assert result['message'] == message
  assert captured.err.strip().splitlines()[-1] == 'deeplab-eval: error: ' + (
      message)
  assert 'Traceback' not in captured.err
  # The confusion matrix files are not put in place without the JSON of
  # the same evaluation (before, they were the new ones).
  assert not (eval_dir / eval_loop.CONFUSION_CSV_FILENAME).exists()
  assert not (eval_dir / eval_loop.CONFUSION_PNG_FILENAME).exists()
  assert not [n for n in os.listdir(eval_dir) if '.tmp-' in n]


def test_a_split_without_a_pixel_to_score_is_bad_input(tiny):
  """Labels all the ignore label: the evaluation passed as a result (exit 0,
  mIoU nan over 0 classes, 'no pixel was misclassified')."""
  info = datasets.load_dataset_info('tiny', tiny['data'])
  inference = config.InferenceOptions()
  with predictor_lib.Predictor(et.tiny_model_options(), inference) as predictor:
    samples = list(eval_loop.iterate_split(
        tiny['data'], 'val', info, config.PreprocessOptions(crop_size=None),
        predictor.mean_pixel))
    for sample in samples:
      sample['label'] = np.full_like(sample['label'], info.ignore_label)
    with pytest.raises(eval_loop.InputDataError) as error:
      eval_loop.evaluate_checkpoint(
          predictor, tiny['checkpoint'], lambda: samples, info,
          config.EvalOptions(batch_size=2), inference)
  assert str(error.value) == (
      "split 'val' has no pixel to score: every label of its %d images is "
      "the ignore label %d; check its labels and the dataset's ignore label"
      % (len(samples), info.ignore_label))


def test_padding_is_not_scored(tiny):
  """A large fixed crop and stride padding score exactly the image pixels."""
  info = datasets.load_dataset_info('tiny', tiny['data'])
  labelled = sum(int(np.sum(label != et.IGNORE))
                 for _, _, label in et.tiny_images())
  opts = et.tiny_model_options()
  results = {}
  for crop in (None, (57, 65)):
    inference = config.InferenceOptions(crop_size=crop)
    with predictor_lib.Predictor(opts, inference) as predictor:
      samples = eval_loop.iterate_split(
          tiny['data'], 'val', info, config.PreprocessOptions(crop_size=None),
          predictor.mean_pixel)
      result, _ = eval_loop.evaluate_checkpoint(
          predictor, tiny['checkpoint'], lambda: samples, info,
          config.EvalOptions(batch_size=2), inference)
    assert result['num_pixels'] == labelled
    results[crop] = result
  assert 0 <= results[None]['miou'] <= 1


def test_run_once_without_checkpoint_fails_at_once(tmp_path, capsys):
  empty = tmp_path / 'empty_logdir'
  empty.mkdir()
  code = et.run_cli(eval_cli, ['--checkpoint_dir=%s' % empty,
                               '--dataset_dir=%s' % tmp_path])
  err = capsys.readouterr()
  assert code == 2
  assert '--checkpoint_dir=%s holds no checkpoint to read' % empty in err.err
  assert err.err.rstrip().endswith(
      'train first, or point --checkpoint_dir at the train_logdir')
  assert _last_json_line(err.out)['status'] == 'bad_input'
  # The eval folder it made is not left behind, empty, in the logdir; nor
  # the folders above one it made deeper.
  assert os.listdir(empty) == []
  assert et.run_cli(eval_cli, ['--checkpoint_dir=%s' % empty,
                               '--dataset_dir=%s' % tmp_path,
                               '--eval_logdir=%s/nest/a/eval' % empty]) == 2
  assert os.listdir(empty) == []
  code = et.run_cli(eval_cli, ['--checkpoint_dir=%s/missing/model.ckpt-1'
                               % tmp_path, '--dataset_dir=%s' % tmp_path])
  assert code == 2
  assert ('--checkpoint_dir=%s/missing/model.ckpt-1: no checkpoint there'
          % tmp_path in capsys.readouterr().err)


@pytest.mark.parametrize('extra,shown', [
    (['--eval_scales=0.75,1.0'], '--eval_scales=0.75,1.0'),
    (['--add_flipped_images'], '--eval_scales=1.0, --add_flipped_images')])
def test_an_image_pyramid_with_multi_scale_inference_is_refused(
    tiny, capsys, extra, shown):
  """Multi-scale inference runs each scale alone: --image_pyramid beside it
  was ignored without a word (the graph was the same without it)."""
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['train'],
                               '--dataset_dir=' + tiny['data'],
                               '--image_pyramid=0.5,1.0'] + extra)
  assert code == 2
  assert ('--image_pyramid=0.5,1.0 works in single-scale inference only; '
          'multi-scale inference (%s) would ignore it: leave out one or the '
          'other' % shown) in capsys.readouterr().err


def test_crop_too_small_for_the_split_is_refused_at_once(tiny, capsys):
  """A crop size too small for several images was refused at the first of
  them, with the size that one needed (33,41 here): the next run then
  failed on the next larger image. It is now refused before any work, with
  the size every image of the split fits (dataset.json's statistics)."""
  eval_dir = os.path.join(tiny['root'], 'e2')
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['train'],
                               '--dataset_dir=' + tiny['data'],
                               '--eval_logdir=' + eval_dir,
                               '--eval_crop_size=33,33'])
  err = capsys.readouterr().err
  assert code == 2
  assert ("split 'val' (its largest height and width, from %s) is 41x41 "
          '(height x width), larger than --eval_crop_size=33,33; pass '
          '--eval_crop_size=41,41 (or larger)'
          % os.path.join(tiny['data'], 'dataset.json')) in err
  assert not os.path.exists(eval_dir)


def test_crop_too_small_for_the_resized_split_is_refused_at_once(tiny,
                                                                 capsys):
  """With the resize flags (ADE20K's recipes), the crop was checked image by
  image only: refused at the first image too large, after the work before
  it (deeplab-vis drew the images before it), with the size that one
  needed. The records' sizes are now read and resized first."""
  eval_dir = os.path.join(tiny['root'], 'e_resized')
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['train'],
                               '--dataset_dir=' + tiny['data'],
                               '--eval_logdir=' + eval_dir,
                               '--min_resize_value=49',
                               '--max_resize_value=49',
                               '--eval_crop_size=45,45'])
  err = capsys.readouterr().err
  assert code == 2
  assert ("split 'val' (its largest height and width, read from its records, "
          'resized as --min_resize_value=49, --max_resize_value=49) is 49x49 '
          '(height x width), larger than --eval_crop_size=45,45; pass '
          '--eval_crop_size=49,49 (or larger)') in err
  assert not os.path.exists(eval_dir)


def test_crop_too_small_without_statistics_reads_the_records(
    tiny, tmp_path, capsys):
  """Without the split's statistics (records of an older build, or the
  original's, with no dataset.json) the first image that did not fit was
  named, with the size that one needed: following it, the next run failed
  on the next larger image. The records' sizes are read now."""
  data = tmp_path / 'data'
  shutil.copytree(tiny['data'], data)
  info = json.loads((data / 'dataset.json').read_text())
  del info['statistics']
  (data / 'dataset.json').write_text(json.dumps(info))
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['train'],
                               '--dataset_dir=%s' % data,
                               '--eval_logdir=%s' % (tmp_path / 'e2'),
                               '--eval_crop_size=33,41'])
  err = capsys.readouterr().err
  assert code == 2
  assert ("split 'val' (its largest height and width, read from its "
          'records) is 41x41 (height x width), larger than '
          '--eval_crop_size=33,41; pass --eval_crop_size=41,41') in err


def test_crop_too_small_for_an_image_is_named_with_its_size():
  """Where the split's sizes are not known (resized images, records
  without image/height), each image is checked as it comes."""
  inference = config.InferenceOptions(crop_size=(33, 41)).validate()
  with pytest.raises(config.ImageTooLargeError, match=(
      r'image img_01 is 40x27 \(height x width\), larger than '
      r'crop_size=33,41; pass crop_size=41,41')):
    predictor_lib.padded_size([(30, 20), (40, 27)], inference, 8,
                              names=[b'img_00', b'img_01'])


def _eval_on_a_copy(tiny, tmp_path, capsys, damage):
  """deeplab-eval on a copy of the tiny dataset changed by damage(folder):
  (exit code, stderr, the copy's folder)."""
  data = tmp_path / 'data'
  shutil.copytree(tiny['data'], data)
  damage(data)
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['train'],
                               '--dataset_dir=%s' % data,
                               '--eval_logdir=%s' % (tmp_path / 'e')])
  return code, capsys.readouterr().err, data


def test_cut_short_shard_is_named(tiny, tmp_path, capsys):
  def cut_first_shard(data):
    shard = sorted(data.glob('val-*.tfrecord'))[0]
    shard.write_bytes(shard.read_bytes()[:30])  # inside the first record
  code, err, data = _eval_on_a_copy(tiny, tmp_path, capsys, cut_first_shard)
  shard = sorted(data.glob('val-*.tfrecord'))[0]
  assert code == 2
  assert ('corrupted TFRecord input: %s: record 0 (byte offset 0) is '
          'damaged or cut short' % shard) in err
  assert 'Traceback' not in err


def test_class_count_of_another_dataset_names_its_source(tiny, tmp_path,
                                                         capsys):
  trained = json.loads(
      (pathlib.Path(tiny['data']) / 'dataset.json').read_text())['num_classes']

  def two_more_classes(data):
    described = json.loads((data / 'dataset.json').read_text())
    described.update(num_classes=trained + 2, class_names=None)
    (data / 'dataset.json').write_text(json.dumps(described))
  code, err, data = _eval_on_a_copy(tiny, tmp_path, capsys, two_more_classes)
  assert code == 2
  assert ('%s gives %d classes but the checkpoint was trained with %d'
          % (data / 'dataset.json', trained + 2, trained)) in err
  assert 'Drop these flags' not in err  # no flag was given


def test_contradicting_model_flag_is_an_error(tiny, capsys):
  """A model flag that changes the variables (unlike --output_stride:
  test_eval_at_another_output_stride_than_trained)."""
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['train'],
                               '--dataset_dir=' + tiny['data'],
                               '--depth_multiplier=0.5'])
  assert code == 2
  assert '--depth_multiplier=0.5 (trained with 0.25)' in (
      capsys.readouterr().err)


def test_checkpoint_of_another_network_is_explained(tiny, tmp_path):
  """No saved config and default model flags: a message, not a trace."""
  bare = tmp_path / 'bare'
  bare.mkdir()
  for f in glob.glob(tiny['checkpoint'] + '.*') + [
      os.path.join(tiny['train'], 'checkpoint')]:
    shutil.copy(f, bare)
  opts = et.tiny_model_options(depth_multiplier=0.5)
  with predictor_lib.Predictor(opts, config.InferenceOptions()) as predictor:
    with pytest.raises(predictor_lib.CheckpointMismatchError,
                       match='with another shape'):
      predictor.restore(str(bare / os.path.basename(tiny['checkpoint'])))


def test_moved_or_copied_logdir_is_read_from_its_own_files(tiny, tmp_path,
                                                          caplog):
  """The original's state file holds absolute paths: a logdir moved from
  another machine was 'no checkpoint ... train first' for eval, vis and
  export (deeplab-train resumed from it), and a copied one was read from
  the source folder. The folder's own newest checkpoint is read now."""
  copy = tmp_path / 'copy'
  copy.mkdir()
  for f in glob.glob(tiny['checkpoint'] + '.*'):
    shutil.copy(f, copy)
  name = os.path.basename(tiny['checkpoint'])
  for named in ('/gone/host/logdir/%s' % name, tiny['checkpoint']):
    (copy / 'checkpoint').write_text('model_checkpoint_path: "%s"\n' % named)
    with caplog.at_level('WARNING'):
      assert predictor_lib.resolve_checkpoint(str(copy)) == str(copy / name)
    assert 'the state file of %s names ' % copy in caplog.text
  # TensorFlow's own error line about the gone files came before it.
  assert "Couldn't match files" not in caplog.text


@pytest.mark.parametrize('state', [b'', b'\xff\x00 not a state file'])
def test_a_damaged_state_file_is_read_past(tiny, tmp_path, state, caplog):
  """A state file left empty (a crash soon after a save can leave it so)
  or not text: deeplab-eval, -vis and -export stopped with TensorFlow's
  ValueError or UnicodeDecodeError and a traceback; follow mode raised
  too. The folder's newest complete checkpoint is read now, with a
  warning."""
  copy = tmp_path / 'copy'
  copy.mkdir()
  for f in glob.glob(tiny['checkpoint'] + '.*'):
    shutil.copy(f, copy)
  shutil.copy(os.path.join(tiny['train'], config.RUN_CONFIG_FILENAME), copy)
  (copy / 'checkpoint').write_bytes(state)
  name = os.path.basename(tiny['checkpoint'])
  assert predictor_lib.resolve_checkpoint(str(copy)) == str(copy / name)
  watcher = eval_loop.watch_checkpoints(str(copy), 0, timeout_secs=0)
  assert list(watcher) == [str(copy / name)]
  with caplog.at_level('WARNING'):
    code = et.run_cli(eval_cli, ['--checkpoint_dir=%s' % copy,
                                 '--dataset_dir=' + tiny['data'],
                                 '--eval_logdir=%s' % (tmp_path / 'eval')])
  assert code == 0
  assert ('the state file of %s cannot be read (empty, or not a state '
          'file); using the newest complete checkpoint in the folder, %s'
          % (copy, copy / name)) in caplog.text


def test_checkpoint_with_a_part_the_flags_leave_out_is_refused(tmp_path):
  """An original's checkpoint with a decoder, evaluated without
  --decoder_output_stride: the encoder alone was restored and scored
  (mIoU 0.1593 against 0.3415) without a word."""
  prefix = et.write_checkpoint(
      str(tmp_path / 'train'), et.tiny_model_options(decoder_output_stride=(4,)),
      save_config=False)
  with predictor_lib.Predictor(et.tiny_model_options(),
                               config.InferenceOptions()) as predictor:
    with pytest.raises(predictor_lib.CheckpointMismatchError) as error:
      predictor.restore(prefix)
  assert 'in the checkpoint that the network does not build, e.g. decoder/' in (
      str(error.value))
  assert 'pass the model flags it was trained with' in str(error.value)
  # It named 'number of classes', which no flag sets.
  assert app.user_message(error.value).endswith(
      '...) and its class count (this network has %d classes)'
      % et.NUM_CLASSES)


def test_follow_mode_evaluates_each_new_checkpoint_once(tiny, tmp_path):
  logdir = tmp_path / 'follow'
  logdir.mkdir()
  prefix7 = _copy_checkpoint(tiny['checkpoint'], str(logdir), 7)
  written = []
  clock = [0.0]

  def fake_sleep(seconds):
    clock[0] += seconds
    # While "waiting", the trainer writes one more checkpoint.
    if not written:
      written.append(_copy_checkpoint(tiny['checkpoint'], str(logdir), 8))

  info = datasets.load_dataset_info('tiny', tiny['data'])
  images = [(name, image.astype(np.float32), label)
            for name, image, label in et.tiny_images()[:2]]
  make_samples = lambda: ({'image': i, 'label': l, 'name': n}
                          for n, i, l in images)
  results = eval_loop.evaluate(
      str(logdir), str(tmp_path / 'follow_eval'), et.tiny_model_options(),
      config.InferenceOptions(), config.EvalOptions(
          follow=True, eval_interval_secs=0, max_number_of_evaluations=5,
          timeout_secs=30),
      info, make_samples, sleep=fake_sleep, clock=lambda: clock[0])
  assert [r['checkpoint'] for r in results] == [prefix7] + written
  assert results[0]['miou'] == results[1]['miou']
  assert clock[0] == 1 + 30  # one poll until step 8, then the timeout


def test_follow_mode_started_before_the_run_takes_the_runs_options(
    tiny, tmp_path, capsys):
  """deeplab-eval started beside a training run, before its logdir has a
  checkpoint (the original's workflow): the model options were settled from
  the flags' defaults at start, and the run's first checkpoint was refused
  as another network (exit 2, 'Without a deeplab_config.json'). Here the
  checkpoint lands first and the run's config a second later."""
  logdir = tmp_path / 'not_yet'

  def training_run():
    time.sleep(1.5)
    logdir.mkdir()
    _copy_checkpoint(tiny['checkpoint'], str(logdir), 0)
    time.sleep(1)
    shutil.copy(os.path.join(tiny['train'], config.RUN_CONFIG_FILENAME),
                str(logdir))
  thread = threading.Thread(target=training_run)
  thread.start()
  try:
    code = et.run_cli(eval_cli, [
        '--checkpoint_dir=%s' % logdir, '--dataset_dir=' + tiny['data'],
        '--eval_interval_secs=0', '--max_number_of_evaluations=1'])
  finally:
    thread.join()
  out = capsys.readouterr().out
  assert code == 0, out
  result = json.loads(out.splitlines()[-1])
  assert result['checkpoint'] == str(logdir / 'model.ckpt-0')
  # The default eval_logdir is the run's, as for a logdir that existed.
  assert (logdir / 'eval').is_dir()

  # No checkpoint within --eval_timeout_secs: it stops, exit 0, as after
  # the last checkpoint of a run, with its result line (there was none).
  assert et.run_cli(eval_cli, [
      '--checkpoint_dir=%s' % (tmp_path / 'never'),
      '--dataset_dir=' + tiny['data'], '--eval_interval_secs=0',
      '--eval_timeout_secs=1.5']) == 0
  assert not (tmp_path / 'never').exists()
  assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {
      'event': 'result', 'status': 'ok', 'evaluations': 0,
      'message': 'no checkpoint in %s within --eval_timeout_secs=1.5: '
                 'nothing was evaluated' % (tmp_path / 'never')}


def test_the_last_of_max_number_of_evaluations_is_the_final_result(
    tiny, tmp_path, monkeypatch, capsys):
  """Followed with --max_number_of_evaluations, the last evaluation's line
  is the command's last: a SIGTERM in the close after it (the model and
  the checkpoint's pin released) printed a second, 'terminated' line and
  exited 143 for finished work. Earlier evaluations' lines are not final."""
  logdir = tmp_path / 'follow'
  logdir.mkdir()
  _copy_checkpoint(tiny['checkpoint'], str(logdir), 7)
  shutil.copy(os.path.join(tiny['train'], config.RUN_CONFIG_FILENAME),
              str(logdir))
  finals = []
  printed = eval_cli.print_result

  def print_then_signalled(result, scores, final=True):
    printed(result, scores, final)
    finals.append(final)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs in here
  monkeypatch.setattr(eval_cli, 'print_result', print_then_signalled)
  code = et.run_cli(eval_cli, [
      '--checkpoint_dir=%s' % logdir, '--dataset_dir=' + tiny['data'],
      '--eval_logdir=%s' % (tmp_path / 'eval'), '--eval_interval_secs=0',
      '--max_number_of_evaluations=1'])
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith('{')]
  assert (code, finals) == (0, [True])
  assert [line['status'] for line in lines] == ['ok']

  # Not the last: the 'last' flag the loop hands on is False until the
  # limit is reached.
  lasts = []
  _follow_on_one_image(tiny, logdir, tmp_path, 2, on_result=(
      lambda result, scores, last: lasts.append(last)))
  assert lasts == [False]  # one checkpoint, then the timeout


def _follow_on_one_image(tiny, logdir, tmp_path, max_evaluations, **kwargs):
  """eval_loop.evaluate following `logdir` on the first tiny image, with
  no wait after the last checkpoint; its results."""
  info = datasets.load_dataset_info('tiny', tiny['data'])
  _, image, label = et.tiny_images()[0]
  return eval_loop.evaluate(
      str(logdir), str(tmp_path / 'follow_eval'), et.tiny_model_options(),
      config.InferenceOptions(), config.EvalOptions(
          follow=True, eval_interval_secs=0,
          max_number_of_evaluations=max_evaluations, timeout_secs=0),
      info, lambda: [{'image': image.astype(np.float32), 'label': label,
                      'name': 'a'}],
      sleep=lambda _: None, **kwargs)


def test_follow_mode_reads_a_checkpoint_deleted_after_it_was_chosen(
    tiny, tmp_path, monkeypatch):
  """Followed, each checkpoint is pinned (hard links) when it is chosen:
  the training run deleting it before the restore does not make the
  evaluation skip it. The pin is gone afterwards."""
  logdir = tmp_path / 'follow'
  logdir.mkdir()
  prefix7 = _copy_checkpoint(tiny['checkpoint'], str(logdir), 7)
  real_restore = restore_lib.restore

  def trainer_deletes_it_first(saver, session, prefix):
    for path in glob.glob(prefix + '.*'):
      os.remove(path)
    return real_restore(saver, session, prefix)
  monkeypatch.setattr(restore_lib, 'restore', trainer_deletes_it_first)
  results = _follow_on_one_image(tiny, logdir, tmp_path, 1)
  assert [r['checkpoint'] for r in results] == [prefix7]
  assert os.listdir(logdir) == ['checkpoint']


def test_follow_mode_skips_a_damaged_checkpoint(tiny, tmp_path, caplog):
  """Followed, a checkpoint whose data cannot be read is skipped with its
  reason and the next one is scored: it ended the run (exit 2), and the
  training run's later checkpoints went unscored."""
  logdir = tmp_path / 'follow'
  logdir.mkdir()
  prefix7 = _copy_checkpoint(tiny['checkpoint'], str(logdir), 7)
  data = prefix7 + '.data-00000-of-00001'
  with open(data, 'r+b') as f:
    f.truncate(os.path.getsize(data) // 2)
  written = []

  def trainer_saves_step_8(_):
    if not written:
      written.append(_copy_checkpoint(tiny['checkpoint'], str(logdir), 8))
  info = datasets.load_dataset_info('tiny', tiny['data'])
  _, image, label = et.tiny_images()[0]
  results = eval_loop.evaluate(
      str(logdir), str(tmp_path / 'follow_eval'), et.tiny_model_options(),
      config.InferenceOptions(), config.EvalOptions(
          follow=True, eval_interval_secs=0, max_number_of_evaluations=1,
          timeout_secs=60),
      info, lambda: [{'image': image.astype(np.float32), 'label': label,
                      'name': 'a'}],
      sleep=trainer_saves_step_8)
  assert [r['checkpoint'] for r in results] == written
  skipped = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith('skipping ')]
  assert len(skipped) == 1 and prefix7 in skipped[0], skipped
  assert 'cannot be read' in skipped[0], skipped


def test_watch_checkpoints_waits_and_times_out(tmp_path):
  clock = [0.0]
  sleeps = []

  def sleep(seconds):
    sleeps.append(seconds)
    clock[0] += seconds

  logdir = str(tmp_path / 'not_yet')
  watcher = eval_loop.watch_checkpoints(logdir, interval_secs=10,
                                        timeout_secs=3, poll_secs=1,
                                        sleep=sleep, clock=lambda: clock[0])
  assert list(watcher) == []  # no checkpoint: gives up after the timeout
  assert clock[0] == 3


def test_multi_scale_and_flip_tag(tiny, tmp_path, capsys):
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + tiny['checkpoint'],
                               '--dataset_dir=' + tiny['data'],
                               '--eval_logdir=' + str(tmp_path),
                               '--eval_scales=0.75', '--eval_scales=1.0',
                               '--add_flipped_images',
                               '--eval_result_json=%s/r.json' % tmp_path])
  assert code == 0
  result = _last_json_line(capsys.readouterr().out)
  assert result['eval_scales'] == [0.75, 1.0] and result['add_flipped_images']
  assert json.loads((tmp_path / 'r.json').read_text())['miou'] == result['miou']
  events = glob.glob(str(tmp_path / 'events.out.tfevents.*'))
  tags = {v.tag for e in tf.train.summary_iterator(events[0])
          for v in e.summary.value}
  assert 'eval/miou_0.75_1.0_flipped_overall' in tags


def _copy_checkpoint(prefix, logdir, step):
  """Copies a checkpoint under a new step and makes it the latest."""
  new = os.path.join(logdir, 'model.ckpt-%d' % step)
  for path in glob.glob(prefix + '.*'):
    shutil.copy(path, new + path[len(prefix):])
  tf.train.update_checkpoint_state(logdir, new)
  return new


def test_entry_point_exits_2_without_checkpoint(tmp_path):
  """Through the real entry point (absl app.run): message, code, no wait."""
  result = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.eval',
       '--checkpoint_dir=%s' % tmp_path, '--dataset_dir=%s' % tmp_path],
      capture_output=True, text=True, timeout=120,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  assert result.returncode == 2
  assert ('deeplab-eval: error: --checkpoint_dir=%s holds no checkpoint'
          % tmp_path in result.stderr)
  assert json.loads(result.stdout.strip().splitlines()[-1])['status'] == (
      'bad_input')


@pytest.mark.slow
def test_eval_of_a_short_training_run(tiny, tmp_path, capsys):
  """deeplab-train's logdir (its saved config) is all deeplab-eval needs."""
  # Imported here: only this test needs the trainer.
  from deeplab_train.cli import train as train_cli
  logdir = str(tmp_path / 'train')
  code = et.run_cli(train_cli, [
      '--train_logdir=' + logdir, '--dataset_dir=' + tiny['data'],
      '--dataset=tiny', '--train_split=val', '--model_variant=mobilenet_v2',
      '--depth_multiplier=0.25', '--aspp_convs_filters=16',
      '--output_stride=8', '--train_crop_size=41,41', '--train_batch_size=2',
      '--training_number_of_steps=2'])
  assert code == 0
  capsys.readouterr()
  # No model flags: they come from the deeplab_config.json of the run.
  assert et.run_cli(eval_cli, ['--checkpoint_dir=' + logdir,
                               '--dataset_dir=' + tiny['data']]) == 0
  result = _last_json_line(capsys.readouterr().out)
  assert result['global_step'] == 2 and result['num_images'] == 4
  assert 0.0 <= result['miou'] <= 1.0
  assert os.path.isfile(os.path.join(logdir, 'eval', 'eval_result.json'))


def test_a_second_eval_on_one_eval_logdir_exits_75(tiny, tmp_path, capsys):
  """Two deeplab-eval on one --eval_logdir left the result JSON of one
  checkpoint beside the confusion matrix of the other (signal audit): the
  second now exits 75 naming the first, and writes nothing."""
  from deeplab_train import locking  # pylint: disable=g-import-not-at-top
  eval_dir = tmp_path / 'eval'
  eval_dir.mkdir()
  with locking.FolderLock(str(eval_dir), eval_cli.LOCK_FILENAME,
                          'deeplab-eval', 'deeplab-eval writing to this '
                          'folder'):
    code = et.run_cli(eval_cli, [
        '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
        '--eval_logdir=%s' % eval_dir])
  out, err = capsys.readouterr()
  assert code == 75
  assert _last_json_line(out)['status'] == 'locked'
  assert err.splitlines()[-1].startswith(
      'deeplab-eval: error: %s is locked by a running deeplab-eval (pid %d'
      % (eval_dir, os.getpid()))
  assert os.listdir(eval_dir) == []
  # Free again: it evaluates, and the lock file goes with it.
  assert et.run_cli(eval_cli, [
      '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
      '--eval_logdir=%s' % eval_dir]) == 0
  assert eval_cli.LOCK_FILENAME not in os.listdir(eval_dir)
  assert 'eval_result.json' in os.listdir(eval_dir)


def test_a_folder_where_an_eval_file_goes_is_bad_input_at_once(tiny, tmp_path,
                                                              capsys):
  """A folder at EVAL_LOGDIR/eval_result.json was found after the whole
  evaluation (exit 1), once the confusion matrix files were replaced."""
  eval_dir = tmp_path / 'eval'
  (eval_dir / 'eval_result.json').mkdir(parents=True)
  (eval_dir / 'confusion_matrix.csv').write_text('old')
  code = et.run_cli(eval_cli, [
      '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
      '--eval_logdir=%s' % eval_dir])
  out, err = capsys.readouterr()
  assert code == 2, err
  assert _last_json_line(out)['status'] == 'bad_input'
  assert err.splitlines()[-1] == (
      'deeplab-eval: error: --eval_logdir=%s holds a folder named '
      'eval_result.json, where deeplab-eval writes its file: move it, or give '
      'another --eval_logdir' % eval_dir)
  assert (eval_dir / 'confusion_matrix.csv').read_text() == 'old'
