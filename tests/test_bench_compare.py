"""deeplab-bench --compare_original: log parsers, figures, CPU features, the
alternating runs (with stand-in trainers) and the command's errors."""
import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from deeplab_train import config
from deeplab_train.bench import compare
from deeplab_train.cli import signals
from deeplab_train.runtime import cpu as cpu_lib

import timeouts

# Log lines verbatim, as long as the trainers print them.
# pylint: disable=line-too-long
# What the original prints with --log_steps=1: TensorFlow's logger writes
# each line twice (plain and with absl's prefix), among other lines.
ORIGINAL_LOG = """\
W1130 16:14:47.101010 139974668217216 deprecation.py:50] From train.py:300
INFO:tensorflow:Starting Queues.
I1130 16:14:49.193523 139974668217216 learning.py:760] Starting Queues.
INFO:tensorflow:global step 1: loss = 3.3264 (1.416 sec/step)
I1130 16:14:50.663903 139974668217216 learning.py:511] global step 1: loss = 3.3264 (1.416 sec/step)
INFO:tensorflow:global step 2: loss = 3.3278 (0.071 sec/step)
I1130 16:14:50.786319 139974668217216 learning.py:511] global step 2: loss = 3.3278 (0.071 sec/step)
INFO:tensorflow:global step 3: loss = 3.3549 (0.070 sec/step)
I1130 16:14:50.856791 139974668217216 learning.py:511] global step 3: loss = 3.3549 (0.070 sec/step)
INFO:tensorflow:global step 4: loss = 3.3175 (0.072 sec/step)
I1130 16:14:50.928510 139974668217216 learning.py:511] global step 4: loss = 3.3175 (0.072 sec/step)
INFO:tensorflow:Stopping Training.
I1130 16:14:50.928848 139974668217216 learning.py:769] Stopping Training.
"""

# What deeplab-train's ProgressHook prints with --log_steps=1.
OURS_LOG = """\
I1130 16:13:57.327133 140628935715712 run.py:245] Training mobilenet_v2 from step 0 to 4: batch 2 on 1 tower(s), crop (65, 65), output stride 16
I1130 16:13:59.317998 140628935715712 hooks.py:184] Saved checkpoint /tmp/x/model.ckpt-0
I1130 16:14:00.671272 140628935715712 hooks.py:216] step 1/4  loss 3.3696  lr 0.0001
I1130 16:14:00.714843 140628935715712 hooks.py:223] step 2/4  loss 3.3717  lr 7.72e-05  0.0435 s/step  46 images/s  ETA 0:00:00
I1130 16:14:00.750091 140628935715712 hooks.py:223] step 3/4  loss 3.3766  lr 5.36e-05  0.0353 s/step  56.7 images/s  ETA 0:00:00
I1130 16:14:00.785713 140628935715712 hooks.py:223] step 4/4  loss 3.3187  lr 2.87e-05  0.0356 s/step  56.2 images/s  ETA 0:00:00
{"checkpoint": "/tmp/x/model.ckpt-4", "event": "result", "global_step": 4, "status": "ok"}
"""
# pylint: enable=line-too-long

