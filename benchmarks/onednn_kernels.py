"""oneDNN's kernel time in a training step, untraced: the original DeepLab
beside deeplab-train.

    python benchmarks/onednn_kernels.py --original_dir=/tmp/deeplab-original \
        --dataset_dir=RECORDS --work=work/onednn [--steps=8,20] \
        -- --model_variant=mobilenet_v2 --output_stride=8 \
           --train_crop_size=321,321 --train_batch_size=4 \
           --fine_tune_batch_norm=true [--ours_only --mixed_precision=bf16]

Each trainer runs twice in fresh logdirs with ONEDNN_VERBOSE=1, once for
each step count of --steps; oneDNN prints every kernel it runs with its
time. The difference of the two runs' totals over the difference of
their step counts is what a step takes: start-up, the first steps and
their primitive creation cancel out. So are the trainers' wall seconds
and CPU seconds (user + system, from the children's resource usage) a
step. Their start-up still differs from run to run by up to about a second:
keep the counts far apart (20 steps or more between them; with 4, a
trainer's wall seconds a step came out negative once).

Unlike a traced step (benchmarks/profile_step.py) the ops run as in
training, two at a time on the inter-op threads: a kernel's time here
includes what sharing the cores with the other op costs it. A traced step
with one inter-op thread gives each op's time alone, but its savings need
not show untraced (docs/speed.md, twenty-fourth session). Only oneDNN's
kernels appear: TensorFlow's own (XLA clusters, element-wise ops, the
optimizer, the softmax loss) take the rest of the CPU seconds.

RECORDS is a pascal_voc_seg TFRecords folder; the flags after `--` go to
both trainers (the original's own flag names), those after `--ours_only`
to deeplab-train alone. Without --original_dir only deeplab-train runs.
"""
import argparse
import collections
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
OURS_ONLY = '--ours_only'


class Kernel(collections.namedtuple('Kernel', 'primitive impl prop shape')):
  """One kind of kernel run: oneDNN's primitive (matmul, convolution,
  batch_normalization, reorder, ...), implementation, propagation kind and
  problem (shapes)."""


def parse_verbose(text):
  """{Kernel: [ms, executions]} of the `exec` lines of ONEDNN_VERBOSE
  output in `text`; other lines are skipped.

  Both line formats are read: 'onednn_verbose,exec,cpu,PRIMITIVE,...'
  and 'onednn_verbose,v1,primitive,exec,cpu,PRIMITIVE,...'. The
  primitive, implementation and propagation follow the engine; the problem
  and the time in ms are the last two fields.
  """
  totals = collections.defaultdict(lambda: [0.0, 0])
  for line in text.splitlines():
    if not line.startswith('onednn_verbose,'):
      continue
    fields = line.strip().split(',')
    if 'exec' not in fields[:4]:
      continue
    at = fields.index('exec') + 2  # after 'exec' and the engine
    if len(fields) < at + 5:
      continue
    try:
      ms = float(fields[-1])
    except ValueError:
      continue
    kernel = Kernel(fields[at], fields[at + 1], fields[at + 2], fields[-2])
    totals[kernel][0] += ms
    totals[kernel][1] += 1
  return dict(totals)


def per_step(short, long, steps):
  """{Kernel: (ms, executions) a step}: the totals of the `long` run less
  those of the `short` one over `steps`, their difference in steps."""
  if steps <= 0:
    raise ValueError('the step counts must differ (got a difference of %d)'
                     % steps)
  out = {}
  for kernel in set(short) | set(long):
    ms = long.get(kernel, (0.0, 0))[0] - short.get(kernel, (0.0, 0))[0]
    runs = long.get(kernel, (0.0, 0))[1] - short.get(kernel, (0.0, 0))[1]
    out[kernel] = (ms / steps, runs / steps)
  return out


def by_primitive(step):
  """{primitive: (ms, executions) a step} of per_step's result."""
  out = collections.defaultdict(lambda: [0.0, 0.0])
  for kernel, (ms, runs) in step.items():
    out[kernel.primitive][0] += ms
    out[kernel.primitive][1] += runs
  return {name: tuple(v) for name, v in out.items()}


