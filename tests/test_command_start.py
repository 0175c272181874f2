"""What every deeplab-* command answers before TensorFlow loads.

Importing TensorFlow takes seconds. --help, a flag absl cannot parse and a
missing required flag need none of it, so a cron job with a typo, or a user
asking for help, gets the answer at once. Each case runs the command as its
console script does (setup.cfg's entry points) in a process of its own, and
the process reports at exit whether TensorFlow was imported.
"""
import configparser
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import train_testing as tt

# Printed at exit by every process below: was TensorFlow imported?
_MARK = 'tensorflow imported: '
_PROBE = '''
import atexit, importlib, sys
atexit.register(lambda: sys.stderr.write(
    '%s%%s\\n' %% ('tensorflow' in sys.modules)))
module, function = sys.argv.pop(1).split(':')
sys.argv[0] = sys.argv.pop(1)
getattr(importlib.import_module(module), function)()
''' % _MARK


def _entry_points():
  """{command: 'module:function'} of setup.cfg's console scripts."""
  cfg = configparser.ConfigParser()
  cfg.read(tt.REPO / 'setup.cfg')
  lines = cfg['options.entry_points']['console_scripts'].strip().splitlines()
  return dict(tuple(part.strip() for part in line.split('='))
              for line in lines)


ENTRY_POINTS = _entry_points()
# Commands with a required flag (deeplab-build-data: its input folders,
# whose defaults are the original's VOC layout, missing here). deeplab-bench
# runs a benchmark of its defaults when given none.
NEEDS_A_FLAG = sorted(set(ENTRY_POINTS) - {'deeplab-bench'})


def _start(command, *args):
  proc = subprocess.run(
      [sys.executable, '-c', _PROBE, ENTRY_POINTS[command], command]
      + list(args), capture_output=True, text=True, env=tt.subprocess_env(),
      timeout=120)
  marks = [line for line in proc.stderr.splitlines()
           if line.startswith(_MARK)]
  assert marks, proc.stderr[-2000:]
  return proc, marks[-1] == _MARK + 'True'


def test_every_console_script_is_covered():
  assert sorted(ENTRY_POINTS) == [
      'deeplab-bench', 'deeplab-build-data', 'deeplab-eval',
      'deeplab-export', 'deeplab-stats', 'deeplab-train', 'deeplab-vis']


@pytest.mark.parametrize('command', sorted(ENTRY_POINTS))
def test_help_answers_without_tensorflow(command):
  proc, imported = _start(command, '--help')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.startswith(command + ':'), proc.stdout[:300]
  assert '\nflags:\n' in proc.stdout, proc.stdout[-2000:]
  assert not imported, '%s --help imported TensorFlow' % command
  # Its usage examples can be pasted into a shell (a raw docstring printed
  # '\\' at the line ends).
  assert not re.search(r'\\\\$', proc.stdout, re.M), proc.stdout[:1500]


def test_export_help_shows_the_original_exports_output_stride():
  """The original export_model.py's --output_stride defaults to 8 (its
  train, eval and vis: 16); deeplab-export uses 8 for a checkpoint
  without saved options, and its --help says so."""
  proc, _ = _start('deeplab-export', '--help')
  assert proc.returncode == 0, proc.stderr[-2000:]
  shown = proc.stdout.split('  --output_stride:', 1)[1].split('\n  --', 1)[0]
  assert "(default: '8')" in shown, shown
  proc, _ = _start('deeplab-eval', '--help')
  shown = proc.stdout.split('  --output_stride:', 1)[1].split('\n  --', 1)[0]
  assert "(default: '16')" in shown, shown