AMD_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
bogomips\t: 5200.00

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
"""

INTEL_AMX_FLAGS = ('flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile '
                   'amx_int8\n')


def _step(step, seconds, time_of_day=None, loss=1.0):
  return compare.StepLog(step, loss, seconds, time_of_day)


def test_original_log_one_record_per_step_with_its_timestamp():
  steps = compare.parse_original_log(ORIGINAL_LOG)
  assert [s.step for s in steps] == [1, 2, 3, 4]
  assert [s.seconds for s in steps] == [1.416, 0.071, 0.070, 0.072]
  assert steps[0].loss == pytest.approx(3.3264)
  # The absl copy of each line wins: it carries the time of day.
  assert steps[1].time_of_day == pytest.approx(16 * 3600 + 14 * 60 +
                                               50.786319)


def test_ours_log_first_step_has_no_time():
  steps = compare.parse_ours_log(OURS_LOG)
  assert [s.step for s in steps] == [1, 2, 3, 4]
  assert [s.seconds for s in steps] == [None, 0.0435, 0.0353, 0.0356]
  assert [s.loss for s in steps] == [3.3696, 3.3717, 3.3766, 3.3187]
  assert steps[3].time_of_day == pytest.approx(16 * 3600 + 14 * 60 +
                                               0.785713)


def test_each_parser_ignores_the_other_trainers_lines():
  assert compare.parse_ours_log(ORIGINAL_LOG) == []
  assert compare.parse_original_log(OURS_LOG) == []


def test_parsers_read_scientific_and_nan_figures():
  steps = compare.parse_original_log(
      'INFO:tensorflow:global step 7: loss = nan (1.2e-01 sec/step)\n')
  assert steps[0].step == 7 and steps[0].seconds == pytest.approx(0.12)
  assert steps[0].loss != steps[0].loss  # nan


def test_steady_state_drops_warmup_and_takes_the_median():
  steps = compare.parse_original_log(ORIGINAL_LOG)
  figures = compare.steady_state(steps, warmup=1, batch_size=2)
  assert figures['seconds_per_step'] == pytest.approx(0.071)
  assert figures['images_per_sec'] == pytest.approx(2 / 0.071)
  assert figures['timed_steps'] == 3
  assert (figures['first_loss'], figures['last_loss']) == (3.3264, 3.3175)
  # Median of the intervals ending at steps 2, 3 and 4 (0.122, 0.070,
  # 0.072 s); step 1 has none.
  assert figures['wall_seconds_per_step'] == pytest.approx(0.071719)


def test_steady_state_of_ours_ignores_the_untimed_first_step():
  figures = compare.steady_state(compare.parse_ours_log(OURS_LOG), warmup=1,
                                 batch_size=2)
  assert figures['seconds_per_step'] == pytest.approx(0.0356)
  assert figures['last_step'] == 4


def test_steady_state_without_timed_steps_raises():
  with pytest.raises(ValueError, match='no timed step'):
    compare.steady_state([_step(1, 2.0), _step(2, None)], warmup=1,
                         batch_size=1)


def test_wall_intervals_cross_midnight_and_skip_gaps():
  steps = [_step(2, 1.0, 86399.5), _step(3, 1.0, 0.5), _step(5, 1.0, 9.0)]
  figures = compare.steady_state(steps, warmup=1, batch_size=1)
  assert figures['wall_seconds_per_step'] == pytest.approx(1.0)


def test_warmup_is_the_first_third():
  assert [compare.warmup_steps(n) for n in (4, 10, 20, 30)] == [1, 3, 6, 10]


def test_speed_ratio_of_medians_with_per_round_spread():
  ratio, low, high = compare.speed_ratio([1.0, 1.2, 0.9], [0.5, 0.8, 0.6])
  assert ratio == pytest.approx(1.0 / 0.6)
  assert low == pytest.approx(1.2 / 0.8)
  assert high == pytest.approx(2.0)


def test_cpu_features_from_cpuinfo():
  cpu = cpu_lib.cpu_features(AMD_CPUINFO)
  assert cpu == {'model_name': 'AMD EPYC 9R14', 'logical_cpus': 2,
                 'avx2': True, 'avx512f': True, 'avx512_bf16': True,
                 'amx': False}
  intel = cpu_lib.cpu_features('processor\t: 0\n' + INTEL_AMX_FLAGS)
  assert intel['amx'] and intel['avx512_bf16']
  old = cpu_lib.cpu_features('processor\t: 0\nflags\t\t: sse2 avx\n')
  assert not any(old[k] for k in ('avx2', 'avx512f', 'avx512_bf16', 'amx'))
  line = compare.cpu_line(dict(cpu, usable_cores=1))
  assert line == ('CPU: AMD EPYC 9R14, 2 logical CPUs (1 usable); AVX2 yes, '
                  'AVX-512 yes, AVX512_BF16 yes, AMX no')
  # Measured with oneDNN held below the CPU's features: the line says so.
  limited = compare.cpu_line(dict(
      cpu, usable_cores=1, onednn_limit=cpu_lib.onednn_limit(
          {'ONEDNN_MAX_CPU_ISA': 'avx2'})))
  assert limited == line + '; oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA)'


def test_process_settings_leave_the_users_own_values():
  environ = {}
  ours = {'TF_CPU_ALLOCATOR_USE_BFC': 'true', 'TF_ENABLE_ONEDNN_OPTS': '1'}
  assert cpu_lib.apply_process_settings(environ) == ours
  assert environ == ours
  mine = {'TF_CPU_ALLOCATOR_USE_BFC': 'false'}
  assert cpu_lib.apply_process_settings(mine) == {'TF_ENABLE_ONEDNN_OPTS': '1'}
  assert mine == {'TF_CPU_ALLOCATOR_USE_BFC': 'false',
                  'TF_ENABLE_ONEDNN_OPTS': '1'}
  mine = {'TF_ENABLE_ONEDNN_OPTS': '0'}
  assert cpu_lib.apply_process_settings(mine) == {
      'TF_CPU_ALLOCATOR_USE_BFC': 'true'}
  assert mine['TF_ENABLE_ONEDNN_OPTS'] == '0'


def test_commands_give_their_process_the_settings_before_tensorflow():
  code = ('import os, sys; import deeplab_train.cli; '
          'print(os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"), '
          'os.environ.get("TF_ENABLE_ONEDNN_OPTS"), '
          '"tensorflow" in sys.modules)')
  env = {k: v for k, v in os.environ.items()
         if k not in ('TF_CPU_ALLOCATOR_USE_BFC', 'TF_ENABLE_ONEDNN_OPTS')}
  out = subprocess.run([sys.executable, '-c', code], env=env, check=True,
                       capture_output=True, text=True).stdout
  assert out.split() == ['true', '1', 'False']
  env['TF_CPU_ALLOCATOR_USE_BFC'] = 'false'
  env['TF_ENABLE_ONEDNN_OPTS'] = '0'
  out = subprocess.run([sys.executable, '-c', code], env=env, check=True,
                       capture_output=True, text=True).stdout
  assert out.split() == ['false', '0', 'False']


def test_split_flag_args_keeps_ours_only_flags_apart():
  shared, ours_only, names = compare.split_flag_args([
      ('model_variant', ('--model_variant=xception_65',)),
      ('atrous_rates', ('--atrous_rates=6', '--atrous_rates=12')),
      ('mixed_precision', ('--mixed_precision=bf16',)),
      ('dataset_dir', ('--dataset_dir=/elsewhere',)),  # set by the bench
  ])
  assert shared == ('--model_variant=xception_65', '--atrous_rates=6',
                    '--atrous_rates=12')
  assert ours_only == ('--mixed_precision=bf16',)
  assert names == ('mixed_precision',)


def test_paths_given_to_the_trainers_are_absolute(tmp_path, monkeypatch):
  """The original's train.sh runs from its own folder: a relative
  --dataset_dir matched no records there, and its failure read 'no timed
  step after the 1 warm-up steps'."""
  monkeypatch.chdir(tmp_path)
  trainer = compare.Trainer(compare.ORIGINAL_NAME, ('train.sh',), ('--a=1',),
                            None, None)
  argv = compare._run_args(  # pylint: disable=protected-access
      trainer, 'work/round1', ('pascal_voc_seg', 'voc', 'train'), 4)
  assert '--dataset_dir=%s' % (tmp_path / 'voc') in argv
  assert '--train_logdir=%s' % (tmp_path / 'work' / 'round1') in argv
  shared, _, _ = compare.split_flag_args([
      ('dense_prediction_cell_json', ('--dense_prediction_cell_json=dpc.json',
                                      )),
      ('profile_logdir', ('--profile_logdir=',))])
  assert shared == ('--dense_prediction_cell_json=%s' % (tmp_path / 'dpc.json'),
                    '--profile_logdir=')


