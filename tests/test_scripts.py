"""Tests of the shell scripts in scripts/ (PASCAL VOC pipeline and cron job).

They run the real scripts with the real deeplab-* commands on small copies
of the sample data (no network: a fake VOC tarball is made locally), with a
tiny mobilenet_v2 passed through the scripts' environment variables.
Over 400 lines on purpose: the scripts share the fake VOC tarball, the stub
commands and the tiny-model environment built at the top.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
from PIL import Image
import pytest

import cityscapes_tree
import fake_voc
import train_testing as tt

SHELL_SCRIPTS = sorted(p.name for p in fake_voc.SCRIPTS.glob('*.sh'))
OWN_SCRIPTS = ('download_and_convert_voc2012.sh',
               'download_and_convert_ade20k.sh', 'train_voc.sh',
               'eval_voc.sh', 'vis_voc.sh', 'export_voc.sh', 'demo.sh',
               'local_test.sh', 'cron_retrain.sh')


# ---------------------------------------------------------------------------
# Static checks and argument handling (no TensorFlow).
# ---------------------------------------------------------------------------
def test_shellcheck_clean():
  if shutil.which('shellcheck') is None:
    pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
  scripts = [str(fake_voc.SCRIPTS / n)
             for n in OWN_SCRIPTS + ('common.sh', 'fetch.sh', 'voc_recipe.sh')]
  proc = subprocess.run(['shellcheck', '-x'] + scripts, capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize('name', OWN_SCRIPTS)
def test_scripts_are_strict_and_have_usage(name):
  text = (fake_voc.SCRIPTS / name).read_text()
  assert text.startswith('#!/usr/bin/env bash\n')
  assert 'set -euo pipefail' in text
  proc = fake_voc.run_script(name, '-h')
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert proc.stdout.startswith('Usage: %s' % name)


@pytest.mark.parametrize('name', ['download_and_convert_voc2012.sh',
                                  'download_and_convert_ade20k.sh',
                                  'cron_retrain.sh'])
def test_unknown_option_is_refused(name, tmp_path):
  proc = fake_voc.run_script(name, '--no_such_option', '--work_dir', tmp_path)
  assert proc.returncode == 1
  assert "unknown" in proc.stderr and '--no_such_option' in proc.stderr


@pytest.mark.parametrize('args,message', [
    (['--no_such_option'], "unknown argument '--no_such_option' (see -h)"),
    (['--steps'], '--steps needs a value (see -h)'),
])
def test_cron_bad_command_line_prints_the_summary_line(tmp_path, args,
                                                       message):
  """A typo in a crontab line printed nothing on stdout: a monitor reading
  the summary line had none."""
  proc = fake_voc.run_script('cron_retrain.sh', '--work_dir', tmp_path, *args)
  assert proc.returncode == 1
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
      'status': 'failed', 'exit_code': 1, 'message': message, 'log': ''}


def test_cron_requires_data_and_work_dir(tmp_path):
  proc = fake_voc.run_script('cron_retrain.sh', '--work_dir', tmp_path,
                             env=fake_voc.script_env(DATA_DIR=''))
  assert proc.returncode == 1
  assert '--data_dir' in proc.stderr
  # cron still gets the summary line (there is no log yet).
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert (summary['status'], summary['exit_code']) == ('failed', 1)
  assert '--data_dir' in summary['message'] and summary['log'] == ''


def test_cron_bad_setting_prints_the_summary_line(tmp_path):
  proc = fake_voc.run_script('cron_retrain.sh', '--data_dir', tmp_path,
                             '--work_dir', tmp_path / 'work', '--steps', 'abc')
  assert proc.returncode == 1
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['status'] == 'failed'
  assert "STEPS_PER_RUN must be a non-negative integer, got 'abc'" in (
      summary['message'])
  assert not (tmp_path / 'work').exists()


def test_cron_missing_data_folder_fails_without_touching_work(tmp_path):
  work = tmp_path / 'work'
  proc = fake_voc.run_script('cron_retrain.sh', '--data_dir',
                             tmp_path / 'absent', '--work_dir', work)
  assert proc.returncode == 1, fake_voc.describe(proc)
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['status'] == 'failed'
  assert 'absent' in summary['message']
  assert not (work / 'exports' / 'current').exists()


def test_cron_round_on_a_full_disk_still_ends_with_its_summary(tmp_path):
  """With no room to write (the log included), the round printed nothing
  and exited 1, and last_run.json still held an earlier round's success."""
  cron = Cron(tmp_path)
  cron.work.mkdir()
  (cron.work / 'last_run.json').write_text(
      '{"status": "promoted", "exit_code": 0}\n')
  proc = fake_voc.run_script(
      'cron_retrain.sh', '--data_dir', cron.data, '--work_dir', cron.work,
      env=fake_voc.script_env(**cron.settings),
      preexec_fn=fake_voc.no_room_to_write)
  assert proc.returncode == 1, fake_voc.describe(proc)
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['status'] == 'failed'
  assert summary['message'].startswith('cannot write the log %s' % (
      cron.work / 'logs')), summary
  assert 'File too large' in summary['message']   # what RLIMIT_FSIZE says
  assert summary['log'] == ''  # it named the log it could not write
  assert not (cron.work / 'last_run.json').exists()
  assert not list((cron.work / 'train').iterdir())


def _signalled(args, env, ready, signum=signal.SIGTERM, to_group=False):
  """Runs `args` in a session of its own, sends it `signum` (to its process
  group when `to_group`) once ready() holds, and waits for it: (its
  process, stdout, stderr)."""
  proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
  try:
    deadline = time.time() + 60
    while not ready():
      assert time.time() < deadline and proc.poll() is None, proc.communicate()
      time.sleep(0.05)
    if to_group:
      os.killpg(proc.pid, signum)
    else:
      proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  return proc, stdout, stderr


_STUB_BUILD_DATA = (
    # Records (the policy reads dataset.json's splits).
    'for a in "$@"; do case $a in --output_dir=*) d=${a#*=};; esac; done\n'
    'mkdir -p "$d" && printf \'{}\' > "$d/dataset.json"\n')


def _with_stubs(tmp_path, env, stubs):
  """`env` with tmp_path/stubs first on its PATH, holding each command of
  `stubs` ({name: script text}) as an executable."""
  folder = tmp_path / 'stubs'
  folder.mkdir(exist_ok=True)
  for command, text in stubs.items():
    (folder / command).write_text(text)
    (folder / command).chmod(0o755)
  env['PATH'] = '%s:%s' % (folder, env['PATH'])
  return env


def _cron_with_stubs(tmp_path, cron, **bodies):
  """The environment of a round whose deeplab-* commands are the shell
  `bodies` (by command name, dashes as underscores); the others exit 9."""
  return _with_stubs(tmp_path, fake_voc.script_env(**cron.settings), {
      command: '#!/bin/bash\n' + bodies.get(command.replace('-', '_'),
                                            'exit 9\n')
      for command in ('deeplab-build-data', 'deeplab-train', 'deeplab-eval',
                      'deeplab-export')})


def test_cron_summary_says_why_a_command_failed(tmp_path):
  """The summary said only 'deeplab-train failed with exit status 1 (see
  the log)'; the command's own message (a full disk, ...) is in it now."""
  cron = Cron(tmp_path)
  said = 'cannot save checkpoint X: no space left on device. Free space'
  env = _cron_with_stubs(
      tmp_path, cron, deeplab_build_data=_STUB_BUILD_DATA,
      deeplab_train='echo \'{"event": "result", "status": "error", '
      '"message": "%s"}\'\nexit 1\n' % said)
  proc = fake_voc.run_script('cron_retrain.sh', '--data_dir', cron.data,
                             '--work_dir', cron.work, env=env)
  assert proc.returncode == 1, fake_voc.describe(proc)
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['message'] == (
      'deeplab-train failed with exit status 1: ' + said), summary
  assert said in cron.log_of(summary)   # its line is in the log as before


