"""deeplab-train against the original DeepLab trainer, side by side.

For our own benchmarking (deeplab-bench --compare_original=DIR): DIR is the
original research/deeplab trainer made runnable by the original's setup.sh
(DIR/train.sh takes the original train.py's flags). `run_comparison` trains
the original and deeplab-train with the same model and training flags on
the same TFRecords, each run in its own process and fresh logdir,
alternating (original, ours, original, ours, ...) so that a machine getting
busier or cooler slows both alike, and reports per run:

  s/step: the median over the steps after warm-up of what each trainer
    logs itself with --log_steps=1. The original (tf_slim's loop) times the
    session.run of its train op; deeplab-train's ProgressHook times from the
    end of one step to the end of the next (its hooks included), so the
    comparison is, if anything, unfair to deeplab-train. As a cross-check
    the median interval between consecutive step log lines (their absl
    timestamps) is reported too: the whole loop of both.
  peak RSS: the kernel's high-water mark of resident memory of the
    trainer's process (VmHWM), read while it runs.

The records are pascal_voc_seg's (21 classes, `train-0000i-of-0000N`
shards), the only kind the original reads besides its other built-in
datasets: synthetic VOC-sized images or the bundled sample data converted
as 21 classes, or an existing dataset_dir.
"""
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, NamedTuple, Optional, Tuple

from absl import logging

from deeplab_train.bench import report
from deeplab_train.config import errors
from deeplab_train.runtime import cpu as cpu_lib

ORIGINAL_NAME = 'original'
OURS_NAME = 'deeplab-train'
ORIGINAL_SCRIPT = 'train.sh'
# Fewer steps leave too few after warm-up for a median.
MIN_STEPS = 4
VOC_CLASSES = 21

# The flags of the original's train.py and common.py: deeplab-train flags
# outside this set are given to deeplab-train only.
ORIGINAL_FLAG_NAMES = frozenset((
    'adam_epsilon', 'adam_learning_rate', 'add_image_level_feature',
    'aspp_convs_filters', 'aspp_with_batch_norm',
    'aspp_with_concat_projection', 'aspp_with_separable_conv',
    'aspp_with_squeeze_and_excitation', 'atrous_rates', 'base_learning_rate',
    'batch_norm_decay', 'clone_on_cpu', 'dataset', 'dataset_dir',
    'decay_steps', 'decoder_filters', 'decoder_output_is_logits',
    'decoder_output_stride', 'decoder_use_separable_conv',
    'decoder_use_sum_merge', 'dense_prediction_cell_json',
    'depth_multiplier', 'divisible_by', 'drop_path_keep_prob',
    'end_learning_rate', 'fine_tune_batch_norm', 'hard_example_mining_step',
    'image_pooling_crop_size', 'image_pooling_stride', 'image_pyramid',
    'image_se_uses_qsigmoid', 'initialize_last_layer', 'keep_aspect_ratio',
    'label_weights', 'last_layer_gradient_multiplier',
    'last_layers_contain_logits_only', 'learning_policy', 'learning_power',
    'learning_rate_decay_factor', 'learning_rate_decay_step', 'log_steps',
    'logits_kernel_size', 'master', 'max_resize_value', 'max_scale_factor',
    'merge_method', 'min_resize_value', 'min_scale_factor', 'model_variant',
    'momentum', 'multi_grid', 'nas_remove_os32_stride',
    'nas_stem_output_num_conv_filters', 'nas_use_classification_head',
    'num_clones', 'num_ps_tasks', 'num_replicas', 'optimizer',
    'output_stride', 'prediction_with_upsampled_logits', 'profile_logdir',
    'quantize_delay_step', 'resize_factor', 'save_interval_secs',
    'save_summaries_images', 'save_summaries_secs', 'scale_factor_step_size',
    'slow_start_learning_rate', 'slow_start_step', 'startup_delay_steps',
    'task', 'tf_initial_checkpoint', 'top_k_percent_pixels',
    'train_batch_size', 'train_crop_size', 'train_logdir', 'train_split',
    'training_number_of_steps', 'upsample_logits', 'use_bounded_activation',
    'weight_decay'))
# Set by the comparison itself for both trainers (see `_run_args`).
CONTROLLED_FLAG_NAMES = frozenset((
    'dataset', 'dataset_dir', 'train_split', 'train_logdir',
    'training_number_of_steps', 'log_steps', 'save_interval_secs',
    'save_summaries_secs', 'tf_initial_checkpoint', 'num_steps_more'))