def test_label_weights_scheme_goes_to_deeplab_train_only():
  shared, ours_only, names = compare.split_flag_args([
      ('label_weights', ('--label_weights=auto',)),
      ('weight_decay', ('--weight_decay=0.0001',))])
  assert shared == ('--weight_decay=0.0001',)
  assert ours_only == ('--label_weights=auto',)
  assert names == ('label_weights',)
  shared, _, _ = compare.split_flag_args([
      ('label_weights', ('--label_weights=1', '--label_weights=2.5'))])
  assert shared == ('--label_weights=1', '--label_weights=2.5')


def test_compare_options_name_the_bad_field(tmp_path):
  (tmp_path / 'train.sh').write_text('#!/bin/bash\n')
  with pytest.raises(config.ConfigError, match='steps must be >= 4'):
    compare.CompareOptions(str(tmp_path), rounds=1, steps=3).validate()
  with pytest.raises(config.ConfigError, match='rounds must be >= 1'):
    compare.CompareOptions(str(tmp_path), rounds=0).validate()
  with pytest.raises(config.ConfigError, match='no train.sh'):
    compare.CompareOptions(str(tmp_path / 'missing')).validate()


def test_run_logged_reports_exit_code_and_peak_rss(tmp_path, monkeypatch):
  log = tmp_path / 'child.log'
  # The child holds its memory until a poll has seen it (the peak is polled).
  seen = tmp_path / 'seen'
  read = compare.vm_hwm_mib

  def reading(pid):
    mib = read(pid)
    if mib > 300:
      seen.touch()
    return mib
  monkeypatch.setattr(compare, 'vm_hwm_mib', reading)
  code, peak_mib, seconds = compare.run_logged(
      [sys.executable, '-c',
       'import os, time\nx = b"x" * (300 << 20)\nprint("hello")\n'
       'end = time.time() + %d\n'
       'while not os.path.exists(%r) and time.time() < end: time.sleep(0.01)\n'
       'raise SystemExit(3)' % (timeouts.HANG_SECONDS, str(seen))],
      str(log))
  assert code == 3
  assert 300 < peak_mib < 2000
  assert seconds > 0
  assert log.read_text().strip() == 'hello'