# A trainer that stops on SIGTERM (once, after a short save) with its
# result line, and else ends by itself after 20 s without one. (Its loops
# count in bash: a `$(seq ...)` that a signal to the group kills gave an
# empty loop, and a 'ran out' at once.)
_STUB_TRAINER = '''
said='stopped at step 3 (signal:SIGTERM) with a final checkpoint'
echo started > "$MARK"
stop=0
trap 'stop=$((stop + 1))' TERM
for ((i = 0; i < 200; i++)); do
  sleep 0.1
  if ((stop)); then
    sleep 0.3
    printf '{"event": "result", "status": "stopped", "message": "%s"}\\n' \\
      "$said"
    echo "TERM $stop" >> "$MARK"
    exit 0
  fi
done
echo "ran out" >> "$MARK"
'''


@pytest.mark.parametrize('to_group', [False, True])
def test_cron_hands_a_signal_to_the_trainer(tmp_path, to_group):
  """A SIGTERM to cron_retrain.sh alone never reached deeplab-train: the
  round waited for it to end by itself (hours of training, with a time
  budget). One to its process group stopped both, but the log lost the
  trainer's result line, and the summary said only 'interrupted by a
  signal'. The trainer now gets it once and stops; its line is in the log
  and its message in the summary."""
  cron = Cron(tmp_path)
  mark = tmp_path / 'mark.txt'
  env = _cron_with_stubs(tmp_path, cron, deeplab_build_data=_STUB_BUILD_DATA,
                         deeplab_train=_STUB_TRAINER)
  env['MARK'] = str(mark)
  proc, stdout, stderr = _signalled(
      ['bash', str(fake_voc.SCRIPTS / 'cron_retrain.sh'), '--data_dir',
       str(cron.data), '--work_dir', str(cron.work)], env, mark.exists,
      to_group=to_group)
  assert proc.returncode == 1, (stdout, stderr)
  started, stopped = mark.read_text().splitlines()
  # To the script alone: once. A group's copy may come too (deeplab-train
  # takes it as the same signal; this stub counts it).
  assert stopped in (('TERM 1', 'TERM 2') if to_group else ('TERM 1',))
  summary = json.loads(stdout.strip().splitlines()[-1])
  assert summary['status'] == 'failed'
  assert summary['message'] == (
      'interrupted by SIGTERM while deeplab-train ran: stopped at step 3 '
      '(signal:SIGTERM) with a final checkpoint'), summary
  assert '"status": "stopped"' in cron.log_of(summary)


# ---------------------------------------------------------------------------
# The recipes' command lines (stub commands that record their arguments).
# ---------------------------------------------------------------------------
def _recorded_args(tmp_path, script, **env):
  """Runs `script` with deeplab-* stubs first on PATH; returns their argv."""
  proc, args = _run_with_stubs(tmp_path, script, **env)
  assert proc.returncode == 0, fake_voc.describe(proc)
  return args


def _run_with_stubs(tmp_path, script, **env):
  """`_recorded_args` of any outcome: (the finished script, the argv)."""
  record = tmp_path / 'args.txt'
  full_env = fake_voc.script_env(**env)
  for name in fake_voc.TINY_MODEL_ENV:   # the recipe defaults, not the tiny model
    if name not in env:
      del full_env[name]
  _with_stubs(tmp_path, full_env, {
      command: '#!/bin/sh\nprintf "%%s\\n" "%s" "$@" > "%s"\n'
      % (command, record)
      for command in ('deeplab-train', 'deeplab-eval', 'deeplab-vis',
                      'deeplab-export')})
  record.unlink(missing_ok=True)
  proc = fake_voc.run_script(script, env=full_env)
  return proc, record.read_text().splitlines() if record.exists() else []


def _fake_logdirs(tmp_path, with_config):
  work = tmp_path / 'pascal_voc_seg'
  records = work / 'tfrecord'
  records.mkdir(parents=True)
  (records / 'dataset.json').write_text('{}')
  (records / 'train_aug-00000-of-00001.tfrecord').write_text('')
  train = work / 'exp' / 'xception_65' / 'train'
  train.mkdir(parents=True)
  (train / 'model.ckpt-7.index').write_text('')
  (train / 'checkpoint').write_text(
      'model_checkpoint_path: "%s/model.ckpt-7"\n' % train)
  if with_config:
    (train / 'deeplab_config.json').write_text('{}')
  return work, train


def test_xception_recipe_flags(tmp_path):
  work, train = _fake_logdirs(tmp_path, with_config=False)
  args = _recorded_args(tmp_path, 'train_voc.sh', WORK_DIR=work)
  assert args[0] == 'deeplab-train'
  for flag in ('--model_variant=xception_65', '--atrous_rates=6',
               '--atrous_rates=12', '--atrous_rates=18', '--output_stride=16',
               '--decoder_output_stride=4', '--train_crop_size=513,513',
               '--train_batch_size=16', '--base_learning_rate=0.007',
               '--fine_tune_batch_norm=true', '--train_split=train_aug',
               '--training_number_of_steps=30000',
               '--train_logdir=%s' % train):
    assert flag in args, (flag, args)
  # Without a saved config, eval and export describe the network by flags.
  args = _recorded_args(tmp_path, 'eval_voc.sh', WORK_DIR=work)
  assert '--model_variant=xception_65' in args
  assert '--eval_crop_size=513,513' in args
  args = _recorded_args(tmp_path, 'export_voc.sh', WORK_DIR=work)
  assert '--checkpoint_path=%s/model.ckpt-7' % train in args
  assert '--num_classes=21' in args and '--atrous_rates=18' in args


def test_saved_config_replaces_model_flags(tmp_path):
  work, _ = _fake_logdirs(tmp_path, with_config=True)
  for script in ('eval_voc.sh', 'vis_voc.sh', 'export_voc.sh'):
    args = _recorded_args(tmp_path, script, WORK_DIR=work)
    assert not [a for a in args if a.startswith(('--model_variant',
                                                  '--atrous_rates',
                                                  '--num_classes'))], args


def test_export_of_a_checkpoint_folder_reads_the_config_inside(tmp_path):
  """CHECKPOINT_PATH=<train folder> (deeplab-export takes its latest
  checkpoint): the script looked for deeplab_config.json beside the folder,
  found none and added the recipe's flags, which contradicted it (exit 2
  naming flags the user never gave)."""
  work, train = _fake_logdirs(tmp_path, with_config=True)
  for path in (train, '%s/' % train):
    args = _recorded_args(tmp_path, 'export_voc.sh', WORK_DIR=work,
                          CHECKPOINT_PATH=path)
    assert '--checkpoint_path=%s' % path in args
    assert not [a for a in args if a.startswith(('--model_variant',
                                                  '--num_classes'))], args


def test_eval_following_a_run_before_its_first_checkpoint(tmp_path):
  """MAX_NUMBER_OF_EVALUATIONS=0 on a logdir with no checkpoint yet: the
  recipe's flags went in, and deeplab-eval exited 2 once the run's first
  checkpoint and config (of another recipe) came. Now none go in: the
  config saved with the first checkpoint gives the model."""
  work, train = _fake_logdirs(tmp_path, with_config=False)
  for name in os.listdir(train):
    os.remove(train / name)
  args = _recorded_args(tmp_path, 'eval_voc.sh', WORK_DIR=work,
                        MAX_NUMBER_OF_EVALUATIONS=0)
  assert '--max_number_of_evaluations=0' in args
  assert not [a for a in args if a.startswith(('--model_variant',
                                               '--atrous_rates'))], args
  proc, _ = _run_with_stubs(tmp_path, 'eval_voc.sh', WORK_DIR=work)
  assert proc.returncode == 1
  assert 'no checkpoint in TRAIN_LOGDIR=' in proc.stderr