@pytest.mark.parametrize('command', sorted(ENTRY_POINTS))
def test_an_unknown_flag_exits_2_without_tensorflow(command):
  proc, imported = _start(command, '--no_such_flag=1')
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines()
            if 'no_such_flag' in line]
  assert errors and errors[0].startswith(command + ': '), proc.stderr
  # The result line a script reads (only deeplab-train printed one).
  assert json.loads(proc.stdout.splitlines()[-1]) == dict(
      json.loads(proc.stdout.splitlines()[-1]), event='result',
      status='bad_input', message="Unknown command line flag 'no_such_flag'")
  assert not imported, '%s imported TensorFlow for a bad flag' % command


@pytest.mark.parametrize('command', ['deeplab-eval', 'deeplab-train'])
def test_a_flagfile_that_cannot_be_read_is_named(command, tmp_path):
  missing = tmp_path / 'run.flags'
  proc, imported = _start(command, '--flagfile=%s' % missing)
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines()
            if line.startswith(command + ': ')]
  assert errors == ['%s: cannot read a --flagfile: [Errno 2] No such file '
                    "or directory: '%s' (see --help)" % (command, missing)]
  assert not imported


@pytest.mark.parametrize('command', NEEDS_A_FLAG)
def test_a_missing_required_flag_exits_2_without_tensorflow(command):
  proc, imported = _start(command)
  assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['status'] == 'bad_input', result
  # The message names the flag to give.
  assert '--' in result['message'], result
  assert not imported, '%s imported TensorFlow for a missing flag' % command


# As _PROBE, with a signal (its name in argv[1]) sent to the process while
# the entry point imports the command's own module.
_SIGNALLED_PROBE = '''
import atexit, importlib, os, signal, sys
atexit.register(lambda: sys.stderr.write(
    '%s%%s\\n' %% ('tensorflow' in sys.modules)))
module, function = sys.argv.pop(1).split(':')
sys.argv[0] = sys.argv.pop(1)
signum = getattr(signal, sys.argv.pop(1))
entry_point = getattr(importlib.import_module(module), function)
real_import = importlib.import_module
def import_signalled(name, *args):
  if name.startswith('deeplab_train.cli.'):
    importlib.import_module = real_import
    os.kill(os.getpid(), signum)
  return real_import(name, *args)
importlib.import_module = import_signalled
entry_point()
''' % _MARK


@pytest.mark.parametrize('command,signame', [
    (command, 'SIGINT' if command == 'deeplab-stats' else 'SIGTERM')
    for command in sorted(set(ENTRY_POINTS) - {'deeplab-train'})])
def test_a_signal_while_the_command_loads_stops_it_with_its_result(
    command, signame):
  """A SIGTERM in a command's first quarter second (its modules imported,
  before its handlers) ended it without a result line; kept until its
  work begins, it stops it there (deeplab-train: cli/launch.train)."""
  module, function = ENTRY_POINTS[command].split(':')
  proc = subprocess.run(
      [sys.executable, '-c', _SIGNALLED_PROBE, '%s:%s' % (module, function),
       command, signame],
      capture_output=True, text=True, env=tt.subprocess_env(), timeout=120)
  code = {'SIGTERM': 143, 'SIGINT': 130}[signame]
  assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
  assert json.loads(proc.stdout.splitlines()[-1]) == dict(
      event='result', status={143: 'terminated', 130: 'interrupted'}[code],
      message='stopped by %s' % signame), proc.stdout
  assert '%s: stopped by %s' % (command, signame) in proc.stderr.splitlines()
  # Stopped before its work: TensorFlow was not loaded.
  assert proc.stderr.splitlines()[-1] == _MARK + 'False', proc.stderr