# Stand-in trainers: print the step lines of the real ones (s/step given
# per step), note their turn and arguments, exit 0.
_FAKE_TRAINER = r"""#!/bin/bash
steps=0
for a in "$@"; do
  case "$a" in --training_number_of_steps=*) steps=${a#*=};; esac
done
echo {name} >> {work}/order
echo "$@" >> {work}/args-{name}
echo "${TF_CPU_ALLOCATOR_USE_BFC:-unset},${TF_ENABLE_ONEDNN_OPTS:-unset}" >> {work}/allocator-{name}
for i in $(seq 1 $steps); do
  t={steady}; [ $i -eq 1 ] && t=9.000
  {line}
done
"""
_ORIGINAL_LINE = ('printf "I1130 10:00:%02d.000000 1 learning.py:511] global '
                  'step %d: loss = 2.5000 (%s sec/step)\\n" $i $i $t')
_OURS_LINE = ('printf "I1130 10:00:%02d.500000 1 hooks.py:223] step %d/%d  '
              'loss 2.5000  lr 0.0001  %s s/step  1 images/s\\n" $i $i '
              '$steps $t')


def _fake_trainer(path, work, name, steady, line):
  text = _FAKE_TRAINER
  for key, value in (('{name}', name), ('{work}', str(work)),
                     ('{steady}', steady), ('{line}', line)):
    text = text.replace(key, value)
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return path


@pytest.fixture
def fake_original(tmp_path):
  folder = tmp_path / 'original'
  folder.mkdir()
  _fake_trainer(folder / 'train.sh', tmp_path, 'original', '0.600',
                _ORIGINAL_LINE)
  return folder


def _job(original_dir, ours_command, **kwargs):
  options = compare.CompareOptions(str(original_dir), rounds=2,
                                   steps=6).validate()
  return compare.CompareJob(
      options=options, model_variant='mobilenet_v2', output_stride=16,
      crop_size=(33, 33), batch_size=2, fine_tune_batch_norm=False,
      shared_args=('--model_variant=mobilenet_v2',),
      ours_only_args=('--seed=1',), synthetic_images=2,
      ours_command=ours_command, **kwargs)