def test_scripts_take_a_zoo_folder_and_a_logdir_with_an_empty_state_file(
    tmp_path):
  """eval_voc.sh and vis_voc.sh said 'no checkpoint in TRAIN_LOGDIR' for a
  model-zoo folder (model.ckpt alone, no state file), which deeplab-eval
  takes; with a state file a crash left empty, train_voc.sh warned
  'training from scratch' while deeplab-train resumed."""
  work, train = _fake_logdirs(tmp_path, with_config=False)
  zoo = tmp_path / 'zoo'
  zoo.mkdir()
  for name in ('model.ckpt.index', 'model.ckpt.data-00000-of-00001'):
    (zoo / name).write_text('')
  for script, flag in (('eval_voc.sh', '--checkpoint_dir=%s' % zoo),
                       ('vis_voc.sh', '--checkpoint_dir=%s' % zoo),
                       ('export_voc.sh',
                        '--checkpoint_path=%s/model.ckpt' % zoo)):
    args = _recorded_args(tmp_path, script, WORK_DIR=work,
                          TRAIN_LOGDIR=zoo)
    assert flag in args, (script, args)
    assert '--model_variant=xception_65' in args  # no config beside it
  (train / 'model.ckpt-7.data-00000-of-00001').write_text('')
  (train / 'checkpoint').write_text('')
  proc, args = _run_with_stubs(tmp_path, 'train_voc.sh', WORK_DIR=work)
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert 'training from scratch' not in proc.stderr + proc.stdout
  args = _recorded_args(tmp_path, 'export_voc.sh', WORK_DIR=work)
  assert '--checkpoint_path=%s/model.ckpt-7' % train in args


def _checkpoint_tarball(path, with_index=True):
  folder = path.parent / 'zoo' / 'train'
  folder.mkdir(parents=True)
  (folder / 'model.ckpt-1.data-00000-of-00001').write_text('')
  if with_index:
    (folder / 'model.ckpt-1.index').write_text('')
  subprocess.run(['tar', '-czf', str(path), '-C', str(folder.parent),
                  'train'], check=True)
  shutil.rmtree(folder.parent)


def test_init_checkpoint_url_that_fails_leaves_nothing_behind(tmp_path):
  """A failed download or unpack of INIT_CHECKPOINT_URL (no network) left
  an empty init_models/<name> folder, then said the URL 'holds no
  TensorFlow checkpoint'; every later run skipped the download for it."""
  work, _ = _fake_logdirs(tmp_path, with_config=False)
  tarball = tmp_path / 'deeplabv3_zoo.tar.gz'
  url = 'file://%s' % tarball
  kept = work / 'init_models' / 'deeplabv3_zoo'

  def train(expected_words):
    proc, args = _run_with_stubs(tmp_path, 'train_voc.sh', WORK_DIR=work,
                                 INIT_CHECKPOINT_URL=url)
    assert proc.returncode == 1, fake_voc.describe(proc)
    assert expected_words in proc.stderr, proc.stderr
    assert not args   # deeplab-train never ran
    assert not kept.exists()
    assert os.listdir(kept.parent) == []

  train('downloading %s failed (exit status ' % url)
  tarball.write_text('not a tarball')
  train('cannot unpack %s (not a tarball, or truncated)' % url)
  tarball.unlink()
  _checkpoint_tarball(tarball, with_index=False)
  train('%s holds no TensorFlow checkpoint (*.index file); nothing was kept'
        % url)
  tarball.unlink()
  _checkpoint_tarball(tarball)
  args = _recorded_args(tmp_path, 'train_voc.sh', WORK_DIR=work,
                        INIT_CHECKPOINT_URL=url)
  assert '--tf_initial_checkpoint=%s/train/model.ckpt-1' % kept in args


def test_mobilenet_recipe_flags(tmp_path):
  work, _ = _fake_logdirs(tmp_path, with_config=False)
  args = _recorded_args(tmp_path, 'train_voc.sh', WORK_DIR=work,
                        RECIPE='mobilenet_v2', TRAIN_STEPS=5,
                        TRAIN_SPLIT='trainval', BASE_LEARNING_RATE=0.0001)
  assert '--model_variant=mobilenet_v2' in args
  assert not [a for a in args if a.startswith(('--atrous_rates',
                                                '--decoder_output_stride'))]
  for flag in ('--training_number_of_steps=5', '--train_split=trainval',
               '--base_learning_rate=0.0001'):
    assert flag in args


# A deeplab-* stand-in: appends its command line to $RECORD and writes what
# the next step reads (dataset.json, a checkpoint and its config, an mIoU).
_STUB = r"""#!/bin/sh
echo "$(basename "$0") $*" >> "$RECORD"
for arg in "$@"; do
  value=${arg#*=}
  case $arg in
    --output_dir=*) mkdir -p "$value"; echo '{}' > "$value/dataset.json" ;;
    --train_logdir=*)
      mkdir -p "$value"; : > "$value/model.ckpt-5.index"
      echo '{}' > "$value/deeplab_config.json"
      echo 'model_checkpoint_path: "model.ckpt-5"' > "$value/checkpoint" ;;
    --eval_result_json=*) echo '{"miou": 0.75}' > "$value" ;;
  esac
done
"""


_DEMO_COMMANDS = ('deeplab-build-data', 'deeplab-train', 'deeplab-eval',
                  'deeplab-vis', 'deeplab-export')


def _run_demo(tmp_path, *args, **env):
  """Runs demo.sh with deeplab-* stubs; returns (proc, {command: argv})."""
  record = tmp_path / 'commands.txt'
  full_env = fake_voc.script_env(RECORD=record, **env)
  for name in fake_voc.TINY_MODEL_ENV:   # the demo's own settings
    del full_env[name]
  _with_stubs(tmp_path, full_env, dict.fromkeys(_DEMO_COMMANDS, _STUB))
  proc = fake_voc.run_script('demo.sh', *args, env=full_env)
  commands = {}
  if record.exists():
    for line in record.read_text().splitlines():
      command, *argv = line.split(' ')
      commands[command] = argv
  return proc, commands


def test_demo_runs_the_voc_scripts_with_its_settings(tmp_path):
  work = tmp_path / 'demo'
  proc, commands = _run_demo(tmp_path, WORK=work)
  assert proc.returncode == 0, fake_voc.describe(proc)
  data = fake_voc.SAMPLE
  expected = {
      'deeplab-build-data': [
          '--image_folder=%s/JPEGImages' % data, '--image_format=jpg',
          '--semantic_segmentation_folder=%s/SegmentationClass' % data,
          '--num_shards=4', '--num_classes=5', '--colormap=pascal',
          '--class_names=background,red_disk,green_striped_square,'
          'blue_dotted_triangle,yellow_ring'],
      'deeplab-train': [
          '--train_logdir=%s/train' % work, '--dataset=shapes',
          '--dataset_dir=%s/tfrecord' % work, '--train_split=train',
          '--model_variant=mobilenet_v2', '--depth_multiplier=0.5',
          '--output_stride=16', '--train_crop_size=129,129',
          '--train_batch_size=8', '--min_scale_factor=0.5',
          '--max_scale_factor=1.5', '--base_learning_rate=0.02',
          '--training_number_of_steps=3000', '--log_steps=100',
          '--save_interval_secs=120', '--fine_tune_batch_norm=true',
          '--result_json=%s/train_result.json' % work],
      'deeplab-eval': [
          '--checkpoint_dir=%s/train' % work, '--dataset=shapes',
          '--eval_split=val', '--eval_logdir=%s/eval' % work,
          '--eval_result_json=%s/eval_result.json' % work],
      'deeplab-vis': [
          '--checkpoint_dir=%s/train' % work, '--vis_split=val',
          '--vis_logdir=%s/vis' % work, '--max_number_of_images=6',
          '--also_save_raw_predictions=true'],
      'deeplab-export': [
          '--checkpoint_path=%s/train/model.ckpt-5' % work,
          '--export_path=%s/export/frozen_inference_graph.pb' % work,
          '--saved_model_dir=%s/export/saved_model' % work,
          '--crop_size=289,289']}
  for command, flags in expected.items():
    missing = [f for f in flags if f not in commands[command]]
    assert not missing, (command, missing, commands[command])
  # The sample's name wins over the VOC converter's (the last flag counts).
  names = [a for a in commands['deeplab-build-data']
           if a.startswith('--dataset_name=')]
  assert names[-1] == '--dataset_name=shapes'

  # Eval and vis pad each image; the saved config gives the model.
  for command in ('deeplab-eval', 'deeplab-vis', 'deeplab-export'):
    assert not [a for a in commands[command]
                if a.startswith(('--eval_crop', '--vis_crop', '--model'))]
  assert 'val mIoU 0.75 (demo target >= 0.7)' in proc.stdout
  proc, _ = _run_demo(tmp_path, WORK=work, MIN_MIOU=0.8)
  assert proc.returncode == 1
  assert 'demo: mIoU below 0.8' in proc.stderr