# absl's prefix: 'I1130 16:14:50.663903 139974668217216 learning.py:511] '.
_ABSL_PREFIX = re.compile(
    r'^[IWEF]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?)\s+\d+\s+[^\]\s]+\]\s')
_NUMBER = r'(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)'
# tf_slim: 'global step 20: loss = 1.2345 (0.512 sec/step)'.
_ORIGINAL_STEP = re.compile(r'\bglobal step (\d+): loss = %s \(%s sec/step\)'
                            % (_NUMBER, _NUMBER))
# ProgressHook: 'step 20/30  loss 1.2345  lr 0.0001  0.512 s/step  ...'; the
# first step's line has no s/step.
_OURS_STEP = re.compile(r'\bstep (\d+)/\d+\s+loss %s\s+lr \S+'
                        r'(?:\s+%s s/step)?' % (_NUMBER, _NUMBER))


class TrainerFailed(RuntimeError):
  """A trainer exited with an error or logged no timed step."""


@dataclasses.dataclass(frozen=True)
class CompareOptions:
  """How long the comparison runs.

  Attributes:
    original_dir: folder made by the original's setup.sh (holds train.sh).
    rounds: alternating rounds, each one run of either trainer.
    steps: training steps of every run.
  """
  original_dir: str
  rounds: int = 3
  steps: int = 30

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    for name, minimum in (('rounds', 1), ('steps', MIN_STEPS)):
      if getattr(self, name) < minimum:
        raise errors.ConfigError(
            '%s must be >= %d, got %d' % (errors.field_ref(self, name),
                                          minimum, getattr(self, name)))
    check_original_dir(self.original_dir)
    return self


@dataclasses.dataclass(frozen=True)
class CompareJob:
  """What is compared, on which data.

  Attributes:
    options: rounds, steps and the original's folder.
    model_variant / output_stride / crop_size / batch_size /
      fine_tune_batch_norm: the setting, for the report (shared_args give
      it to the trainers).
    shared_args: flags given to both trainers ('--name=value', one each).
    ours_only_args: deeplab-train flags the original does not have.
    data: 'synthetic', 'sample' or 'dataset_dir' (deeplab-bench's
      --bench_data).
    synthetic_images: images written for synthetic data.
    dataset / dataset_dir / split: the dataset_dir data source.
    ours_command: how deeplab-train is started.
  """
  options: CompareOptions
  model_variant: str
  output_stride: int
  crop_size: Tuple[int, int]
  batch_size: int
  fine_tune_batch_norm: bool
  shared_args: Tuple[str, ...] = ()
  ours_only_args: Tuple[str, ...] = ()
  data: str = 'synthetic'
  synthetic_images: int = 64
  dataset: str = 'pascal_voc_seg'
  dataset_dir: Optional[str] = None
  split: str = 'train'
  ours_command: Tuple[str, ...] = (sys.executable, '-m',
                                   'deeplab_train.cli.train')


class StepLog(NamedTuple):
  """One step's log line: its number, loss, the s/step it reports (None
  when it reports none) and its time of day in seconds (None without an
  absl timestamp)."""
  step: int
  loss: float
  seconds: Optional[float]
  time_of_day: Optional[float]


class Trainer(NamedTuple):
  """How to run one of the two trainers and read its log."""
  name: str
  command: Tuple[str, ...]
  args: Tuple[str, ...]
  parse_log: Callable[[str], List[StepLog]]
  # A fresh copy of the environment it runs in.
  environ: Callable[[], dict]


def check_original_dir(original_dir):
  """Raises ConfigError (one line) unless `original_dir` holds train.sh."""
  if not os.path.isfile(os.path.join(original_dir, ORIGINAL_SCRIPT)):
    raise errors.ConfigError(
        '{CompareOptions.original_dir}=%s is not a setup of the original '
        'DeepLab (no %s there): make one with the original\'s setup.sh '
        '(setup.sh DIR) and pass that DIR', original_dir, ORIGINAL_SCRIPT)


