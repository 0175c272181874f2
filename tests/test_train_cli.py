"""deeplab-train: flag validation (exit 2 with one line, before any graph),
and end to end in a subprocess: SIGKILL then resume, SIGTERM, the lock,
--help."""
import json
import logging
import os
import signal
import subprocess
import sys
import time

from absl import flags
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import signals
from deeplab_train.cli import train as train_cli
from deeplab_train.cli import train_flags
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import lock as lock_lib
from deeplab_train.runtime import session_config

import timeouts
import train_testing as tt

FLAGS = flags.FLAGS


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  out = tmp_path_factory.mktemp('records')
  tt.make_tfrecords(out, count=2)
  return str(out)


def _main(args):
  """Runs main() in-process on `args`; returns (exit code, result dict)."""
  code, _, result = tt.main_in_process('deeplab-train', train_cli.main, args)
  return code, result


def _args(tmp_path, records, *extra):
  return tt.tiny_cli_args(tmp_path / 'log', records, 5, *extra)


@pytest.mark.parametrize('extra,message', [
    (['--train_batch_size=3', '--num_clones=2'],
     '--train_batch_size=3 is not divisible by --num_clones=2'),
    (['--train_crop_size=16,33'],
     '--train_crop_size=16,33 does not fit --output_stride=16: each size '
     'must be larger than the stride, best a multiple of it plus 1; nearest '
     'valid size for 16: (none below) or 17'),
    (['--train_split=nope'], 'nope'),
    (['--label_weights=1', '--label_weights=2'],
     '--label_weights has 2 values but the dataset has 5 classes'),
    # A comma list, as the other flags the original took repeated (it was
    # "'1,2,3' is neither a number nor one of auto, ...").
    (['--label_weights=1,2,3'],
     '--label_weights has 3 values but the dataset has 5 classes'),
    (['--quantize_delay_step=0'], 'not supported'),
    # README's MV3 flags with a smaller crop: a traceback, exit 1.
    (['--image_pooling_crop_size=769,769'],
     '--image_pooling_crop_size=769,769 is larger than '
     '--train_crop_size=33,33: the image pooling window must fit in the '
     'crop; give a crop at least that large, or a smaller '
     '--image_pooling_crop_size'),
    (['--learning_policy=step', '--learning_rate_decay_step=0'],
     '--learning_rate_decay_step must be >= 1'),
    (['--tf_initial_checkpoint=/nonexistent/model.ckpt'],
     'no checkpoint there'),
    # Made at the first trace: a traceback and exit 1 after the graph was
    # built, and an events file left in the logdir.
    (['--profile_logdir=/proc/deeplab_profile'],
     '--profile_logdir=/proc/deeplab_profile cannot be created: /proc '),
    # The original's way to join a cluster (task 0): the session waited for
    # a server for ever, and a first SIGTERM did not end it.
    (['--master=grpc://127.0.0.1:1'],
     '--master=grpc://127.0.0.1:1: deeplab-train joins a cluster by its '
     'hosts, not by --master: give --ps_hosts'),
])
def test_bad_flags_exit_2_with_a_message(tmp_path, records, extra, message):
  code, result = _main(_args(tmp_path, records, *extra))
  assert code == 2 and result['status'] == 'bad_input'
  assert message in result['message']
  # Nothing was started: no checkpoint, no saved config.
  assert tt.latest_step(tmp_path / 'log') is None
  assert not (tmp_path / 'log' / config.RUN_CONFIG_FILENAME).exists()


@pytest.mark.parametrize('missing', ['train_logdir', 'dataset_dir'])
def test_required_flags(tmp_path, records, missing):
  args = [a for a in _args(tmp_path, records)
          if not a.startswith('--%s=' % missing)]
  code, result = _main(args)
  assert code == 2
  assert result['message'].startswith('--%s is required' % missing)


def test_logdir_that_is_a_file_is_named_and_kept(tmp_path, records):
  (tmp_path / 'log').write_text('my notes')
  code, result = _main(_args(tmp_path, records))
  assert code == 2
  assert result['message'].startswith('--train_logdir=%s is a file, not a '
                                      'folder' % (tmp_path / 'log'))
  assert 'delete' not in result['message']
  assert (tmp_path / 'log').read_text() == 'my notes'


def test_result_json_that_cannot_be_written_is_refused_first(tmp_path,
                                                             records):
  (tmp_path / 'a_file').write_text('')
  path = tmp_path / 'a_file' / 'result.json'
  code, result = _main(_args(tmp_path, records,
                             '--result_json=%s' % path))
  assert code == 2
  assert result['message'].startswith('--result_json=%s is under ' % path)
  assert tt.latest_step(tmp_path / 'log') is None  # nothing trained