@pytest.mark.parametrize('env,words', [
    ({'MIN_MIOU': 'abc'}, "MIN_MIOU must be a number (an mIoU between 0 and "
     "1), got 'abc'"),
    ({'STEPS': 'abc'}, "TRAIN_STEPS (from STEPS) must be a non-negative "
     "integer, got 'abc'"),
])
def test_demo_checks_its_settings_first(tmp_path, env, words):
  """MIN_MIOU=abc failed after training, eval, vis and export, with a
  Python traceback and 'mIoU below abc'; STEPS=abc after the conversion."""
  proc, commands = _run_demo(tmp_path, WORK=tmp_path / 'demo', **env)
  assert proc.returncode == 1
  assert words in proc.stderr, proc.stderr
  assert not commands


def test_demo_hands_a_signal_to_the_running_step(tmp_path):
  """A SIGTERM to demo.sh alone ended it at once (143) and left the
  training running as an orphan: the next demo found the logdir locked.
  The training step now gets it, ends first, then the demo."""
  log = tmp_path / 'log.txt'
  env = _with_stubs(
      tmp_path, fake_voc.script_env(RECORD=tmp_path / 'commands.txt',
                                    LOG=log, WORK=tmp_path / 'demo'),
      dict(dict.fromkeys(_DEMO_COMMANDS, _STUB),
           **{'deeplab-train': '#!/bin/bash\n' + _FAKE_COMMAND}))
  proc, _, _ = _signalled(
      ['bash', str(fake_voc.SCRIPTS / 'demo.sh')], env,
      lambda: log.exists() and 'started' in log.read_text())
  assert proc.returncode == -signal.SIGTERM
  assert log.read_text().splitlines() == ['started', 'TERM 1', 'done 1']


# A deeplab-train stand-in for launch_local_cluster.sh: each task logs the
# first signal it gets and its end to $EVENTS; a worker then stops, writing
# its result; the ps runs until killed. (In Python: a bash script started
# in the background has SIGINT ignored, and cannot trap it; deeplab-train
# installs its handler whatever it inherited.)
_CLUSTER_TASK = """#!/usr/bin/env python3
import os, signal, sys, time
flags = dict(a[2:].split('=', 1) for a in sys.argv[1:] if '=' in a)
me = flags['job_name'] + flags['task']
with open(os.path.join(os.environ['MARKS'], me), 'w') as f:
  f.write('%d %d' % (os.getpid(), os.getpgid(0)))
if me == os.environ.get('FAILING'):
  time.sleep(1)
  with open(flags['result_json'], 'w') as f:
    f.write('{"event": "result", "status": "bad_input"}\\n')
  sys.exit(2)
got = []
def on_signal(signum, frame):
  got.append(signal.Signals(signum).name[3:])
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
while not got or flags['job_name'] == 'ps':
  time.sleep(0.05)
def event(words):
  with open(os.environ['EVENTS'], 'a') as f:
    f.write('%s %s\\n' % (me, words))
event(got[0])
time.sleep(0.5)
with open(flags['result_json'], 'w') as f:
  f.write('{"event": "result", "stop_reason": "signal:SIG%s"}\\n' % got[0])
event('end')
"""


def _stub_cluster(tmp_path, **env):
  """(marks folder, WORK, environment) of launch_local_cluster.sh with
  _CLUSTER_TASK as deeplab-train and its records already built."""
  marks = tmp_path / 'marks'
  marks.mkdir()
  work = tmp_path / 'work'
  (work / 'tfrecord').mkdir(parents=True)
  (work / 'tfrecord' / 'dataset.json').write_text('{}')
  return marks, work, _with_stubs(
      tmp_path, fake_voc.script_env(WORK=work, MARKS=marks,
                                    EVENTS=tmp_path / 'events.txt', **env),
      {'deeplab-train': _CLUSTER_TASK,
       'deeplab-build-data': '#!/bin/sh\nexit 9\n'})


def test_local_cluster_ctrl_c_stops_the_chief_first(tmp_path):
  """A Ctrl-C (SIGINT to the script's process group) also reached the
  parameter server, which died at once: the chief could not write its
  final checkpoint, and no worker wrote its result. Only the chief now
  runs in the script's group; worker 1 and the ps are stopped after it."""
  marks, work, env = _stub_cluster(tmp_path)
  events = tmp_path / 'events.txt'
  proc, stdout, stderr = _signalled(
      ['bash', str(fake_voc.SCRIPTS / 'launch_local_cluster.sh')], env,
      lambda: len(os.listdir(marks)) == 3, signal.SIGINT, to_group=True)
  tasks = {name: (marks / name).read_text().split() for name in
           ('ps0', 'worker0', 'worker1')}
  assert proc.returncode == 130, (stdout, stderr)
  assert tasks['worker0'][1] == str(proc.pid)
  assert tasks['ps0'][1] != str(proc.pid) != tasks['worker1'][1]
  assert events.read_text().splitlines() == [
      'worker0 INT', 'worker0 end', 'worker1 TERM', 'worker1 end']
  for pid, _ in tasks.values():
    with pytest.raises(ProcessLookupError):
      os.kill(int(pid), 0)
  assert ('worker 0: {"event": "result", "stop_reason": "signal:SIGINT"}'
          in stdout), stdout
  assert 'worker 1: {"event": "result", "stop_reason": "signal:SIGTERM"}' in stdout