def split_flag_args(flag_args):
  """Splits deeplab-train flags into those the original also takes and
  the rest.

  Args:
    flag_args: (flag name, its command-line arguments) pairs.

  Returns:
    (arguments for both trainers, arguments for deeplab-train only, names
    of the latter); flags the comparison sets itself are dropped.
  """
  shared, ours_only, names = [], [], []
  for name, args in flag_args:
    if name in CONTROLLED_FLAG_NAMES:
      continue
    if name in _PATH_FLAG_NAMES:
      args = tuple(_absolute(a) for a in args)
    if name in ORIGINAL_FLAG_NAMES and not _ours_only_value(name, args):
      shared.extend(args)
    else:
      ours_only.extend(args)
      names.append(name)
  return tuple(shared), tuple(ours_only), tuple(names)


# Flags naming a file or folder: made absolute, since the original's
# train.sh changes to its own folder first.
_PATH_FLAG_NAMES = frozenset(('dense_prediction_cell_json', 'profile_logdir'))


def _absolute(arg):
  """'--name=path' with the path made absolute (an empty one kept)."""
  name, _, value = arg.partition('=')
  return '%s=%s' % (name, os.path.abspath(value)) if value else arg


def _ours_only_value(name, args):
  """True for a value only deeplab-train understands, e.g.
  --label_weights=auto (the original takes numbers only)."""
  if name != 'label_weights':
    return False
  return any(not _is_number(a.split('=', 1)[-1]) for a in args)


def _is_number(text):
  try:
    float(text)
  except ValueError:
    return False
  return True


def _time_of_day(line):
  match = _ABSL_PREFIX.match(line)
  if not match:
    return None
  hours, minutes, seconds = match.groups()
  return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _parse_steps(text, pattern):
  """StepLogs of every line matching `pattern` (groups: step, loss,
  seconds), one per step; a line with a timestamp wins over its copy
  without (TensorFlow's logger may print each line twice)."""
  by_step = {}
  for line in text.splitlines():
    match = pattern.search(line)
    if not match:
      continue
    step, loss, seconds = match.groups()
    record = StepLog(int(step), float(loss),
                     None if seconds is None else float(seconds),
                     _time_of_day(line))
    old = by_step.get(record.step)
    if old is None or old.time_of_day is None:
      by_step[record.step] = record
  return [by_step[step] for step in sorted(by_step)]


def parse_original_log(text):
  """The original's step lines (tf_slim's 'global step N: loss = L (S
  sec/step)'), in step order."""
  return _parse_steps(text, _ORIGINAL_STEP)


def parse_ours_log(text):
  """deeplab-train's step lines (ProgressHook's 'step N/M  loss L  lr R
  S s/step ...'), in step order."""
  return _parse_steps(text, _OURS_STEP)