def test_result_json_lost_at_the_end_is_not_exit_0(tmp_path, records,
                                                   monkeypatch):
  def disk_full(result, path):
    raise OSError(28, 'No space left on device', path)
  monkeypatch.setattr(train_cli.result_lib, 'write_result_json', disk_full)
  code, result = _main(_args(tmp_path, records, '--training_number_of_steps=1',
                             '--result_json=%s' % (tmp_path / 'r.json')))
  assert result['status'] == 'ok' and code == 1


def _saved_config_only(tmp_path):
  (tmp_path / 'log').mkdir()
  config.save_run_config(str(tmp_path / 'log'), tt.tiny_model_options(),
                         config.PreprocessOptions(crop_size=(33, 33)),
                         {'name': 'shapes', 'num_classes': 5,
                          'ignore_label': 255})


def test_full_disk_while_saving_keeps_the_last_checkpoint(tmp_path, records,
                                                         monkeypatch):
  # A fake writer: the second save (the final one, step 5) leaves partial
  # files and fails as TensorFlow does on ENOSPC.
  real_save = tf.train.Saver.save
  calls = []

  def save(self, sess, save_path, global_step=None, **kwargs):
    calls.append(global_step)
    if len(calls) == 1:
      return real_save(self, sess, save_path, global_step=global_step,
                       **kwargs)
    prefix = '%s-%d' % (save_path, global_step)
    with open(prefix + '.data-00000-of-00001.tempstate123', 'wb') as f:
      f.write(b'partial')
    os.makedirs(prefix + '_temp')
    with open(os.path.join(prefix + '_temp', 'part'), 'wb') as f:
      f.write(b'partial')
    # What a save failing while it names the checkpoint in the state file
    # leaves (TensorFlow's temp name for it).
    (logdir / ('checkpoint.tmp' + 'a1' * 16)).write_text('partial')
    # As TensorFlow words it (seen with a file-size limit: '; File too
    # large').
    raise tf.errors.ResourceExhaustedError(
        None, None, 'Graph execution error:\n\nDetected at node '
        '\'save/SaveV2\'\nNode: \'save/SaveV2\'\n%s.data-00000-of-00001.'
        'tempstate123; No space left on device' % prefix)

  monkeypatch.setattr(tf.train.Saver, 'save', save)
  logdir = tmp_path / 'log'
  code, result = _main(_args(tmp_path, records))
  assert calls == [0, 5]
  assert code == 1
  assert result['status'] == 'error'
  assert result['stop_reason'] == 'checkpoint_not_saved'
  assert result['message'].startswith(
      'cannot save checkpoint %s/model.ckpt-5: no space left on device. '
      'Free space in %s' % (logdir, logdir))
  assert result['checkpoint'] == '%s/model.ckpt-0' % logdir
  assert 'model.ckpt-0' in result['message']
  assert not [p for p in os.listdir(logdir) if 'ckpt-5' in p]
  assert not [p for p in os.listdir(logdir) if p.startswith('checkpoint.')]
  assert tt.latest_step(logdir) == 0
  assert 'global_step' in tt.read_checkpoint(logdir / 'model.ckpt-0')


def test_contradicting_model_flag_on_resume(tmp_path, records):
  _saved_config_only(tmp_path)
  # A checkpoint written with the saved options (its files are enough).
  for suffix in ('.index', '.data-00000-of-00001'):
    (tmp_path / 'log' / ('model.ckpt-5' + suffix)).write_bytes(b'')
  code, result = _main(_args(tmp_path, records, '--depth_multiplier=0.5'))
  assert code == 2
  assert '--depth_multiplier=0.5 (trained with 0.25)' in result['message']


def test_the_pooling_crop_is_checked_only_where_an_image_pooling_is_built():
  """Without the image-level feature no pooling window is built: such runs
  trained before the check came, and must still."""
  options = dict(crop_size=(33, 33), image_pooling_crop_size=(65, 65))
  config.ModelOptions(add_image_level_feature=False, **options).validate()
  with pytest.raises(config.ConfigError, match='is larger than'):
    config.ModelOptions(add_image_level_feature=True, **options).validate()


def test_an_empty_list_flag_resumes_as_the_none_it_saved(tmp_path, records):
  """'--decoder_output_stride=' (no decoder, as README's EDGE flags give
  it) was saved as null, and the same command then contradicted it: a
  cron job with those flags could never resume."""
  extra = ('--decoder_output_stride=', '--image_pooling_crop_size=')
  code, result = _main(tt.tiny_cli_args(tmp_path / 'log', records, 1, *extra))
  assert (code, result['global_step']) == (0, 1), result
  code, result = _main(tt.tiny_cli_args(tmp_path / 'log', records, 2, *extra))
  assert (code, result['global_step']) == (0, 2), result