def test_a_signal_while_the_flags_parse_stops_a_command_run_as_a_module():
  """`python -m deeplab_train.cli.NAME` (deeplab-bench starts its children
  so) does not go through the console script: a SIGTERM while its flags
  parsed ended it without a result line."""
  script = textwrap.dedent('''
      import os, signal, sys
      from deeplab_train.cli import app
      from deeplab_train.cli import stats
      real = app.flag_parser
      def parser(command, on_bad_flags=None):
        parse = real(command, on_bad_flags)
        def signalled(argv):
          os.kill(os.getpid(), signal.SIGTERM)
          return parse(argv)
        return signalled
      app.flag_parser = parser
      sys.argv = ['deeplab-stats', '--dataset_dir=/nonexistent']
      stats.run()
      ''')
  proc = subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, env=tt.subprocess_env(), timeout=120)
  assert proc.returncode == 143, (proc.returncode, proc.stderr[-2000:])
  assert json.loads(proc.stdout.splitlines()[-1])['status'] == 'terminated'


# The flags each of the original's commands defines, read off its
# common.py (every command imports it), train.py, eval.py, vis.py and
# export_model.py. A command line or flagfile written for the original
# must parse here too.
_ORIGINAL_COMMON_FLAGS = (
    'add_image_level_feature aspp_convs_filters aspp_with_batch_norm '
    'aspp_with_concat_projection aspp_with_separable_conv '
    'aspp_with_squeeze_and_excitation batch_norm_decay decoder_filters '
    'decoder_output_is_logits decoder_output_stride '
    'decoder_use_separable_conv decoder_use_sum_merge '
    'dense_prediction_cell_json depth_multiplier divisible_by '
    'image_pooling_crop_size image_pooling_stride image_pyramid '
    'image_se_uses_qsigmoid keep_aspect_ratio label_weights '
    'logits_kernel_size max_resize_value merge_method min_resize_value '
    'model_variant multi_grid nas_remove_os32_stride '
    'nas_stem_output_num_conv_filters nas_use_classification_head '
    'prediction_with_upsampled_logits resize_factor use_bounded_activation'
).split()
_ORIGINAL_FLAGS = {
    'deeplab-train': (
        'adam_epsilon adam_learning_rate atrous_rates base_learning_rate '
        'clone_on_cpu dataset dataset_dir decay_steps drop_path_keep_prob '
        'end_learning_rate fine_tune_batch_norm hard_example_mining_step '
        'initialize_last_layer last_layer_gradient_multiplier '
        'last_layers_contain_logits_only learning_policy learning_power '
        'learning_rate_decay_factor learning_rate_decay_step log_steps '
        'master max_scale_factor min_scale_factor momentum num_clones '
        'num_ps_tasks num_replicas optimizer output_stride profile_logdir '
        'quantize_delay_step save_interval_secs save_summaries_images '
        'save_summaries_secs scale_factor_step_size slow_start_learning_rate '
        'slow_start_step startup_delay_steps task tf_initial_checkpoint '
        'top_k_percent_pixels train_batch_size train_crop_size train_logdir '
        'train_split training_number_of_steps upsample_logits weight_decay'),
    'deeplab-eval': (
        'add_flipped_images atrous_rates checkpoint_dir dataset dataset_dir '
        'eval_batch_size eval_crop_size eval_interval_secs eval_logdir '
        'eval_scales eval_split master max_number_of_evaluations '
        'output_stride quantize_delay_step'),
    'deeplab-vis': (
        'add_flipped_images also_save_raw_predictions atrous_rates '
        'checkpoint_dir colormap_type dataset dataset_dir eval_interval_secs '
        'eval_scales master max_number_of_iterations output_stride '
        'quantize_delay_step vis_batch_size vis_crop_size vis_logdir '
        'vis_split'),
    'deeplab-export': (
        'add_flipped_images atrous_rates checkpoint_path crop_size '
        'export_path inference_scales num_classes output_stride '
        'quantize_delay_step save_inference_graph'),
}


@pytest.mark.parametrize('command', sorted(_ORIGINAL_FLAGS))
def test_every_flag_of_the_original_command_is_defined(command):
  proc, imported = _start(command, '--helpfull')
  assert proc.returncode == 0, proc.stderr[-2000:]
  defined = set(re.findall(r'^\s+--(?:\[no\])?(\w+):', proc.stdout, re.M))
  wanted = _ORIGINAL_COMMON_FLAGS + _ORIGINAL_FLAGS[command].split()
  missing = [name for name in wanted if name not in defined]
  assert not missing, '%s lacks the original\'s %s' % (command, missing)
  assert not imported


