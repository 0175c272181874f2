"""Where a training step spends its time: the original DeepLab beside
deeplab-train, op time grouped by kind, from a Chrome trace of one step.

    python benchmarks/profile_step.py --original_dir=/tmp/deeplab-original \
        --dataset_dir=RECORDS --work=work/profile [--steps=20] \
        -- --model_variant=mobilenet_v2 --output_stride=8 \
           --train_crop_size=321,321 --train_batch_size=4 \
           --fine_tune_batch_norm=true

RECORDS is a pascal_voc_seg TFRecords folder (e.g. from
benchmarks/learning_curves.py or `deeplab-bench --compare_original`); the
flags after `--` go to both trainers (the original's own flag names). Each
trainer runs --steps steps in a fresh logdir and traces the step after
three quarters of them: the original through tf_slim's trace_every_n_steps
(set by a wrapper around its training loop, not by a flag of train.py),
deeplab-train through its --profile_logdir. Prints, per kind of op, the
summed op time of each (ms and share), the step's wall time in the trace
and how it splits (a convolution / matmul running, only other ops, no op),
each trainer's slowest op types, and its op types by their share of the
wall time (each moment shared equally among the ops running then, so the
shares add up to the time some op runs: ops that overlap others count for
less than their op time), and the op types that run alone, one op at a
time (the step's serial stretches, where one inter-op thread waits). One
trace is one step: compare shares, and repeat for figures to quote.
Without --original_dir only deeplab-train is profiled.
"""
import argparse
import collections
import glob
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

# (kind, substrings of the op type), first match wins; the oneDNN prefixes
# (_Mkl, _MklNative, _Fused) are kept, the substrings match inside them.
KINDS = (
    ('depthwise conv', ('Depthwise',)),
    ('conv / 1x1 matmul', ('Conv2D', 'MatMul')),
    ('batch norm', ('BatchNorm',)),
    ('space-to-batch', ('SpaceToBatch', 'BatchToSpace')),
    ('resize (logits)', ('Resize',)),
    ('softmax loss', ('SoftmaxCrossEntropy', 'OneHot')),
    ('optimizer', ('ApplyMomentum', 'ApplyKerasMomentum', 'ApplyAdam')),
    ('input', ('IteratorGetNext', 'QueueDequeue')),
    ('copies / layout', ('Transpose', 'MklToTf', 'InputConversion',
                         'Identity', 'Reshape', 'Concat', 'Pad', 'Slice',
                         'Tile', 'Pack', 'Unpack')),
    ('activations', ('Relu',)),
)
OTHER = 'elementwise / other'

# Runs the original's train.py with tf_slim's tracing on (argv[1]: every
# how many steps); the rest of argv is train.py's.
_ORIGINAL_WRAPPER = '''
import runpy, sys
import tf_slim.learning as learning
every = int(sys.argv[1])
plain_train = learning.train
def traced_train(*args, **kwargs):
  kwargs['trace_every_n_steps'] = every
  return plain_train(*args, **kwargs)
learning.train = traced_train
sys.argv = ['train.py'] + sys.argv[2:]
runpy.run_path('deeplab/train.py', run_name='__main__')
'''

# deeplab-train with a trace every argv[1] steps; the rest are its flags.
_OURS_WRAPPER = '''
import sys
import deeplab_train.cli  # the commands' process settings, before TensorFlow
from deeplab_train.runtime import run
run.PROFILE_STEPS = int(sys.argv[1])
from deeplab_train.cli import train
sys.argv = ['deeplab-train'] + sys.argv[2:]
train.run()
'''


def kind_of(op_type):
  for kind, parts in KINDS:
    if any(p in op_type for p in parts):
      return kind
  return OTHER


# The kind whose ops the wall-time split separates from the rest, and the
# parts of a step's wall time: while one of them runs, while only other ops
# run, while no op runs.
DENSE = 'conv / 1x1 matmul'
WALL_PARTS = ('a conv/matmul runs', 'only other ops run', 'no op runs')