def test_a_checkpoint_of_another_shape_without_saved_options_is_refused(
    tmp_path, records):
  """A logdir without deeplab_config.json (e.g. the original's) takes the
  model flags. Flags of another network: the restore passed, the run saved
  its options, and its first step failed (exit 1, a 4.9 KB TensorFlow
  trace); the run with the right flags was then refused for contradicting
  them. Now exit 2 before any session, the folder left as it was."""
  logdir = tmp_path / 'log'
  assert _main(_args(tmp_path, records, '--training_number_of_steps=1'))[
      0] == 0
  (logdir / config.RUN_CONFIG_FILENAME).unlink()
  before = sorted(os.listdir(logdir))
  code, result = _main(_args(tmp_path, records, '--depth_multiplier=0.5',
                             '--training_number_of_steps=2'))
  assert (code, result['status']) == (2, 'bad_input')
  assert result['message'].startswith(
      'the last checkpoint in %s (model.ckpt-1) holds ' % logdir)
  assert ('e.g. MobilenetV2/Conv/weights: [3, 3, 3, 8] in the checkpoint, '
          '[3, 3, 3, 16] here. It was trained with other model flags '
          '(--model_variant, --depth_multiplier, ') in result['message']
  assert sorted(os.listdir(logdir)) == before
  code, result = _main(_args(tmp_path, records, '--training_number_of_steps=2'))
  assert (code, result['global_step']) == (0, 2)
  # Flags that leave a part of the network out (the original's decoder
  # without --decoder_output_stride): the run resumed, saved the network
  # without it and its options, and the right flags were then refused.
  decoder = tmp_path / 'decoder'
  assert _main(tt.tiny_cli_args(decoder, records, 5, '--decoder_output_stride=4',
                                '--training_number_of_steps=1'))[0] == 0
  (decoder / config.RUN_CONFIG_FILENAME).unlink()
  before = sorted(os.listdir(decoder))
  code, result = _main(tt.tiny_cli_args(decoder, records, 5,
                                        '--training_number_of_steps=2'))
  assert (code, result['status']) == (2, 'bad_input')
  assert ("that this run's graph does not build, e.g. decoder/"
          in result['message']), result['message']
  assert sorted(os.listdir(decoder)) == before


def test_saved_config_without_a_checkpoint_takes_new_model_flags(tmp_path,
                                                                 records):
  """A run stopped before its first checkpoint may start with others."""
  _saved_config_only(tmp_path)
  code, result = _main(_args(tmp_path, records, '--depth_multiplier=0.5',
                             '--training_number_of_steps=1'))
  assert (code, result['status'], result['global_step']) == (0, 'ok', 1)
  saved_model, _, _ = config.load_run_config(str(tmp_path / 'log'))
  assert saved_model.depth_multiplier == 0.5


def test_the_class_weights_of_the_run_are_saved_with_its_config(tmp_path,
                                                                records):
  weights = ['--label_weights=%g' % w for w in (0.5, 1, 2, 1, 3)]
  code, result = _main(_args(tmp_path, records, '--training_number_of_steps=1',
                             *weights))
  assert (code, result['status']) == (0, 'ok')
  saved = json.loads((tmp_path / 'log' / config.RUN_CONFIG_FILENAME)
                     .read_text())
  assert saved['train_options']['label_weights'] == [0.5, 1, 2, 1, 3]
  # It is a record: the config still loads as before.
  assert config.load_run_config(str(tmp_path / 'log')) is not None


def test_unknown_flag_exits_2(capsys):
  with pytest.raises(SystemExit) as exit_info:
    train_cli._parse_flags(['deeplab-train', '--train_bach_size=4'])
  FLAGS.unparse_flags()
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "Unknown command line flag 'train_bach_size'" in err


def test_small_batch_with_batch_norm_training_warns():
  warnings = config.check_training_setup(
      tt.tiny_model_options(), config.TrainOptions(train_batch_size=8,
                                                   num_clones=2))
  assert len(warnings) == 1 and '4 images per tower' in warnings[0]
  assert not config.check_training_setup(
      tt.tiny_model_options(), config.TrainOptions(train_batch_size=24,
                                                   num_clones=2))


def test_xla_on_cpu_towers_warns():
  xla = config.TrainOptions(use_xla=True, fine_tune_batch_norm=False)
  warnings = config.check_training_setup(tt.tiny_model_options(), xla,
                                         towers_on_cpu=True)
  assert warnings == [config.XLA_ON_CPU]
  assert not config.check_training_setup(tt.tiny_model_options(), xla)
  assert not config.check_training_setup(
      tt.tiny_model_options(), xla.replace(use_xla=False),
      towers_on_cpu=True)