def warmup_steps(steps):
  """Steps left out of the figures: the first third (graph rewrites,
  allocator and input warm-up)."""
  return max(1, steps // 3)


def _wall_intervals(steps, warmup):
  """Seconds between the log lines of consecutive steps after warm-up."""
  out = []
  for before, after in zip(steps, steps[1:]):
    if (after.step != before.step + 1 or after.step <= warmup or
        before.time_of_day is None or after.time_of_day is None):
      continue
    interval = after.time_of_day - before.time_of_day
    out.append(interval + 86400 if interval < 0 else interval)  # midnight
  return out


def steady_state(steps, warmup, batch_size):
  """A run's figures from its step logs.

  Args:
    steps: StepLogs of one run (one per step, logged every step).
    warmup: steps left out (those numbered <= warmup).
    batch_size: images per step.

  Returns:
    {'seconds_per_step', 'images_per_sec', 'wall_seconds_per_step' (None
    without timestamps), 'timed_steps', 'last_step', 'first_loss',
    'last_loss'}.

  Raises:
    ValueError: no step after warm-up reports its time.
  """
  timed = [s.seconds for s in steps
           if s.step > warmup and s.seconds is not None]
  if not timed:
    raise ValueError('no timed step after the %d warm-up steps' % warmup)
  seconds = statistics.median(timed)
  if seconds <= 0:
    raise ValueError('steps too short to time (median %g s)' % seconds)
  wall = _wall_intervals(steps, warmup)
  return {'seconds_per_step': seconds,
          'images_per_sec': batch_size / seconds,
          'wall_seconds_per_step': statistics.median(wall) if wall else None,
          'timed_steps': len(timed), 'last_step': steps[-1].step,
          'first_loss': steps[0].loss, 'last_loss': steps[-1].loss}


def speed_ratio(original_seconds, ours_seconds):
  """How much faster deeplab-train is: original s/step over ours.

  Args:
    original_seconds / ours_seconds: s/step of each round, in round order.

  Returns:
    (ratio of the medians, smallest and largest per-round ratio); > 1:
    deeplab-train is faster.
  """
  per_round = [o / s for o, s in zip(original_seconds, ours_seconds)]
  ratio = statistics.median(original_seconds) / statistics.median(
      ours_seconds)
  return ratio, min(per_round), max(per_round)


def vm_hwm_mib(pid):
  """The peak resident memory (VmHWM) of process `pid` so far, in MiB, or
  0 when it cannot be read (gone, or no /proc)."""
  try:
    with open('/proc/%d/status' % pid) as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024.0
  except (OSError, ValueError, IndexError):
    pass
  return 0.0


def run_logged(argv, log_path, env=None, poll_seconds=0.1):
  """Runs `argv` with its output in `log_path` and waits for it.

  Returns:
    (exit code, peak RSS in MiB, wall seconds): the peak is the largest
    VmHWM of the process read while it runs (every `poll_seconds`; the
    trainers exec, so the pid stays theirs). ru_maxrss would not do: at
    exec it keeps the high-water mark of the process forked from, here a
    Python that may already hold TensorFlow.
  """
  start = time.time()
  peak = 0.0
  with open(log_path, 'wb') as log:
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    try:
      while True:
        peak = max(peak, vm_hwm_mib(proc.pid))
        try:
          proc.wait(timeout=poll_seconds)
          break
        except subprocess.TimeoutExpired:
          continue
    except BaseException:
      proc.kill()
      proc.wait()
      raise
  return proc.returncode, peak, time.time() - start


def _log_tail(path, lines=15):
  try:
    with open(path, errors='replace') as f:
      return '\n'.join(f.read().rstrip().splitlines()[-lines:])
  except OSError:
    return ''


def original_command(original_dir):
  """The command starting the original's train.sh."""
  script = os.path.join(os.path.abspath(original_dir), ORIGINAL_SCRIPT)
  return (script,) if os.access(script, os.X_OK) else ('bash', script)


def trainers(job):
  """(the original, deeplab-train) as Trainers with their own flags.

  Checkpoints and summaries are written only at the start and end (no
  timer), so that no step in between pays for them.
  """
  original = Trainer(
      ORIGINAL_NAME, original_command(job.options.original_dir),
      job.shared_args + ('--save_interval_secs=0', '--save_summaries_secs=0'),
      parse_original_log,
      # As shipped: without the settings our commands give themselves.
      cpu_lib.environ_without_own_settings)
  ours = Trainer(
      OURS_NAME, tuple(job.ours_command),
      job.shared_args + job.ours_only_args + (
          '--save_interval_secs=0', '--save_summaries_secs=0'),
      parse_ours_log, lambda: dict(os.environ))
  return original, ours


def _run_args(trainer, logdir, data, steps):
  dataset, dataset_dir, split = data
  # Absolute: the original's train.sh runs from its own folder.
  return (trainer.command +
          ('--train_logdir=%s' % os.path.abspath(logdir),
           '--dataset=%s' % dataset,
           '--dataset_dir=%s' % os.path.abspath(dataset_dir),
           '--train_split=%s' % split,
           '--training_number_of_steps=%d' % steps, '--log_steps=1') +
          trainer.args)


def run_trainer(trainer, job, data, work_dir, round_index):
  """Trains `trainer` once in a fresh logdir; returns its figures.

  Args:
    trainer: a Trainer (see `trainers`).
    job: the CompareJob.
    data: (dataset name, dataset_dir, split) of the records.
    work_dir: folder of the run's logdir (removed after it) and log.
    round_index: 1-based round, for names.

  Returns:
    `steady_state`'s dict plus 'peak_rss_mib' and 'run_seconds'.

  Raises:
    TrainerFailed: it failed or logged no timed step (names the log).
  """
  name = 'round%d-%s' % (round_index, trainer.name)
  logdir = os.path.join(work_dir, name)
  log_path = os.path.join(work_dir, name + '.log')
  env = trainer.environ()
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  argv = _run_args(trainer, logdir, data, job.options.steps)
  logging.info('round %d/%d: training %s (log %s)', round_index,
               job.options.rounds, trainer.name, log_path)
  code, peak_mib, run_seconds = run_logged(argv, log_path, env)
  shutil.rmtree(logdir, ignore_errors=True)
  if code:
    raise TrainerFailed('%s failed in round %d (exit %d); its log %s ends:'
                        '\n%s' % (trainer.name, round_index, code, log_path,
                                  _log_tail(log_path)))
  with open(log_path, errors='replace') as f:
    steps = trainer.parse_log(f.read())
  try:
    figures = steady_state(steps, warmup_steps(job.options.steps),
                           job.batch_size)
  except ValueError as e:
    raise TrainerFailed('%s in round %d: %s in its log %s, which ends:\n%s'
                        % (trainer.name, round_index, e, log_path,
                           _log_tail(log_path))) from None
  figures.update(peak_rss_mib=peak_mib, run_seconds=run_seconds)
  return figures


def prepare_records(job, folder):
  """Writes the records both trainers read (unless dataset_dir).

  Returns:
    (dataset name, dataset_dir, split).
  """
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.bench import data as bench_data
  if job.data == 'dataset_dir':
    return job.dataset, job.dataset_dir, job.split
  if job.data == 'sample':
    bench_data.convert_sample_dataset(folder, num_classes=VOC_CLASSES,
                                      dataset_name='pascal_voc_seg')
  else:
    bench_data.write_synthetic_dataset(folder,
                                       num_images=job.synthetic_images,
                                       num_classes=VOC_CLASSES)
  return 'pascal_voc_seg', folder, 'train'


def _median_of(runs, key):
  values = [r[key] for r in runs if r[key] is not None]
  return statistics.median(values) if values else None


def summarize(job, rounds, cpu, load_average):
  """The comparison's result dict (every figure; see format_comparison).

  Args:
    job: the CompareJob.
    rounds: per round {'original': figures, 'ours': figures}.
    cpu: runtime.cpu.machine_cpu().
    load_average: [1-minute load at the start, at the end].
  """
  original = [r['original'] for r in rounds]
  ours = [r['ours'] for r in rounds]
  ratio, low, high = speed_ratio([r['seconds_per_step'] for r in original],
                                 [r['seconds_per_step'] for r in ours])
  result = {
      'mode': 'compare_original', 'model_variant': job.model_variant,
      'output_stride': job.output_stride, 'crop_size': list(job.crop_size),
      'batch_size': job.batch_size,
      'fine_tune_batch_norm': job.fine_tune_batch_norm, 'data': job.data,
      'rounds': len(rounds), 'steps': job.options.steps,
      'warmup_steps': warmup_steps(job.options.steps),
      'shared_flags': list(job.shared_args),
      'ours_only_flags': list(job.ours_only_args),
      'per_round': [{'round': i + 1, 'original': r['original'],
                     'ours': r['ours'],
                     'speed_ratio': (r['original']['seconds_per_step'] /
                                     r['ours']['seconds_per_step'])}
                    for i, r in enumerate(rounds)],
      'speed_ratio': ratio, 'speed_ratio_min': low, 'speed_ratio_max': high,
      'cpu': cpu, 'load_average': load_average}
  for prefix, runs in (('original', original), ('ours', ours)):
    for key in ('seconds_per_step', 'images_per_sec',
                'wall_seconds_per_step'):
      result['%s_%s' % (prefix, key)] = _median_of(runs, key)
    result[prefix + '_peak_rss_mib'] = max(r['peak_rss_mib'] for r in runs)
  return result


def run_comparison(job):
  """Trains both trainers alternately, `job.options.rounds` times each.

  The work folder (records, logs) is removed after a successful run and
  kept after a failed trainer, for its log (removed after anything else,
  e.g. a stop).

  Returns:
    summarize's result dict.

  Raises:
    TrainerFailed: a trainer failed (the message names it and its log).
  """
  original, ours = trainers(job)
  load_start = os.getloadavg()[0]
  work_dir = tempfile.mkdtemp(prefix='deeplab-bench-compare-')
  rounds = []
  try:
    records = os.path.join(work_dir, 'records')
    os.makedirs(records)
    data = prepare_records(job, records)
    for index in range(1, job.options.rounds + 1):
      rounds.append({
          'original': run_trainer(original, job, data, work_dir, index),
          'ours': run_trainer(ours, job, data, work_dir, index)})
  except TrainerFailed:
    raise  # its message names a log in work_dir
  except BaseException:
    # Also a stop (the command's SIGTERM/SIGINT exception): run_logged has
    # ended the trainer; nothing in the folder is named to the user.
    shutil.rmtree(work_dir, ignore_errors=True)
    raise
  shutil.rmtree(work_dir, ignore_errors=True)
  return report.rounded(summarize(job, rounds, cpu_lib.machine_cpu(),
                           [load_start, os.getloadavg()[0]]))


def _fmt(fmt, value):
  return '-' if value is None else fmt % value


def _table(rows):
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return ['  '.join(cell.ljust(w) if i == 0 else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(row, widths)))
          for row in rows]