def covered_ms(intervals):
  """Wall time (ms) covered by the union of (start, end) intervals in us."""
  total, reach = 0, None
  for start, end in sorted(intervals):
    if reach is None or start > reach:
      total += end - start
      reach = end
    elif end > reach:
      total += end - reach
      reach = end
  return total / 1000.0


def _moments(spans):
  """(us, {op type: spans running}, spans running) for each stretch of
  time between the starts and ends of (start, end, op type) spans in us,
  where some span runs."""
  points = []
  for start, end, op in spans:
    if end > start:
      points += [(start, 1, op), (end, -1, op)]
  # At one time, spans end before others start.
  points.sort(key=lambda p: (p[0], p[1]))
  running = collections.Counter()
  count, last = 0, None
  for at, change, op in points:
    if count and at > last:
      yield at - last, running, count
    running[op] += change
    count += change
    if not running[op]:
      del running[op]
    last = at


def wall_share_ms(spans):
  """{op type: ms}: the wall time covered by (start, end, op type) spans in
  us, each moment shared equally among the spans running then."""
  share = collections.Counter()
  for us, running, count in _moments(spans):
    for name, n in running.items():
      share[name] += us * n / count
  return {op: us / 1000.0 for op, us in share.items()}


def alone_ms(spans):
  """{op type: ms}: the wall time during which a span of that type is the
  only one running: the step's serial stretches, where one inter-op thread
  has nothing to run (the op may still use every intra-op thread)."""
  alone = collections.Counter()
  for us, running, count in _moments(spans):
    if count == 1:
      alone[next(iter(running))] += us
  return {op: us / 1000.0 for op, us in alone.items()}


def summarize_trace(path):
  """{'wall_ms', 'op_ms', 'kinds': {kind: ms}, 'ops': {op type: ms},
  'wall_parts': {part: ms}, 'wall_share': {op type: ms},
  'alone': {op type: ms}}: op time summed by kind and type, the step's
  wall time split into WALL_PARTS (ops overlap, so their times add up to
  more than the wall time), each op type's share of the wall time
  (wall_share_ms) and the time it runs alone (alone_ms)."""
  with open(path) as f:
    events = json.load(f)['traceEvents']
  kinds, ops = collections.Counter(), collections.Counter()
  dense, busy, spans = [], [], []
  for event in events:
    if event.get('ph') != 'X':
      continue
    op = event.get('args', {}).get('op') or event.get('name')
    kind, duration = kind_of(op), event.get('dur', 0)
    kinds[kind] += duration / 1000.0
    ops[op] += duration / 1000.0
    busy.append((event['ts'], event['ts'] + duration))
    spans.append(busy[-1] + (op,))
    if kind == DENSE:
      dense.append(busy[-1])
  wall = (max(e for _, e in busy) - min(s for s, _ in busy)) / 1000.0 \
      if busy else 0.0
  dense_ms, busy_ms = covered_ms(dense), covered_ms(busy)
  return {'wall_ms': wall, 'op_ms': sum(kinds.values()),
          'kinds': dict(kinds), 'ops': dict(ops),
          'wall_parts': dict(zip(WALL_PARTS, (dense_ms, busy_ms - dense_ms,
                                              wall - busy_ms))),
          'wall_share': wall_share_ms(spans), 'alone': alone_ms(spans)}


def run_logged(argv, log_path, cwd=None, env=None):
  with open(log_path, 'w') as log:
    code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT,
                           cwd=cwd, env=env)
  if code:
    sys.exit('%s failed (exit %d): see %s' % (argv[0], code, log_path))


def trace_original(original_dir, flags, work, steps, every):
  logdir = work / 'original'
  wrapper = work / 'original_wrapper.py'
  wrapper.write_text(_ORIGINAL_WRAPPER)
  script = ('source %s/env.sh && cd %s/research && exec python %s "$@"'
            % (original_dir, original_dir, wrapper))
  run_logged(['bash', '-c', script, 'trace', str(every)] + flags +
             ['--train_logdir=%s' % logdir,
              '--training_number_of_steps=%d' % steps],
             work / 'original.log')
  # tf_slim names the trace after the step count once it is done.
  return _last_trace(logdir, 'tf_trace-*.json')