def test_resuming_with_another_optimizer_is_refused(tmp_path):
  """Its slot variables are in the checkpoints: restoring failed with a
  TensorFlow traceback."""
  config.save_run_config(str(tmp_path), tt.tiny_model_options(),
                         config.PreprocessOptions(), {'name': 'shapes'},
                         config.TrainOptions(optimizer='adam'))
  config.check_resumable(str(tmp_path), config.TrainOptions(optimizer='adam'))
  with pytest.raises(config.ConfigError) as error:
    config.check_resumable(str(tmp_path), config.TrainOptions())
  assert app.user_message(error.value, train_cli.FLAG_NAMES) == (
      '--optimizer=momentum, but the checkpoints in %s were trained with '
      'adam, whose slot variables they hold (%s): pass --optimizer=adam to '
      'train on, or start a new --train_logdir'
      % (tmp_path, tmp_path / config.RUN_CONFIG_FILENAME))


@pytest.mark.parametrize('args,unread', [
    (['--model_variant=resnet_v1_18', '--depth_multiplier=0.5',
      '--multi_grid=1', '--multi_grid=2', '--multi_grid=4'],
     {'depth_multiplier': 'mobilenet_edgetpu, mobilenet_v2, '
                          'mobilenet_v3_large_seg, mobilenet_v3_small_seg'}),
    (['--model_variant=mobilenet_v2', '--depth_multiplier=0.5',
      '--divisible_by=4', '--multi_grid=1', '--multi_grid=2',
      '--multi_grid=4', '--nas_remove_os32_stride'],
     {'multi_grid': 'resnet_v1_101, resnet_v1_101_beta, resnet_v1_18, '
                    'resnet_v1_18_beta, resnet_v1_50, resnet_v1_50_beta, '
                    'xception_41, xception_65, xception_71',
      'nas_remove_os32_stride': 'nas_hnasnet, nas_pnasnet'}),
    (['--model_variant=xception_65', '--multi_grid=1', '--multi_grid=2',
      '--multi_grid=4'], {}),
])
def test_backbone_flags_the_model_does_not_read_are_named(args, unread,
                                                          caplog):
  """--depth_multiplier with a ResNet, --multi_grid with MobileNet, ... were
  accepted without a word, as in the original: they change nothing."""
  from deeplab_train.cli import common_flags
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + args)
    with caplog.at_level(logging.WARNING):
      common_flags.model_options(21, (65, 65))
  finally:
    FLAGS.unparse_flags()
  variant = args[0].split('=')[1]
  # Only the options' own warnings (absl logs the flags' reset, at INFO,
  # where an earlier test left its level there).
  assert sorted(r.getMessage() for r in caplog.records
                if r.module == 'common_flags'
                and r.levelno >= logging.WARNING) == sorted(
      '--%s changes nothing with --model_variant=%s; only these variants '
      'read it: %s' % (name, variant, readers)
      for name, readers in unread.items())


def test_multi_value_flags_take_comma_lists():
  """absl read --atrous_rates=6,12,18 as one number: 'invalid literal for
  int()'. A comma list is now the repeated flag; both forms mix."""
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train', '--atrous_rates=6,12', '--atrous_rates=18',
           '--image_pyramid=0.5,1', '--multi_grid=1'])
    assert FLAGS.atrous_rates == [6, 12, 18]
    assert FLAGS.image_pyramid == [0.5, 1.0]
    assert FLAGS.multi_grid == [1]
    # Passed on (deeplab-bench --compare_original) as the repeated flag.
    assert FLAGS['atrous_rates'].serialize() == (
        '--atrous_rates=6\n--atrous_rates=12\n--atrous_rates=18')
    FLAGS.unparse_flags()
    with pytest.raises(flags.IllegalFlagValueError):
      FLAGS(['deeplab-train', '--atrous_rates=6,x'])
  finally:
    FLAGS.unparse_flags()


def test_help_lists_the_model_variants():
  from deeplab_train.model import registry
  listed = FLAGS['model_variant'].help.split(': ', 1)[1]
  assert sorted(listed.rstrip('.').replace(' or ', ', ').split(', ')) == (
      registry.known_variants())


def test_fp16_on_cpu_towers_warns():
  """TensorFlow's float16 rewrite changes GPU ops only: fp16 on a CPU ran
  in float32 without a word."""
  fp16 = config.TrainOptions(mixed_precision='fp16',
                             fine_tune_batch_norm=False)
  assert config.check_training_setup(tt.tiny_model_options(), fp16,
                                     towers_on_cpu=True) == [
                                         config.FP16_ON_CPU]
  assert not config.check_training_setup(tt.tiny_model_options(), fp16)