def test_local_cluster_holds_its_folder_and_its_tasks_die_with_it(tmp_path):
  """A second launch on the same WORK truncated the running one's logs and
  deleted its workers' results before its own chief was refused the
  logdir (exit 1); a kill -9 of the script left the chief running, waiting
  for the dead parameter server with the logdir locked."""
  marks, work, env = _stub_cluster(tmp_path)
  first = subprocess.Popen(
      ['bash', str(fake_voc.SCRIPTS / 'launch_local_cluster.sh')], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
  try:
    deadline = time.time() + 60
    while len(os.listdir(marks)) < 3:
      assert time.time() < deadline and first.poll() is None
      time.sleep(0.05)
    tasks = [int((marks / name).read_text().split()[0])
             for name in ('ps0', 'worker0', 'worker1')]
    (work / 'logs' / 'worker0.log').write_text('step 1\n')
    (work / 'result_worker1.json').write_text('{"event": "result"}\n')
    second = subprocess.Popen(
        ['bash', str(fake_voc.SCRIPTS / 'launch_local_cluster.sh')], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
      _, stderr = second.communicate(timeout=60)
    except subprocess.TimeoutExpired:
      os.killpg(second.pid, signal.SIGKILL)  # it started a cluster
      raise
    assert second.returncode == 75, stderr
    assert ('another launch is running in %s, or a task an earlier one '
            'left (lock %s/.lock;' % (work, work) in stderr), stderr
    assert (work / 'logs' / 'worker0.log').read_text() == 'step 1\n'
    assert (work / 'result_worker1.json').is_file()
    if subprocess.run(['setpriv', '--pdeathsig', 'KILL', 'true'],
                      check=False).returncode:
      return  # without setpriv, tasks outlive a kill -9 (the finally ends)

    first.kill()
    first.wait(timeout=30)
    deadline = time.time() + 30
    while any(_alive(pid) for pid in tasks):
      assert time.time() < deadline, [pid for pid in tasks if _alive(pid)]
      time.sleep(0.1)
  finally:
    if first.poll() is None:
      os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    for mark in marks.iterdir():  # the ps and worker 1 run apart
      with contextlib.suppress(ProcessLookupError):
        os.kill(int(mark.read_text().split()[0]), signal.SIGKILL)


def test_local_cluster_failing_worker_gives_its_status_and_results(
    tmp_path):
  """A worker refusing its flags (exit 2) ended the script with 1, and the
  workers' result lines were printed only on Ctrl-C or SIGTERM."""
  _, work, env = _stub_cluster(tmp_path, FAILING='worker1')
  # A relative WORK is the caller's (it was the repository's).
  env['WORK'] = 'work'
  proc = subprocess.run(
      ['bash', str(fake_voc.SCRIPTS / 'launch_local_cluster.sh')], env=env,
      cwd=tmp_path, capture_output=True, text=True, timeout=90, check=False)
  assert proc.returncode == 2, fake_voc.describe(proc)
  assert 'worker 1 failed, see %s/logs/worker1.log' % work in proc.stderr
  assert proc.stdout.splitlines() == [
      'worker 0: {"event": "result", "stop_reason": "signal:SIGTERM"}',
      'worker 1: {"event": "result", "status": "bad_input"}']


def _alive(pid):
  """Whether `pid` runs (a zombie does not: it is only waiting for init)."""
  try:
    with open('/proc/%d/stat' % pid) as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


@pytest.mark.parametrize('env,words', [
    ({'STEPS': '0'}, "STEPS must be an integer >= 1, got '0'"),
    ({'TIMEOUT': '0'}, "TIMEOUT must be an integer >= 1, got '0'"),
])
def test_local_cluster_settings_and_help(tmp_path, env, words):
  """--help started the cluster; STEPS=0 started it to fail in a log, and
  TIMEOUT=08 failed after starting it (read as octal)."""
  proc = fake_voc.run_script('launch_local_cluster.sh', '--help')
  assert proc.returncode == 0 and 'Usage:' in proc.stdout, proc.stderr
  assert not proc.stderr
  proc = fake_voc.run_script('launch_local_cluster.sh', env=fake_voc.script_env(
      WORK=tmp_path / 'work', **env))
  assert proc.returncode == 1
  assert words in proc.stderr, proc.stderr
  assert not (tmp_path / 'work').exists()


# ---------------------------------------------------------------------------
# download_and_convert_voc2012.sh
# ---------------------------------------------------------------------------
def _convert(work, *args, env=None):
  return fake_voc.run_script('download_and_convert_voc2012.sh', '--work_dir',
                             work, '--num_shards', '1', *args, env=env)


def _dataset_json(folder):
  return json.loads((pathlib.Path(folder) / 'dataset.json').read_text())


def test_wrong_checksum_extracts_nothing(tmp_path):
  tarball = tmp_path / 'voc.tar'
  fake_voc.make_voc_tarball(tarball, num_train=2, num_val=1)
  work = tmp_path / 'work'
  proc = _convert(work, '--checksum', '0' * 32, tarball)
  assert proc.returncode == 1
  assert 'checksum mismatch' in proc.stderr
  assert not (work / 'VOCdevkit').exists()
  assert not (work / 'tfrecord').exists()
  assert not any((work / '.done').iterdir())


@pytest.mark.parametrize('script', ['download_and_convert_voc2012.sh',
                                    'download_and_convert_ade20k.sh'])
@pytest.mark.parametrize('args,words', [
    (['--checksum', 'xyz'], "--checksum must be an MD5 (32 hex digits), "
     "SHA-1 (40) or SHA-256 (64), got 'xyz'"),
    (['--work_dir='], '--work_dir (WORK_DIR) is empty'),
    (['--num_shards', '0'], "NUM_SHARDS (--num_shards) must be an integer "
     ">= 1, got '0'"),
])
def test_download_options_are_checked_before_the_download(tmp_path, script,
                                                          args, words):
  """A malformed --checksum was refused after the download (gigabytes for
  VOC or ADE20K); an empty --work_dir made /.done at the root; 0 shards
  failed in deeplab-build-data, after the download and the extraction."""
  archive = tmp_path / 'archive.tar'
  archive.write_text('x' * 1000)
  work = tmp_path / 'work'
  proc = fake_voc.run_script(script, '--work_dir', work, *args,
                             'file://%s' % archive)
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert words in proc.stderr, proc.stderr
  assert 'download:' not in proc.stderr
  assert not work.exists()


def test_failed_conversion_leaves_nothing_that_looks_finished(tmp_path):
  root = tmp_path / 'VOC2012'
  splits = fake_voc.make_voc_root(root, num_train=2, num_val=2)
  (root / 'SegmentationClass' / ('%s.png' % splits['val'][1])).write_bytes(
      b'not a png')
  work = tmp_path / 'work'
  proc = _convert(work, root)
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert 'not a readable label' in proc.stderr
  assert not (work / 'tfrecord').exists()
  assert not (work / '.done' / 'tfrecord').exists()


def test_sbd_labels_add_train_aug(tmp_path):
  extra = fake_voc.sample_ids('train', 9)[6:]   # images without VOC labels
  root = tmp_path / 'VOC2012'
  splits = fake_voc.make_voc_root(root, num_train=3, num_val=2,
                                  extra_images=extra)
  sbd = tmp_path / 'sbd'
  sbd.mkdir()
  # SBD labels: the extra images, one VOC train image and one VOC val image.
  for image_id in extra + [splits['train'][0], splits['val'][0]]:
    shutil.copy(fake_voc.SAMPLE / 'SegmentationClass' / ('%s.png' % image_id),
                sbd)
  work = tmp_path / 'work'
  proc = _convert(work, '--sbd_labels', sbd, root)
  assert proc.returncode == 0, fake_voc.describe(proc)
  train_aug = (work / 'lists' / 'train_aug.txt').read_text().split()
  assert train_aug == sorted(extra + splits['train'])
  info = _dataset_json(work / 'tfrecord')
  assert info['splits_to_sizes']['train_aug'] == len(train_aug)
  assert info['splits_to_sizes']['val'] == 2
  # Re-run: every step skipped.
  again = _convert(work, '--sbd_labels', sbd, root)
  assert again.returncode == 0, fake_voc.describe(again)
  assert 'tfrecord: ' in again.stderr and 'built earlier, skipping' in again.stderr


# ---------------------------------------------------------------------------
# download_and_convert_ade20k.sh
# ---------------------------------------------------------------------------
def _ade20k_root(root, sizes=(('training', 3), ('validation', 2))):
  """A tiny ADEChallengeData2016 folder: JPEG images and label PNGs of
  values 0 (other) to 150 under images/ and annotations/ per split."""
  rng = np.random.default_rng(20261205)
  for folder, count in sizes:
    for sub in ('images', 'annotations'):
      (root / sub / folder).mkdir(parents=True)
    for i in range(count):
      stem = 'ADE_%s_%08d' % ('train' if folder == 'training' else 'val',
                              i + 1)
      height, width = (int(v) for v in rng.integers(20, 40, size=2))
      Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8)
                      ).save(root / 'images' / folder / (stem + '.jpg'))
      Image.fromarray(rng.integers(0, 151, (height, width), np.uint8), 'L'
                      ).save(root / 'annotations' / folder / (stem + '.png'))


def _ade20k_zip(path):
  """Zips a tiny ADEChallengeData2016 folder into `path`; returns its
  SHA-1."""
  staging = path.parent / (path.name + '.staging')
  _ade20k_root(staging / 'ADEChallengeData2016')
  with zipfile.ZipFile(path, 'w') as archive:
    for file in sorted(staging.rglob('*')):
      archive.write(file, file.relative_to(staging))
  shutil.rmtree(staging)
  return hashlib.sha1(path.read_bytes()).hexdigest()