def test_comparison_alternates_the_trainers(tmp_path, fake_original,
                                           monkeypatch):
  # As in a deeplab-bench process: the commands' own settings applied.
  monkeypatch.delenv(cpu_lib.ALLOCATOR_ENV, raising=False)
  monkeypatch.delenv(cpu_lib.ONEDNN_ENV, raising=False)
  monkeypatch.setattr(cpu_lib, '_set_here', {})
  assert cpu_lib.apply_process_settings() == {cpu_lib.ALLOCATOR_ENV: 'true',
                                              cpu_lib.ONEDNN_ENV: '1'}
  ours = _fake_trainer(tmp_path / 'ours.sh', tmp_path, 'ours', '0.300',
                       _OURS_LINE)
  result = compare.run_comparison(_job(fake_original, (str(ours),)))
  order = (tmp_path / 'order').read_text().split()
  assert order == ['original', 'ours', 'original', 'ours']
  args = {name: (tmp_path / ('args-' + name)).read_text()
          for name in ('original', 'ours')}
  for text in args.values():
    assert '--model_variant=mobilenet_v2' in text
    assert '--dataset=pascal_voc_seg' in text
    assert '--log_steps=1' in text
    assert '--training_number_of_steps=6' in text
  assert '--seed=1' in args['ours'] and '--seed=1' not in args['original']
  # Each run has its own fresh logdir.
  logdirs = [a for a in args['original'].split() + args['ours'].split()
             if a.startswith('--train_logdir=')]
  assert len(set(logdirs)) == 4
  # Each trainer as shipped: our allocator and oneDNN settings are not the
  # original's.
  assert (tmp_path / 'allocator-original').read_text().split() == [
      'unset,unset', 'unset,unset']
  assert (tmp_path / 'allocator-ours').read_text().split() == ['true,1',
                                                               'true,1']
  # The warm-up step (9 s) is dropped: 0.6 s vs 0.3 s per step.
  assert result['original_seconds_per_step'] == pytest.approx(0.6)
  assert result['ours_seconds_per_step'] == pytest.approx(0.3)
  assert result['ours_images_per_sec'] == pytest.approx(2 / 0.3, abs=1e-3)
  assert (result['speed_ratio'], result['speed_ratio_min'],
          result['speed_ratio_max']) == (2.0, 2.0, 2.0)
  assert result['original_wall_seconds_per_step'] == pytest.approx(1.0)
  assert [r['round'] for r in result['per_round']] == [1, 2]
  assert result['original_peak_rss_mib'] > 0
  assert result['ours_only_flags'] == ['--seed=1']
  assert {'avx2', 'avx512f', 'avx512_bf16', 'amx'} <= set(result['cpu'])
  json.loads(compare.result_json_line(result))  # JSON-ready
  table = compare.format_comparison(result)
  assert '2.00x (rounds 2.00x-2.00x)' in table
  assert 'given to deeplab-train only: --seed=1' in table


def test_failed_trainer_is_named_with_its_log(tmp_path, fake_original):
  ours = tmp_path / 'broken.sh'
  ours.write_text('#!/bin/bash\necho "ValueError: no such tensor" >&2\n'
                  'exit 1\n')
  ours.chmod(0o755)
  with pytest.raises(compare.TrainerFailed) as caught:
    compare.run_comparison(_job(fake_original, (str(ours),)))
  message = str(caught.value)
  assert message.startswith('deeplab-train failed in round 1 (exit 1)')
  assert 'ValueError: no such tensor' in message
  log = message.split('its log ')[1].split()[0]
  assert log.endswith('round1-deeplab-train.log') and os.path.isfile(log)
  shutil.rmtree(os.path.dirname(log))  # kept for the user, not for tests


def _bench(args, timeout=300):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  return subprocess.run([sys.executable, '-m', 'deeplab_train.cli.bench'] +
                        args, capture_output=True, text=True, env=env,
                        timeout=timeout, check=False)


def test_bad_original_dir_is_one_line_and_exit_2(tmp_path):
  proc = _bench(['--compare_original=%s' % tmp_path])
  assert proc.returncode == 2, proc.stderr[-2000:]
  ours = [l for l in proc.stderr.splitlines()
          if l.startswith('deeplab-bench')]
  assert ours == ['deeplab-bench: error: --compare_original=%s is not a '
                  'setup of the original DeepLab (no train.sh there): make '
                  'one with the original\'s setup.sh (setup.sh DIR) and '
                  'pass that DIR' % tmp_path]
  assert 'Traceback' not in proc.stderr
  result = json.loads(proc.stdout.splitlines()[-1])
  assert result['status'] == 'bad_input'