@pytest.mark.parametrize('model,train,message', [
    # Each was accepted: a raw ZeroDivisionError / ValueError, a failure
    # at the first step, or a run that trained uphill or learnt nothing.
    ({'decoder_output_stride': (0,)}, {},
     'decoder_output_stride must be >= 1, got 0'),
    ({'divisible_by': 0}, {}, 'divisible_by must be >= 1, got 0'),
    ({'atrous_rates': (0, -6, 12)}, {}, 'atrous_rates must be >= 1, got '
     '0,-6,12'),
    ({'image_pooling_stride': (0, 0)}, {},
     'image_pooling_stride must be >= 1, got 0,0'),
    ({'aspp_convs_filters': 0}, {}, 'aspp_convs_filters must be >= 1, got 0'),
    ({'decoder_filters': 0}, {}, 'decoder_filters must be >= 1, got 0'),
    ({'batch_norm_decay': 1.5}, {}, 'batch_norm_decay must be in [0, 1], '
     'got 1.5'),
    ({}, {'slow_start_learning_rate': -1.0},
     'slow_start_learning_rate must be >= 0, got -1'),
    ({}, {'learning_rate_decay_factor': -1.0},
     'learning_rate_decay_factor must be >= 0, got -1'),
    ({}, {'learning_power': -1.0}, 'learning_power must be >= 0, got -1'),
    # A NaN learning rate from the first step, stopped as a non-finite loss.
    ({}, {'decay_steps': float('inf')},
     'decay_steps must be a finite number, got inf'),
    ({}, {'base_learning_rate': float('nan')},
     'base_learning_rate must be a finite number, got nan'),
    ({}, {'label_weights': (1.0, float('inf'))},
     'label_weights must be a finite number, got inf'),
    ({'depth_multiplier': float('inf')}, {},
     'depth_multiplier must be a finite number, got inf'),
])
def test_values_that_trained_wrong_or_failed_late_are_refused(model, train,
                                                              message):
  with pytest.raises(config.ConfigError) as error:
    tt.tiny_model_options().replace(**model).validate()
    config.TrainOptions(**train).validate()
  assert str(error.value).startswith(message)


@pytest.mark.parametrize('options,message', [
    (lambda inf: config.PreprocessOptions(crop_size=(33, 33),
                                          max_scale_factor=inf),
     'max_scale_factor must be a finite number, got inf'),
    (lambda inf: config.PreprocessOptions(crop_size=(33, 33),
                                          min_scale_factor=-inf),
     'min_scale_factor must be a finite number, got -inf'),
    (lambda inf: config.InferenceOptions(scales=(1.0, inf)),
     'scales must be a finite number, got inf'),
])
def test_infinite_and_nan_numbers_are_refused_by_every_options_class(
    options, message):
  with pytest.raises(config.ConfigError) as error:
    options(float('inf')).validate()
  assert str(error.value) == message


def test_a_crop_off_the_stride_trains_as_in_the_original_with_a_warning(
    tmp_path, records, caplog):
  """512,512 (common with the original, which trains it) was refused: the
  users' scripts stopped with exit 2."""
  args = _args(tmp_path, records, '--train_crop_size=32,40',
               '--decoder_output_stride=4', '--training_number_of_steps=2')
  with caplog.at_level('WARNING'):
    code, result = _main(args)
  assert (code, result['global_step']) == (0, 2), result
  assert ('--train_crop_size=32,40 is not a multiple of --output_stride=16 '
          'plus 1: the upsampled logits lie off their features on the '
          'labels, by up to 15 pixels at the far edge (the original trains '
          'it so too); the nearest aligned sizes for 32: 17 or 33; for 40: '
          '33 or 49') in caplog.text
  assert config.check_training_setup(
      config.ModelOptions(crop_size=(513, 513)),
      config.TrainOptions(fine_tune_batch_norm=False)) == []


def test_a_crop_no_larger_than_the_output_stride_is_refused():
  """1 = 0 x 16 + 1 passed the rule, then the loss diverged."""
  with pytest.raises(config.ConfigError, match='crop_size=1,1 does not fit '
                     'output_stride=16.*nearest valid size for 1: '
                     r'\(none below\) or 17'):
    config.check_training_setup(
        tt.tiny_model_options().replace(crop_size=(1, 1)),
        config.TrainOptions())


@pytest.mark.parametrize('extra,gpu,warned', [
    (['--use_xla'], False, True),
    (['--use_xla', '--clone_on_cpu'], True, True),
    (['--use_xla'], True, False),
    ([], False, False)])