def _convert_ade20k(work, *args):
  return fake_voc.run_script('download_and_convert_ade20k.sh', '--work_dir',
                             work, '--num_shards', '1', *args)


def test_ade20k_zip_converts_to_train_and_val(tmp_path):
  archive = tmp_path / 'ade.zip'
  sha1 = _ade20k_zip(archive)
  work = tmp_path / 'work'
  proc = _convert_ade20k(work, '--checksum', sha1.upper(), archive)
  assert proc.returncode == 0, fake_voc.describe(proc)
  info = _dataset_json(work / 'tfrecord')
  assert (info['name'], info['num_classes'], info['ignore_label']) == (
      'ade20k', 151, 0)
  assert info['splits_to_sizes'] == {'train': 3, 'val': 2}
  assert sorted(p.name for p in (work / 'tfrecord').glob('*.tfrecord')) == [
      'train-00000-of-00001.tfrecord', 'val-00000-of-00001.tfrecord']
  assert (work / 'ADEChallengeData2016' / 'images' / 'training').is_dir()
  # Re-run: every step skipped.
  again = _convert_ade20k(work, '--checksum', sha1, archive)
  assert again.returncode == 0, fake_voc.describe(again)
  assert 'extracted earlier, skipping' in again.stderr
  assert 'built earlier, skipping' in again.stderr


def test_ade20k_official_zip_name_is_checked_by_default(tmp_path):
  """A file named like the official zip is checked against its known
  SHA-1: this one is not it, so nothing is extracted."""
  archive = tmp_path / 'ADEChallengeData2016.zip'
  _ade20k_zip(archive)
  work = tmp_path / 'work'
  proc = _convert_ade20k(work, archive)
  assert proc.returncode == 1
  assert ('checksum mismatch for %s: expected '
          '219e1696abb36c8ba3a3afe7fb2f4b4606a897c7' % archive) in proc.stderr
  assert not (work / 'ADEChallengeData2016').exists()
  assert not (work / 'tfrecord').exists()


def test_ade20k_file_that_is_not_a_zip_is_refused(tmp_path):
  archive = tmp_path / 'ade.zip'
  archive.write_bytes(b'not a zip')
  work = tmp_path / 'work'
  proc = _convert_ade20k(work, archive)
  assert proc.returncode == 1
  assert 'File is not a zip file' in proc.stderr
  assert 'ERROR: cannot extract %s (not a zip file' % archive in proc.stderr
  assert 'Traceback' not in proc.stderr
  assert not (work / 'ADEChallengeData2016').exists()
  # Nor is the extraction's temp folder kept.
  assert not (work / '.extract.tmp').exists()


def test_ade20k_zip_without_the_dataset_is_refused(tmp_path):
  archive = tmp_path / 'other.zip'
  with zipfile.ZipFile(archive, 'w') as other:
    other.writestr('readme.txt', 'not ADE20K')
  work = tmp_path / 'work'
  proc = _convert_ade20k(work, archive)
  assert proc.returncode == 1
  assert 'ERROR: %s holds no ' % archive in proc.stderr, proc.stderr
  assert not (work / 'ADEChallengeData2016').exists()
  assert not (work / '.extract.tmp').exists()


def test_ade20k_folder_without_validation_labels_is_refused(tmp_path):
  root = tmp_path / 'ADEChallengeData2016'
  _ade20k_root(root, (('training', 2), ('validation', 0)))
  (root / 'annotations' / 'validation').rmdir()
  work = tmp_path / 'work'
  proc = _convert_ade20k(work, tmp_path)
  assert proc.returncode == 1
  assert ('%s/annotations/validation is missing' % root) in proc.stderr
  assert not (work / 'tfrecord').exists()


@pytest.mark.slow
def test_voc_pipeline_end_to_end(tmp_path):
  tarball = tmp_path / 'fake_VOCtrainval.tar'
  splits, md5 = fake_voc.make_voc_tarball(tarball, num_train=6, num_val=3)
  work = tmp_path / 'pascal_voc_seg'

  # Downloaded (a file:// URL), verified, extracted and converted.
  url = 'file://%s' % tarball
  proc = _convert(work, '--checksum', md5, url)
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert (work / 'fake_VOCtrainval.tar').is_file()
  info = _dataset_json(work / 'tfrecord')
  assert info['name'] == 'pascal_voc_seg' and info['num_classes'] == 21
  assert info['splits_to_sizes'] == {'train': 6, 'val': 3, 'trainval': 9}
  shards = sorted(p.name for p in (work / 'tfrecord').glob('*.tfrecord'))
  assert shards == ['train-00000-of-00001.tfrecord',
                    'trainval-00000-of-00001.tfrecord',
                    'val-00000-of-00001.tfrecord']
  before = {p: p.stat().st_mtime_ns for p in (work / 'tfrecord').iterdir()}

  # A custom tarball without a checksum is used, with a warning (the
  # records built from it above are kept: nothing else changed).
  proc = _convert(work, url)
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert 'unverified' in proc.stderr

  # local_test.sh (demo.sh --quick) on the same work dir: the conversion is
  # skipped, then train, eval, vis and export run on the tiny model.
  env = fake_voc.script_env(WORK_DIR=work, VOC_SOURCE=url, CHECKSUM=md5,
                            TRAIN_STEPS=1, TRAIN_SPLIT='train')
  proc = fake_voc.run_script('local_test.sh', env=env)
  assert proc.returncode == 0, fake_voc.describe(proc)
  for step in ('verify', 'extract', 'lists', 'tfrecord'):
    assert '%s: ' % step in proc.stderr
  assert proc.stderr.count('skipping') >= 4
  assert {p: p.stat().st_mtime_ns
          for p in (work / 'tfrecord').iterdir()} == before

  exp = work / 'exp' / 'mobilenet_v2'
  assert (exp / 'train' / 'model.ckpt-1.index').is_file()
  result = json.loads((exp / 'eval' / 'eval_result.json').read_text())
  assert result['global_step'] == 1 and result['num_images'] == 3
  assert 0.0 <= result['miou'] <= 1.0
  assert 'val mIoU %s' % result['miou'] in proc.stdout
  pictures = list((exp / 'vis').rglob('*.png'))
  assert len(pictures) >= len(splits['val'])
  frozen = exp / 'export' / 'frozen_inference_graph.pb'
  assert frozen.stat().st_size > 0
  assert b'ImageTensor' in frozen.read_bytes()
  assert b'SemanticPredictions' in frozen.read_bytes()


# ---------------------------------------------------------------------------
# cron_retrain.sh
# ---------------------------------------------------------------------------
class Cron:
  """Runs cron_retrain.sh on one data folder and work folder."""

  def __init__(self, tmp_path, cityscapes=False):
    self.data = tmp_path / 'data'
    self.work = tmp_path / 'work'
    self.settings = dict(STEPS_PER_RUN=1, KEEP_EXPORTS=1)
    if cityscapes:
      # The tiny Cityscapes tree, with the script's Cityscapes defaults.
      cityscapes_tree.write_reference_tree(str(self.data))
      self.settings.update(DATA_LAYOUT='cityscapes')
    else:
      fake_voc.make_voc_root(self.data, num_train=6, num_val=3)
      self.settings.update(DATASET_NAME='shapes', NUM_CLASSES=5)
    self.current = self.work / 'exports' / 'current'

  def run(self, **env):
    settings = dict(self.settings, **env)
    proc = fake_voc.run_script(
        'cron_retrain.sh', '--data_dir', self.data, '--work_dir', self.work,
        env=fake_voc.script_env(**settings))
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    return proc, summary

  def current_target(self):
    return os.readlink(self.current)

  def metrics(self):
    return json.loads((self.current / 'metrics.json').read_text())

  def log_of(self, summary):
    return pathlib.Path(summary['log']).read_text()


def _assert_rule_followed(summary, margin, before, cron):
  """Promoted iff mIoU did not drop by more than the margin."""
  if summary['miou'] >= summary['current_miou'] - margin:
    assert summary['status'] == 'promoted', summary
    assert cron.current_target() != before
  else:
    assert summary['status'] == 'kept', summary
    assert cron.current_target() == before