def test_compare_cannot_be_combined_with_variants(tmp_path, fake_original):
  proc = _bench(['--compare_original=%s' % fake_original,
                 '--bench_variants=none,bf16'])
  assert proc.returncode == 2
  assert '--bench_variants' in proc.stderr


@pytest.mark.slow
def test_command_with_a_stand_in_original_and_real_deeplab_train(
    tmp_path, fake_original):
  bench_json = tmp_path / 'compare.json'
  proc = _bench(['--compare_original=%s' % fake_original,
                 '--compare_rounds=1', '--compare_steps=4',
                 '--model_variant=mobilenet_v2', '--depth_multiplier=0.25',
                 '--output_stride=16', '--train_crop_size=33,33',
                 '--train_batch_size=2', '--bench_synthetic_images=2',
                 '--seed=3', '--bench_json=%s' % bench_json])
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.splitlines()[-1])
  assert (result['event'], result['status']) == ('result', 'ok')
  assert result['original_seconds_per_step'] == pytest.approx(0.6)
  assert result['ours_seconds_per_step'] > 0
  assert result['per_round'][0]['ours']['last_step'] == 4
  assert result['ours_peak_rss_mib'] > 100  # a TensorFlow process
  assert '--train_crop_size=33,33' in result['shared_flags']
  assert '--depth_multiplier=0.25' in result['shared_flags']
  assert result['ours_only_flags'] == ['--seed=3']
  assert 'the original has no --seed: given to deeplab-train only' in (
      proc.stderr)
  assert 'original DeepLab vs deeplab-train: mobilenet_v2 OS16' in proc.stdout
  written = json.loads(bench_json.read_text())
  assert written == {k: v for k, v in result.items()
                     if k not in ('event', 'status')}
  args = pathlib.Path(tmp_path / 'args-original').read_text()
  assert '--seed' not in args and '--train_batch_size=2' in args


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_raised_in_main_turns_sigterm_into_stopped_and_restores():
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(signals.Stopped) as caught:
    with signals.raised_in_main():
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)  # the handler raises before this ends
  assert (caught.value.name, caught.value.signum) == ('SIGTERM',
                                                      signal.SIGTERM)
  assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_sigterm_ends_the_running_trainer_and_the_command(tmp_path):
  # The stand-in original writes its pid and then waits, as a trainer in
  # its step would; a scripted kill of deeplab-bench must not leave it.
  original = tmp_path / 'original'
  original.mkdir()
  pid_file = tmp_path / 'trainer.pid'
  script = original / 'train.sh'
  script.write_text('#!/bin/bash\necho $$ > {0}.tmp && mv {0}.tmp {0}\n'
                    'exec sleep 600\n'.format(pid_file))
  script.chmod(0o755)
  temp = tmp_path / 'tmp'
  temp.mkdir()
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', TMPDIR=str(temp))
  proc = subprocess.Popen(
      [sys.executable, '-m', 'deeplab_train.cli.bench',
       '--compare_original=%s' % original, '--compare_rounds=1',
       '--compare_steps=4', '--model_variant=mobilenet_v2',
       '--train_crop_size=33,33', '--train_batch_size=2',
       '--bench_synthetic_images=2'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
  trainer_pid = None
  try:
    deadline = time.time() + 240
    while not pid_file.exists():
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.time() < deadline, 'the stand-in trainer never started'
      time.sleep(0.1)
    trainer_pid = int(pid_file.read_text())
    assert _alive(trainer_pid)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    if trainer_pid is not None and _alive(trainer_pid):
      os.kill(trainer_pid, signal.SIGKILL)
      pytest.fail('deeplab-bench exited and left its trainer running')
  assert proc.returncode == 143, err[-3000:]
  assert 'deeplab-bench: stopped by SIGTERM' in err
  assert 'Traceback' not in err
  result = json.loads(out.splitlines()[-1])
  assert (result['status'], result['message']) == ('terminated',
                                                   'stopped by SIGTERM')
  # The work folder (records, the logdir) is gone with the run.
  assert not [p for p in temp.iterdir()
              if p.name.startswith('deeplab-bench-compare-')]