def test_use_xla_with_cpu_towers_is_logged(tmp_path, records, caplog,
                                           monkeypatch, extra, gpu, warned):
  monkeypatch.setattr(session_config, 'gpus_visible', lambda: gpu)
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + _args(tmp_path, records, *extra))
    with caplog.at_level(logging.WARNING):
      train_cli.options_from_flags()
  finally:
    FLAGS.unparse_flags()
  assert ('--use_xla with the towers on the CPU' in caplog.text) == warned


@pytest.mark.parametrize('secs,warned', [('0', True), ('60', False)])
def test_summary_images_without_summaries_are_logged(tmp_path, records,
                                                      caplog, secs, warned):
  """--save_summaries_secs=0 writes no summaries: the images asked for
  were missing from the events file without a word."""
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + _args(tmp_path, records,
                                    '--save_summaries_images',
                                    '--save_summaries_secs=' + secs))
    with caplog.at_level(logging.WARNING):
      train_cli.options_from_flags()
  finally:
    FLAGS.unparse_flags()
  assert ('--save_summaries_images: no images are written, as '
          '--save_summaries_secs=0' in caplog.text) == warned


@pytest.mark.parametrize('value,warned', [('false', True), ('true', False)])
def test_keep_aspect_ratio_is_accepted_and_false_is_logged(
    tmp_path, records, caplog, value, warned):
  """The original defines --keep_aspect_ratio and reads it nowhere: its
  resizing keeps the aspect ratio either way, and so does ours."""
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + _args(tmp_path, records, '--min_resize_value=49',
                                    '--keep_aspect_ratio=' + value))
    with caplog.at_level(logging.WARNING):
      job = train_cli.options_from_flags()
  finally:
    FLAGS.unparse_flags()
  assert job.preprocess_options.min_resize_value == 49
  assert ('--keep_aspect_ratio=false has no effect' in caplog.text) == warned


@pytest.mark.parametrize('flags_line,mode', [
    ('flags\t\t: avx2 avx512f avx512_bf16', 'bf16'),
    ('flags\t\t: avx2 amx_tile amx_bf16', 'bf16'),
    ('flags\t\t: avx2 avx512f', 'none'),
    ('flags\t\t: avx2', 'none')])
def test_mixed_precision_auto_is_bf16_only_with_native_bf16(flags_line, mode):
  features = cpu_lib.cpu_features('processor\t: 0\n' + flags_line)
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train', '--mixed_precision=auto'])
    assert train_flags.train_options(features).mixed_precision == mode
    FLAGS(['deeplab-train', '--mixed_precision=none'])
    assert train_flags.train_options(features).mixed_precision == 'none'
  finally:
    FLAGS.unparse_flags()


@pytest.mark.parametrize('flags_line,environ,warned', [
    ('flags\t\t: avx2', {},
     'this CPU has no native bfloat16 (AVX512_BF16 or AMX)'),
    ('flags\t\t: avx2 avx512f avx512_bf16',
     {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE'},
     'but ONEDNN_MAX_CPU_ISA=AVX512_CORE keeps oneDNN below AVX512_CORE_BF16'),
    ('flags\t\t: avx2 avx512f avx512_bf16', {}, None)])
def test_bf16_asked_where_it_trains_slower_says_so(monkeypatch, caplog,
                                                   flags_line, environ,
                                                   warned):
  """bf16 where auto would not choose it (emulated, or oneDNN capped below
  native bfloat16: half fp32's speed) trained without a word."""
  features = cpu_lib.cpu_features('processor\t: 0\n' + flags_line)
  for name in cpu_lib.ONEDNN_ISA_ENVS:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '1')
  for name, value in environ.items():
    monkeypatch.setenv(name, value)
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train', '--mixed_precision=bf16'])
    with caplog.at_level('WARNING'):
      assert train_flags.train_options(features).mixed_precision == 'bf16'
  finally:
    FLAGS.unparse_flags()
  if warned:
    assert warned in caplog.text
    assert ('where bf16 trains slower than float32 (--mixed_precision=auto '
            'would train in float32 here)') in caplog.text
  else:
    assert '--mixed_precision=bf16' not in caplog.text


def test_bf16_refused_where_onednn_would_abort(monkeypatch):
  # On an AVX-512 CPU with oneDNN capped below AVX512_CORE, a bf16 step
  # aborts the process: refused as bad input naming the flag and variable.
  features = cpu_lib.cpu_features(
      'processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16')
  monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX2')
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '1')
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train', '--mixed_precision=bf16'])
    with pytest.raises(config.ConfigError) as caught:
      train_flags.train_options(features)
    assert str(caught.value).startswith(
        '--mixed_precision=bf16: ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below '
        'AVX512_CORE')
    FLAGS(['deeplab-train', '--mixed_precision=auto'])
    assert train_flags.train_options(features).mixed_precision == 'none'
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX512_CORE_BF16')
    assert train_flags.train_options(features).mixed_precision == 'bf16'
  finally:
    FLAGS.unparse_flags()