@pytest.mark.parametrize('flag,fix', [
    ('--eval_scales=0.5', 'give --inference_scales'),
    ('--checkpoint_dir=/nonexistent', 'give --checkpoint_path'),
    ('--exported_model=/nonexistent.pb', 'it exports a checkpoint'),
    ('--eval_interval_secs=10', 'it exports one checkpoint, once'),
])
def test_export_refuses_the_flags_of_eval_and_vis(flag, fix):
  """Defined for eval and vis beside it, they were accepted and ignored
  (--eval_scales=0.5 --eval_scales=0.75 exported one scale)."""
  proc, imported = _start('deeplab-export', flag,
                          '--checkpoint_path=/nonexistent/model.ckpt-1',
                          '--export_path=/nonexistent/frozen.pb')
  assert proc.returncode == 2, proc.stderr[-2000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['message'].startswith(
      '%s is not a flag of deeplab-export: %s' % (flag.split('=')[0], fix))
  assert not imported


@pytest.mark.parametrize('command', ['deeplab-eval', 'deeplab-export',
                                     'deeplab-vis'])
@pytest.mark.parametrize('flag,message', [
    ('--quantize_delay_step=0',
     '--quantize_delay_step=0: quantised models are not supported'),
    ('--master=grpc://evaluator:2222',
     '--master=grpc://evaluator:2222: %s runs in its own process'),
])
def test_inference_commands_refuse_what_they_cannot_honour(command, flag,
                                                           message):
  """Before looking at any file (none of these exists) and without
  TensorFlow; the defaults (-1, empty) pass (the other tests' runs)."""
  proc, imported = _start(
      command, flag, '--checkpoint_dir=/nonexistent',
      '--checkpoint_path=/nonexistent/model.ckpt-1',
      '--dataset_dir=/nonexistent', '--vis_logdir=/nonexistent/vis',
      '--export_path=/nonexistent/frozen.pb', '--undefok=checkpoint_dir,'
      'checkpoint_path,dataset_dir,vis_logdir,export_path')
  assert proc.returncode == 2, proc.stderr[-2000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['status'] == 'bad_input'
  assert result['message'].startswith(
      message % command if '%s' in message else message), result
  assert not imported


_RUN = '''
import importlib, sys
module, function = sys.argv.pop(1).split(':')
sys.argv[0] = sys.argv.pop(1)
getattr(importlib.import_module(module), function)()
'''


@pytest.mark.skipif(not os.path.exists('/dev/full'),
                    reason='needs /dev/full (a file every write fails on)')
@pytest.mark.parametrize('command, args', [
    ('deeplab-stats', ['--dataset_dir=/nonexistent/records']),
    ('deeplab-train', ['--no_such_flag=1']),
    ('deeplab-train', ['--train_logdir=/nonexistent/log',
                       '--dataset_dir=/nonexistent/records']),
])
def test_a_stderr_that_cannot_be_written_keeps_the_result_line(
    command, args, tmp_path):
  """2>log on a full disk: the error line's OSError escaped the error
  handling, and the command ended without its result line, exit 1 (a
  cron round then said only 'failed with exit status 1')."""
  with open('/dev/full', 'w') as full:
    proc = subprocess.run(
        [sys.executable, '-c', _RUN, ENTRY_POINTS[command], command] + args,
        stdout=subprocess.PIPE, stderr=full, text=True,
        env=tt.subprocess_env(), timeout=120, cwd=str(tmp_path))
  lines = [json.loads(l) for l in proc.stdout.splitlines()
           if l.startswith('{')]
  assert (proc.returncode, [l['status'] for l in lines]) == (
      2, ['bad_input']), proc.stdout[-2000:]