def cpu_line(cpu):
  """'CPU: <model>, N logical CPUs (M usable); AVX2 yes, ...', and what
  limited oneDNN (runtime.cpu.onednn_limit) if anything did."""
  def yes(key):
    return 'yes' if cpu.get(key) else 'no'
  line = ('CPU: %s, %d logical CPUs (%s usable); AVX2 %s, AVX-512 %s, '
          'AVX512_BF16 %s, AMX %s' % (
              cpu.get('model_name') or 'unknown', cpu.get('logical_cpus', 0),
              cpu.get('usable_cores', '?'), yes('avx2'), yes('avx512f'),
              yes('avx512_bf16'), yes('amx')))
  if cpu.get('onednn_limit'):
    # The features are the CPU's; the kernels used fewer of them.
    line += '; oneDNN %s' % cpu['onednn_limit']
  return line


def format_comparison(result):
  """The comparison as a text table (see `summarize` for the dict)."""
  title = ('original DeepLab vs deeplab-train: %s OS%d crop %s batch %d, '
           'fine_tune_batch_norm=%s, data %s; %d steps per run, median s/step '
           'of steps %d-%d' % (
               result['model_variant'], result['output_stride'],
               'x'.join(map(str, result['crop_size'])), result['batch_size'],
               result['fine_tune_batch_norm'], result['data'],
               result['steps'], result['warmup_steps'] + 1, result['steps']))
  rows = [['round', 'original s/step', 'img/s', 'RSS MiB',
           'deeplab-train s/step', 'img/s', 'RSS MiB', 'orig/ours']]
  for entry in result['per_round']:
    o, s = entry['original'], entry['ours']
    rows.append(['%d' % entry['round'], '%.3f' % o['seconds_per_step'],
                 '%.2f' % o['images_per_sec'], '%.0f' % o['peak_rss_mib'],
                 '%.3f' % s['seconds_per_step'], '%.2f' % s['images_per_sec'],
                 '%.0f' % s['peak_rss_mib'], '%.2fx' % entry['speed_ratio']])
  rows.append(['median', '%.3f' % result['original_seconds_per_step'],
               '%.2f' % result['original_images_per_sec'], '',
               '%.3f' % result['ours_seconds_per_step'],
               '%.2f' % result['ours_images_per_sec'], '',
               '%.2fx' % result['speed_ratio']])
  lines = [title] + _table(rows) + [
      'speed ratio original s/step / deeplab-train s/step: %.2fx (rounds '
      '%.2fx-%.2fx); > 1: deeplab-train is faster' % (
          result['speed_ratio'], result['speed_ratio_min'],
          result['speed_ratio_max']),
      'wall s/step (log line intervals): original %s, deeplab-train %s' % (
          _fmt('%.3f', result['original_wall_seconds_per_step']),
          _fmt('%.3f', result['ours_wall_seconds_per_step'])),
      'peak RSS (largest of the runs): original %.0f MiB, deeplab-train '
      '%.0f MiB' % (result['original_peak_rss_mib'],
                                    result['ours_peak_rss_mib']),
      cpu_line(result['cpu']),
      'load average at start / end: %s' % ' / '.join(
          '%.2f' % v for v in result['load_average'])]
  if result['ours_only_flags']:
    lines.append('given to deeplab-train only: %s'
                 % ' '.join(result['ours_only_flags']))
  return '\n'.join(lines)


def result_json_line(result):
  """The result as one JSON line (sorted keys), for --bench_json."""
  return json.dumps(result, sort_keys=True)