@pytest.mark.slow
def test_sigkill_then_restart_resumes_at_the_checkpoint(tmp_path, records):
  logdir = tmp_path / 'log'
  # Killed long before its end; the restart trains 3 steps more.
  proc = tt.start_cli(
      tt.tiny_cli_args(logdir, records, 100000, '--save_interval_steps=3'),
      tmp_path / 'run1')
  try:
    tt.wait_for(lambda: 3 in tt.checkpoint_steps(logdir), proc=proc)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  resumed_from = tt.latest_step(logdir)
  assert resumed_from >= 3
  last = resumed_from + 3
  args = tt.tiny_cli_args(logdir, records, last, '--save_interval_steps=3')
  # The killed run's lock file is left behind; --tf_initial_checkpoint is
  # ignored because the logdir holds a checkpoint.
  assert (logdir / lock_lib.LOCK_FILENAME).exists()
  code, result, err = tt.run_cli(
      args + ['--tf_initial_checkpoint=%s/model.ckpt-0' % logdir],
      tmp_path / 'run2')
  assert code == 0, err[-3000:]
  assert result['stop_reason'] == 'finished' and result['global_step'] == last
  assert 'from step %d to %d' % (resumed_from, last) in err
  assert 'stale lock' in err
  assert 'RESUMING' in err and 'IGNORED' in err
  # In the command's terms (absl's handler renders the library's fields).
  assert ('--tf_initial_checkpoint=%s/model.ckpt-0 is IGNORED' % logdir
          in err), err[-3000:]
  assert tt.latest_step(logdir) == last
  assert not (logdir / lock_lib.LOCK_FILENAME).exists()
  saved = config.load_run_config(str(logdir))
  assert saved[0] == tt.tiny_model_options()
  assert saved[2]['num_classes'] == 5


@pytest.mark.slow
def test_sigterm_leaves_a_checkpoint_at_the_current_step(tmp_path, records):
  logdir = tmp_path / 'log'
  result_file = tmp_path / 'result.json'
  proc = tt.start_cli(
      tt.tiny_cli_args(logdir, records, 100000,
                       '--result_json=%s' % result_file), tmp_path / 'run')
  tt.wait_for(lambda: tt.latest_step(logdir) == 0, proc=proc)
  proc.send_signal(signal.SIGTERM)
  code, result, err = tt.finish(proc)
  assert code == 0, err[-3000:]
  assert result['status'] == 'ok'
  assert result['stop_reason'] == 'signal:SIGTERM'
  assert result['global_step'] >= 1
  assert tt.latest_step(logdir) == result['global_step']
  assert result['checkpoint'].endswith('model.ckpt-%d' % result['global_step'])
  assert json.loads(result_file.read_text()) == result


def _wait_for_text(proc, name, text):
  tt.wait_for(lambda: text in (proc.log_dir / name).read_text(), proc=proc)


# deeplab-train whose checkpoint saves after a first signal wait (until a
# second signal ends the process), so that the second comes while it stops.
HELD_FINAL_SAVE = """
import time
from deeplab_train.cli import signals
from deeplab_train.runtime import hooks
save = hooks.CheckpointHook._save

def held(self, session, step):
  if signals.current() is not None and signals.current().pending:
    time.sleep(%d)
  return save(self, session, step)
hooks.CheckpointHook._save = held
""" % timeouts.HANG_SECONDS + tt.LAUNCH


@pytest.mark.slow
def test_second_sigterm_stops_at_once_with_the_json_line(tmp_path, records):
  logdir = tmp_path / 'log'
  result_file = tmp_path / 'result.json'
  proc = tt.start_cli(
      tt.tiny_cli_args(logdir, records, 100000,
                       '--result_json=%s' % result_file), tmp_path / 'run',
      launch=HELD_FINAL_SAVE)
  tt.wait_for(lambda: tt.latest_step(logdir) == 0, proc=proc)
  _wait_for_text(proc, 'stderr.txt', 'step 2/')
  proc.send_signal(signal.SIGTERM)
  _wait_for_text(proc, 'stderr.txt', 'SIGTERM received')
  # Within a second, it is the same signal again (a wrapper script handing
  # on a signal its process group also got): the stop stays clean.
  proc.send_signal(signal.SIGTERM)
  _wait_for_text(proc, 'stderr.txt',
                 'SIGTERM received again within 1 s: taken as the same one')
  time.sleep(signals.DUPLICATE_SECS)
  proc.send_signal(signal.SIGTERM)
  code, result, err = tt.finish(proc)
  assert code == 143, err[-3000:]
  assert result['status'] == 'terminated'
  assert result['stop_reason'] == 'signal:SIGTERM'
  assert result['global_step'] >= 2
  assert 'stopped at once' in result['message']
  assert json.loads(result_file.read_text()) == result
  # What was saved is intact: the latest checkpoint reads in full.
  assert tt.read_checkpoint(tf_latest(logdir))['global_step'] >= 0