@pytest.mark.slow
def test_cron_retrain_rounds(tmp_path):
  cron = Cron(tmp_path)

  # 1: first round builds, trains 1 step, evaluates and promotes.
  proc, summary = cron.run()
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert summary['status'] == 'promoted' and summary['global_step'] == 1
  first = cron.current_target()
  assert first.endswith('-step1')
  export = cron.current
  assert (export / 'frozen_inference_graph.pb').stat().st_size > 0
  assert (export / 'saved_model' / 'saved_model.pb').is_file()
  assert (export / 'checkpoint' / 'model.ckpt-1.index').is_file()
  assert cron.metrics()['global_step'] == 1
  assert cron.metrics()['miou'] == pytest.approx(summary['miou'])
  assert json.loads((cron.work / 'last_run.json').read_text()) == summary
  records = os.readlink(cron.work / 'tfrecord')

  # 2: new data -> rebuilt TFRecords, 1 more step from the checkpoint, the
  # current model re-measured on the new data, then the margin rule.
  fake_voc.copy_pair(fake_voc.sample_ids('val', 4)[3], cron.data)
  with open(cron.data / 'ImageSets' / 'Segmentation' / 'val.txt', 'a') as f:
    f.write(fake_voc.sample_ids('val', 4)[3] + '\n')
  proc, summary = cron.run(MIOU_MARGIN=0.005)
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert summary['global_step'] == 2
  assert os.readlink(cron.work / 'tfrecord') != records
  assert 're-evaluating' in cron.log_of(summary)
  _assert_rule_followed(summary, 0.005, first, cron)
  exports = [p for p in (cron.work / 'exports').iterdir()
             if not p.is_symlink()]
  assert len(exports) == 1   # KEEP_EXPORTS=1, and `current` is among them
  second = cron.current_target()

  # 3: the current model is (pretend) far better: the new one is kept.
  metrics = cron.metrics()
  metrics['miou'] = 1.0
  metrics['data_fingerprint'] = (
      cron.work / 'state' / 'built.fingerprint').read_text().strip()
  (cron.current / 'metrics.json').write_text(json.dumps(metrics))
  proc, summary = cron.run(MIOU_MARGIN=0.005)
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert summary['status'] == 'kept' and summary['global_step'] == 3
  assert cron.current_target() == second

  # 4: data unchanged, training only on new data: nothing to do. A round
  # killed with kill -9 while a command ran left that command's output in
  # memory (/dev/shm) until the machine restarted.
  shm = ('/dev/shm' if os.access('/dev/shm', os.W_OK)
         else os.environ.get('TMPDIR', '/tmp'))
  left = pathlib.Path(shm) / ('cron_retrain.sh.%d.Ab12Cd' % tt.dead_pid())
  left.write_text('{"event": "result", "message": "stopped at step 3"}\n')
  # And the temp links of symlink switches it interrupted.
  switching = [cron.work / '.tfrecord.tmp.12345',
               cron.work / 'exports' / '.current.tmp.12345']
  for link in switching:
    link.symlink_to('gone')
  proc, summary = cron.run(TRAIN_ONLY_ON_NEW_DATA=1)
  assert proc.returncode == 10, fake_voc.describe(proc)
  assert summary['status'] == 'nothing_to_do'
  assert not left.exists()
  assert not [link for link in switching if os.path.lexists(link)]
  assert ('left its command\'s output in %s, removed now: {"event": '
          '"result", "message": "stopped at step 3"}' % left) in cron.log_of(
              summary)

  # 5: another run holds the lock: busy, nothing touched.
  with open(cron.work / 'cron.lock', 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    proc, summary = cron.run()
  assert proc.returncode == 75, fake_voc.describe(proc)
  assert summary['status'] == 'busy'
  assert cron.current_target() == second

  # 6: a broken label in the data folder: failure, current model and
  # TFRecords untouched.
  records = os.readlink(cron.work / 'tfrecord')
  label = next((cron.data / 'SegmentationClass').glob('*.png'))
  label.write_bytes(b'broken')
  proc, summary = cron.run()
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['status'] == 'failed'
  assert 'deeplab-build-data failed' in summary['message']
  assert label.name in summary['message'], summary   # what the build said
  assert cron.current_target() == second
  assert (cron.current / 'frozen_inference_graph.pb').is_file()
  assert os.readlink(cron.work / 'tfrecord') == records
  assert not list((cron.work / 'tfrecords').glob('.tmp-*'))


@pytest.mark.slow
def test_cron_failing_after_a_switch_and_a_repeated_stamp(tmp_path):
  """Found by an audit with a full disk and a clock set back:
  - a round failing after it had switched exports/current (recording its
    decision on a full disk) said 'failed' with the current model
    'untouched', and the reason was only in a traceback in the log; the
    same after the switch of the `tfrecord` link to new records;
  - a round with the stamp of the records in use moved its new records
    into the old folder and trained on the old ones from then on."""
  cron = Cron(tmp_path)
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  # The clock gives the same second to both rounds.
  (bin_dir / 'date').write_text(
      '#!/bin/bash\n[[ $1 == +%Y%m%d-%H%M%S ]] && exec echo 20261025-020000\n'
      'exec /bin/date "$@"\n')
  # The policy cannot write (a full disk) when it answers $FAIL_ON.
  (bin_dir / 'python').write_text(
      '#!/bin/bash\nif [[ " $* " == *" $FAIL_ON "* ]]; then\n'
      "  ulimit -f 0; trap '' XFSZ\nfi\nexec %s \"$@\"\n" % sys.executable)
  for stub in bin_dir.iterdir():
    stub.chmod(0o755)
  stubs = dict(PYTHON=bin_dir / 'python', PATH='%s%s%s' % (
      bin_dir, os.pathsep, fake_voc.script_env()['PATH']))
  cannot_write = ("the retraining policy could not keep its answer to %r: "
                  'cannot write %s: File too large; free space on that disk '
                  'or make it writable; ')
  proc, summary = cron.run(FAIL_ON='built', **stubs)
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['message'] == cannot_write % (
      'built', cron.work / 'state' / 'built.fingerprint') + (
          'the new TFRecords were put in use before this (tfrecord -> '
          'tfrecords/20261025-020000)')
  # The data are converted again, with the same stamp.
  proc, summary = cron.run(FAIL_ON='conclude', **stubs)
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['status'] == 'failed'
  assert cron.current_target() == '20261025-020000-step1'
  assert summary['message'] == cannot_write % (
      'conclude', cron.work / 'state' / 'decided') + (
          'the new model was promoted before this (exports/current -> '
          '20261025-020000-step1)')
  records = os.readlink(cron.work / 'tfrecord')
  assert records.startswith('tfrecords/20261025-020000-'), records
  assert sorted(os.listdir(cron.work / 'tfrecords')) == [
      os.path.basename(records)]
  assert (cron.work / records / 'dataset.json').is_file()


def _run_with_failing(cron, tmp_path, command, argument, message):
  """A cron round in which `command` fails (saying `message`) when one of
  its arguments contains `argument`; (process, summary)."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  stub = bin_dir / command
  stub.write_text(
      '#!/bin/bash\nif [[ " $* " == *"%s"* ]]; then\n'
      '  echo "%s" >&2; exit 1\nfi\nexec /bin/%s "$@"\n'
      % (argument, message, command))
  stub.chmod(0o755)
  return cron.run(PATH='%s%s%s' % (
      bin_dir, os.pathsep, fake_voc.script_env()['PATH']))


def test_cron_unexpected_failure_names_the_command_in_the_summary(tmp_path):
  """A command the script runs unguarded failing (set -e ends the round)
  gave a summary line with no message at all."""
  cron = Cron(tmp_path)
  proc, summary = _run_with_failing(cron, tmp_path, 'mv', '/.tmp-',
                                    'mv: cannot move: Permission denied')
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['status'] == 'failed'
  assert re.fullmatch(
      r'unexpected error \(exit status 1 at cron_retrain\.sh line \d+: '
      r'mv -T .*\), see the log', summary['message']), summary
  assert 'Permission denied' in cron.log_of(summary)


def test_cron_work_folder_that_cannot_be_made_still_gives_the_summary(
    tmp_path):
  """A work subfolder that mkdir cannot make (a file in its place, a full
  disk, a read-only file system) ended the round under set -e before its
  log and its trap: exit 1, no summary line, only mkdir's on stderr."""
  cron = Cron(tmp_path)
  cron.work.mkdir()
  (cron.work / 'eval').write_text('in the way')
  proc, summary = cron.run()
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['status'] == 'failed', proc.stdout
  assert summary['message'].startswith(
      "cannot create the round's folders (mkdir: cannot create directory "), (
          summary)
  assert summary['message'].endswith(
      ': free space, make %s writable, or move what is in the way; nothing '
      'else was done' % cron.work), summary
  assert (cron.work / 'eval').read_text() == 'in the way'
  assert not (cron.work / 'tfrecord').exists()
  # The work folder itself: the message said the lock and the log could
  # not be opened, not why.
  (tmp_path / 'a_file').write_text('')
  proc = fake_voc.run_script(
      'cron_retrain.sh', '--data_dir', cron.data, '--work_dir',
      tmp_path / 'a_file' / 'work', env=fake_voc.script_env(**cron.settings))
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert (proc.returncode, summary['status']) == (1, 'failed')
  assert summary['message'].startswith(
      'cannot create the work folder (mkdir: cannot create directory '), (
          summary)


@pytest.mark.slow
def test_cron_failed_switch_leaves_no_unpublished_export(tmp_path):
  """The promotion's export renamed into exports/, then the switch of
  `current` failed: the complete export, never published, stayed, and a
  later round kept it among KEEP_EXPORTS and deleted the published one. The
  summary named the line in cron_retrain.sh, where it was common.sh's."""
  cron = Cron(tmp_path)
  proc, summary = _run_with_failing(cron, tmp_path, 'mv', '/.current.tmp.',
                                    'mv: No space left on device')
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert re.fullmatch(
      r'unexpected error \(exit status 1 at common\.sh line \d+: '
      r'mv -T .*\), see the log', summary['message']), summary
  # Its temp link is left for the next round to remove, nothing else.
  assert [n for n in os.listdir(cron.work / 'exports')
          if not n.startswith('.current.tmp.')] == []


@pytest.mark.slow
def test_cron_promotes_the_best_checkpoint(tmp_path):
  cron = Cron(tmp_path)
  # A zero learning rate keeps the weights, so every validation scores the
  # same mIoU and best/ keeps the first (a tie is no improvement): the best
  # checkpoint is step 1, the latest step 3.
  validating = dict(BASE_LEARNING_RATE=0, STEPS_PER_RUN=3,
                    TRAIN_EXTRA_FLAGS='--eval_interval_steps=1')
  proc, summary = cron.run(**validating)
  assert proc.returncode == 0, fake_voc.describe(proc)
  train = cron.work / 'train'
  best = json.loads((train / 'best' / 'best.json').read_text())
  assert best['step'] == 1
  assert 'model.ckpt-3' in (train / 'checkpoint').read_text()
  assert summary['status'] == 'promoted' and summary['global_step'] == 1
  assert summary['candidate_source'] == 'best'
  assert 'training validates' in summary['candidate_reason']
  assert cron.metrics()['global_step'] == best['step']
  assert cron.current_target().endswith('-step1')
  assert sorted(p.name for p in (cron.current / 'checkpoint').iterdir()) == [
      'checkpoint', 'deeplab_config.json', 'model.ckpt-1.data-00000-of-00001',
      'model.ckpt-1.index']
  log = cron.log_of(summary)
  assert ('candidate: checkpoint step 1 of best/, %s (the latest is step 3)'
          % (train / 'best' / 'model.ckpt-1')) in log
  assert '--checkpoint_path=%s' % (train / 'best' / 'model.ckpt-1') in log

  # Nothing new to train or judge: best/'s step 1 was decided (the latest,
  # step 3, never was, but it is not the candidate).
  proc, summary = cron.run(TRAIN_ONLY_ON_NEW_DATA=1, **validating)
  assert proc.returncode == 10, fake_voc.describe(proc)
  assert summary['message'] == ('data unchanged, no steps to train, '
                                'checkpoint step 1 of best/ already evaluated')

  # CANDIDATE=best without validation is a bad setting.
  proc, summary = cron.run(CANDIDATE='best')
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['status'] == 'failed'
  assert '--eval_interval_steps=N to TRAIN_EXTRA_FLAGS' in summary['message']
  assert cron.current_target().endswith('-step1')


@pytest.mark.slow
def test_cron_retrains_on_a_cityscapes_root(tmp_path):
  """DATA_LAYOUT=cityscapes: the root is converted with --cityscapes_root
  (train and val, as Cityscapes with its 19 classes by default), trained,
  evaluated on val and promoted; unchanged, it is not converted again."""
  cron = Cron(tmp_path, cityscapes=True)
  proc, summary = cron.run()
  assert proc.returncode == 0, fake_voc.describe(proc)
  assert summary['status'] == 'promoted' and summary['global_step'] == 1
  dataset = json.loads((cron.work / 'tfrecord' / 'dataset.json').read_text())
  assert (dataset['name'], dataset['num_classes']) == ('cityscapes', 19)
  assert dataset['splits_to_sizes'] == {'train': 5, 'val': 2}
  assert '--cityscapes_root=%s' % cron.data in cron.log_of(summary)
  assert (cron.current / 'frozen_inference_graph.pb').is_file()

  proc, summary = cron.run(TRAIN_ONLY_ON_NEW_DATA=1)
  assert proc.returncode == 10, fake_voc.describe(proc)
  assert summary['status'] == 'nothing_to_do'

  # A split folder gone: the round fails before converting anything.
  missing = cron.data / 'gtFine' / 'val'
  shutil.rmtree(missing)
  proc, summary = cron.run()
  assert proc.returncode == 1, fake_voc.describe(proc)
  assert summary['message'].startswith(
      '%s is missing (expected a Cityscapes root' % missing)


_FAKE_COMMAND = '''
count=0
trap 'count=$((count + 1)); echo "TERM $count" >> "$LOG"' TERM
echo started >> "$LOG"
for ((i = 0; i < 100; i++)); do
  sleep 0.1
  if ((count)); then break; fi
done
sleep 0.3
echo "done $count" >> "$LOG"
'''


@pytest.mark.parametrize('caller_trap,code,last', [
    ('trap "echo trapped >> \\"\\$LOG\\"; exit 7" TERM', 7, ['trapped']),
    ('', -signal.SIGTERM, []),
])
def test_run_hands_a_signal_on_and_waits_for_the_command(tmp_path,
                                                         caller_trap, code,
                                                         last):
  """common.sh's `run` (every script's commands): a SIGTERM to the script
  alone reached neither deeplab-train, which trained on (or the script
  waited for it, with a trap set), nor a script without a trap, which
  exited at once. The command now gets it once and ends first; then the
  signal ends the script as it would have."""
  log = tmp_path / 'log.txt'
  (tmp_path / 'command.sh').write_text(_FAKE_COMMAND)
  (tmp_path / 'script.sh').write_text(
      'set -euo pipefail\nsource %s\n%s\nrun bash %s\necho after >> "$LOG"\n'
      % (fake_voc.SCRIPTS / 'common.sh', caller_trap,
         tmp_path / 'command.sh'))
  proc, _, _ = _signalled(
      ['bash', str(tmp_path / 'script.sh')], dict(os.environ, LOG=str(log)),
      lambda: log.exists() and 'started' in log.read_text())
  assert proc.returncode == code
  assert log.read_text().splitlines() == ['started', 'TERM 1', 'done 1'] + last