def trace_ours(flags, work, steps, every):
  logdir = work / 'ours'
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  run_logged([sys.executable, '-c', _OURS_WRAPPER, str(every)] + flags +
             ['--train_logdir=%s' % logdir, '--profile_logdir=%s' % logdir,
              '--training_number_of_steps=%d' % steps],
             work / 'ours.log', cwd=str(REPO), env=env)
  return _last_trace(logdir, 'timeline-*.json')


def _last_trace(logdir, pattern):
  def step(path):
    return int(path.rsplit('-', 1)[1].split('.')[0])
  traces = sorted(glob.glob(str(logdir / pattern)), key=step)
  if not traces:
    sys.exit('no trace written in %s' % logdir)
  return traces[-1]


def _share(ms, whole_ms):
  """One table cell: ms and its share of whole_ms."""
  return '%12.1f ms %5.1f%%' % (ms, 100.0 * ms / max(whole_ms, 1e-9))


def table(named):
  """Rows of op time per kind, one column pair per (name, summary)."""
  kinds = [k for k, _ in KINDS] + [OTHER]
  head = '%-22s' % 'kind' + ''.join('%22s' % n for n, _ in named)
  lines = [head]
  for kind in kinds:
    lines.append('%-22s' % kind + ''.join(
        _share(s['kinds'].get(kind, 0.0), s['op_ms']) for _, s in named))
  lines.append('%-22s' % 'sum of op times' +
               ''.join('%15.1f ms   ' % s['op_ms'] for _, s in named))
  lines.append('%-22s' % 'wall time of the step' +
               ''.join('%15.1f ms   ' % s['wall_ms'] for _, s in named))
  for part in WALL_PARTS:
    lines.append('%-22s' % ('  ' + part) + ''.join(
        _share(s['wall_parts'][part], s['wall_ms']) for _, s in named))
  for name, s in named:
    lines.append('slowest op types, %s:' % name)
    top = sorted(s['ops'].items(), key=lambda kv: -kv[1])[:12]
    lines.extend('  %-48s %8.1f ms' % kv for kv in top)
  for name, s in named:
    lines.append('op types by their share of the wall time, %s:' % name)
    lines.extend(_top_shares(s['wall_share'], s['wall_ms']))
  for name, s in named:
    alone = s['alone']
    lines.append('op types running alone, %s (one op at a time, %s of '
                 'the wall time):' % (name, _share(sum(alone.values()),
                                                   s['wall_ms']).strip()))
    lines.extend(_top_shares(alone, s['wall_ms']))
  return '\n'.join(lines)


def _top_shares(ms_by_op, wall_ms, count=12):
  """Table lines of the `count` op types with the most ms in `ms_by_op`,
  each with its ms and share of `wall_ms`."""
  top = sorted(ms_by_op.items(), key=lambda kv: -kv[1])[:count]
  return ['  %-48s %s' % (op, _share(ms, wall_ms)) for op, ms in top]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--original_dir')
  parser.add_argument('--dataset_dir', required=True)
  parser.add_argument('--work', default='work/profile')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('flags', nargs='*',
                      help='trainer flags (after --), e.g. --model_variant=X')
  args = parser.parse_args()
  work = pathlib.Path(args.work).resolve()
  work.mkdir(parents=True, exist_ok=True)
  flags = ['--dataset=pascal_voc_seg', '--dataset_dir=%s' % args.dataset_dir,
           '--log_steps=1'] + args.flags
  every = max(1, args.steps * 3 // 4)
  named = []
  if args.original_dir:
    original = summarize_trace(trace_original(
        pathlib.Path(args.original_dir).resolve(), flags, work, args.steps,
        every))
    named.append(('original', original))
  named.append(('deeplab-train', summarize_trace(
      trace_ours(flags, work, args.steps, every))))
  print(table(named))
  with open(work / 'profile.json', 'w') as f:
    json.dump(dict(named), f, indent=1, sort_keys=True)


if __name__ == '__main__':
  main()