def _catches(pid, signum):
  """Whether process `pid` has a handler for `signum` (/proc's SigCgt)."""
  with open('/proc/%d/status' % pid) as f:
    for line in f:
      if line.startswith('SigCgt:'):
        return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
  return False


def tf_latest(logdir):
  return '%s/model.ckpt-%d' % (logdir, tt.latest_step(logdir))


@pytest.mark.slow
@pytest.mark.parametrize('signals_sent', [1, 2])
def test_sigterm_while_starting_up_still_ends_with_the_json_line(
    tmp_path, records, signals_sent):
  # The handlers are set before TensorFlow is imported: a signal within
  # the first second falls in the import.
  logdir = tmp_path / 'log'
  proc = tt.start_cli(tt.tiny_cli_args(logdir, records, 5), tmp_path / 'run')
  # Sent as soon as the process catches SIGTERM (before that, it would
  # kill it: nothing to test); the second after the first was taken.
  tt.wait_for(lambda: _catches(proc.pid, signal.SIGTERM), interval=0.01,
              proc=proc)
  proc.send_signal(signal.SIGTERM)
  if signals_sent == 2:
    _wait_for_text(proc, 'stderr.txt', 'SIGTERM received')
    time.sleep(signals.DUPLICATE_SECS)
    proc.send_signal(signal.SIGTERM)
  code, result, err = tt.finish(proc)
  assert result['stop_reason'] == 'signal:SIGTERM', err[-3000:]
  if signals_sent == 1:
    assert code == 0 and result['status'] == 'ok'
    assert result['message'].startswith('stopped before training')
  else:
    assert code == 143 and result['status'] == 'terminated'
    assert 'before training started' in result['message']
  assert tt.latest_step(logdir) is None  # nothing trained, nothing written


@pytest.mark.slow
def test_locked_logdir_exits_75_naming_the_holder(tmp_path, records):
  logdir = tmp_path / 'log'
  logdir.mkdir()
  with lock_lib.LogdirLock(str(logdir)):
    code, result, err = tt.run_cli(tt.tiny_cli_args(logdir, records, 5),
                                   tmp_path / 'run')
  assert code == 75
  assert result['status'] == 'locked'
  assert 'pid %d' % os.getpid() in err
  assert tt.latest_step(logdir) is None


@pytest.mark.slow
def test_help_documents_the_exit_codes():
  out = subprocess.run(
      [sys.executable, '-c', 'from deeplab_train.cli import train; train.run()',
       '--help'], capture_output=True, text=True, env=tt.subprocess_env(),
      timeout=120).stdout
  assert 'Exit codes:' in out and '75  the logdir is locked' in out
  assert '--train_logdir' in out


def test_library_errors_name_fields_and_commands_show_flags():
  from deeplab_train.cli import app
  from deeplab_train.cli import eval as eval_cli
  from deeplab_train.cli import export as export_cli
  from deeplab_train.cli import vis as vis_cli
  with pytest.raises(config.ConfigError) as error:
    config.InferenceOptions(crop_size=(0, 5)).validate()
  assert str(error.value).startswith('crop_size must be HEIGHT,WIDTH')
  assert error.value.fields == ('InferenceOptions.crop_size',)
  shown = {cli.COMMAND: app.user_message(error.value, cli.FLAG_NAMES)
           for cli in (eval_cli, vis_cli, export_cli)}
  assert shown == {
      'deeplab-eval': '--eval_crop_size must be HEIGHT,WIDTH with positive '
                      'values, got 0,5',
      'deeplab-vis': '--vis_crop_size must be HEIGHT,WIDTH with positive '
                     'values, got 0,5',
      'deeplab-export': '--crop_size must be HEIGHT,WIDTH with positive '
                        'values, got 0,5'}
  with pytest.raises(config.ConfigError) as error:
    config.check_training_setup(config.ModelOptions(crop_size=(9, 64)),
                                config.TrainOptions())
  assert app.user_message(error.value, train_cli.FLAG_NAMES).startswith(
      '--train_crop_size=9,64 does not fit --output_stride=16')


def test_values_are_never_read_as_field_references():
  error = config.ConfigError('{RunOptions.train_logdir}=%s is odd',
                             '/data/{RunOptions.log_steps}')
  assert str(error) == 'train_logdir=/data/{RunOptions.log_steps} is odd'