def table(named, top=15):
  """The report: per trainer (name, step, (wall, CPU) seconds) the wall
  and CPU seconds and the oneDNN ms a step, per primitive, then its
  slowest kernels."""
  names = [name for name, _, _ in named]
  lines = ['%-24s' % 'a step' + ''.join('%24s' % n for n in names)]
  lines.append('%-24s' % 'wall seconds' + ''.join(
      '%21.3f s ' % wall for _, _, (wall, _) in named))
  lines.append('%-24s' % 'CPU seconds (process)' + ''.join(
      '%21.3f s ' % cpu for _, _, (_, cpu) in named))
  per_primitive = [by_primitive(step) for _, step, _ in named]
  slowest = {}
  for primitives in per_primitive:
    for name, (ms, _) in primitives.items():
      slowest[name] = max(slowest.get(name, 0.0), ms)
  lines.append('%-24s' % 'oneDNN kernels' + ''.join(
      '%21.1f ms' % sum(ms for ms, _ in step.values())
      for _, step, _ in named))
  for primitive in sorted(slowest, key=lambda p: -slowest[p]):
    lines.append('%-24s' % ('  ' + primitive) + ''.join(
        '%14.1f ms %5.0fx' % primitives.get(primitive, (0.0, 0.0))
        for primitives in per_primitive))
  for name, step, _ in named:
    lines.append('slowest kernels a step, %s (ms, runs, primitive, '
                 'implementation, propagation, problem):' % name)
    for kernel, (ms, runs) in sorted(step.items(),
                                     key=lambda kv: -kv[1][0])[:top]:
      lines.append('  %8.2f %5.1f  %s %s %s %s' % (
          ms, runs, kernel.primitive, kernel.impl, kernel.prop,
          kernel.shape))
  return '\n'.join(lines)


def _children_cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_verbose(argv, log_path, cwd=None):
  """Runs argv with ONEDNN_VERBOSE=1, its output in log_path; returns
  (parse_verbose of the output, wall seconds, CPU seconds it used)."""
  env = dict(os.environ, ONEDNN_VERBOSE='1', TF_CPP_MIN_LOG_LEVEL='2')
  before, start = _children_cpu_seconds(), time.monotonic()
  with open(log_path, 'w') as log:
    code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT,
                           cwd=cwd, env=env)
  wall = time.monotonic() - start
  cpu = _children_cpu_seconds() - before
  if code:
    sys.exit('%s failed (exit %d): see %s' % (argv[0], code, log_path))
  with open(log_path, errors='replace') as f:
    totals = parse_verbose(f.read())
  if not totals:
    sys.exit('no oneDNN kernel in %s: are oneDNN\'s kernels on '
             '(TF_ENABLE_ONEDNN_OPTS)?' % log_path)
  return totals, wall, cpu


def _run_flags(logdir, steps):
  return ['--train_logdir=%s' % logdir, '--training_number_of_steps=%d' % steps]


def measure(name, make_argv, work, step_counts, cwd=None):
  """(name, per-step kernels, (wall, CPU) seconds a step) of one trainer,
  from a run for each of the two step counts."""
  runs = []
  for steps in step_counts:
    logdir = work / ('%s-%d' % (name, steps))
    shutil.rmtree(logdir, ignore_errors=True)
    runs.append(run_verbose(make_argv(str(logdir), steps),
                            work / ('%s-%d.log' % (name, steps)), cwd=cwd))
  (short, short_wall, short_cpu), (long, long_wall, long_cpu) = runs
  steps = step_counts[1] - step_counts[0]
  return name, per_step(short, long, steps), (
      (long_wall - short_wall) / steps, (long_cpu - short_cpu) / steps)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--original_dir')
  parser.add_argument('--dataset_dir', required=True)
  parser.add_argument('--work', default='work/onednn')
  parser.add_argument('--steps', default='8,20',
                      help='the two step counts, the smaller first')
  parser.add_argument('flags', nargs='*',
                      help='trainer flags (after --), e.g. --model_variant=X')
  args = parser.parse_args()
  step_counts = [int(s) for s in args.steps.split(',')]
  if len(step_counts) != 2 or not 0 < step_counts[0] < step_counts[1]:
    parser.error('--steps takes two step counts, the smaller first, e.g. '
                 '8,20; got %r' % args.steps)
  flags, ours_only = args.flags, []
  if OURS_ONLY in flags:
    at = flags.index(OURS_ONLY)
    flags, ours_only = flags[:at], flags[at + 1:]
  work = pathlib.Path(args.work).resolve()
  work.mkdir(parents=True, exist_ok=True)
  flags = ['--dataset=pascal_voc_seg', '--dataset_dir=%s' % args.dataset_dir,
           '--save_interval_secs=0', '--save_summaries_secs=0'] + flags
  named = []
  if args.original_dir:
    # The command deeplab-bench --compare_original runs; imported here, as
    # it loads TensorFlow.
    sys.path.insert(0, str(REPO))
    from deeplab_train.bench import compare  # pylint: disable=g-import-not-at-top
    from deeplab_train.config import errors  # pylint: disable=g-import-not-at-top
    try:
      compare.check_original_dir(args.original_dir)
    except errors.ConfigError as e:
      parser.error(str(e))
    command = list(compare.original_command(args.original_dir))
    named.append(measure(
        'original',
        lambda logdir, steps: command + flags + _run_flags(logdir, steps),
        work, step_counts))
  ours = [sys.executable, '-m', 'deeplab_train.cli.train']
  named.append(measure(
      'deeplab-train',
      lambda logdir, steps: (ours + flags + ours_only
                             + _run_flags(logdir, steps)),
      work, step_counts, cwd=str(REPO)))
  print(table(named))


if __name__ == '__main__':
  main()
