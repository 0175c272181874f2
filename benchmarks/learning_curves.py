"""Learning curves of the original DeepLab and deeplab-train, side by side.

    python benchmarks/learning_curves.py --original_dir=/tmp/deeplab-original \
        --work=work/curves [--seeds=3] [--steps=3000] [--eval_every=750]

Converts the bundled sample data (data/) as a 21-class pascal_voc_seg set
(the original's own dataset, so the original reads it as it is), then for
each seed trains the original (DIR/train.sh, made by the original's
setup.sh) and deeplab-train with the same flags on the same records, in
chunks ending at each evaluation step, and evaluates every chunk's
checkpoint of both with the same evaluator (deeplab-eval, single scale, the
val split). Both poly schedules run over the whole --steps (the original's
--decay_steps, our --training_number_of_steps with --num_steps_more), so
chunking does not change them. Prints the table of val mIoU per step (mean
and standard deviation over the seeds) and writes every figure to
WORK/curves.json. Runs one process at a time: on 2 cores a run of 3 seeds
to 3000 steps takes about two hours.

The original has no seed flag (its runs differ by TensorFlow's own random
seeds); deeplab-train gets --seed from the seed and the chunk. Without
--original_dir only
deeplab-train's curve is measured.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
# The recipe of the issue that found the lag (mobilenet_v2 from scratch).
RECIPE = ['--model_variant=mobilenet_v2', '--output_stride=16',
          '--train_crop_size=129,129', '--train_batch_size=8',
          '--fine_tune_batch_norm=true', '--base_learning_rate=0.007',
          '--slow_start_step=100', '--slow_start_learning_rate=0.0005',
          '--learning_policy=poly', '--min_scale_factor=0.5',
          '--max_scale_factor=2.0', '--scale_factor_step_size=0.25']
# No eval crop: each image is padded only as far as the output stride needs.
EVAL_FLAGS = ['--model_variant=mobilenet_v2', '--output_stride=16']


def run(args, log, env=None):
  """Runs a command, appending its output to `log`; raises on failure."""
  with open(log, 'a') as f:
    f.write('\n$ %s\n' % ' '.join(args))
    f.flush()
    proc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT,
                          env=env, check=False)
  if proc.returncode:
    raise RuntimeError('%s exited %d (see %s)' % (args[0], proc.returncode,
                                                   log))


def build_records(work, log):
  records = work / 'records'
  if not (records / 'dataset.json').exists():
    data = REPO / 'data'
    run(['deeplab-build-data', '--image_folder=%s' % (data / 'JPEGImages'),
         '--semantic_segmentation_folder=%s' % (data / 'SegmentationClass'),
         '--list_folder=%s' % (data / 'ImageSets' / 'Segmentation'),
         '--output_dir=%s' % records, '--dataset_name=pascal_voc_seg',
         '--num_classes=21', '--num_shards=4'], log)
  return records


def evaluate(checkpoint, records, out_dir, log):
  """val mIoU of one checkpoint prefix, by deeplab-eval."""
  result = out_dir / 'eval.json'
  run(['deeplab-eval', '--checkpoint_dir=%s' % checkpoint,
       '--dataset=pascal_voc_seg', '--dataset_dir=%s' % records,
       '--eval_split=val', '--eval_logdir=%s' % out_dir,
       '--eval_result_json=%s' % result] + EVAL_FLAGS, log)
  return json.loads(result.read_text())['miou']


def has_checkpoint(logdir, step):
  return pathlib.Path(str(logdir / ('model.ckpt-%d' % step)) +
                      '.index').exists()


def latest_checkpoint(logdir, step):
  prefix = logdir / ('model.ckpt-%d' % step)
  if not pathlib.Path(str(prefix) + '.index').exists():
    raise RuntimeError('no checkpoint of step %d in %s' % (step, logdir))
  return prefix


def curve_ours(records, work, seed, steps, eval_steps, log):
  logdir = work / ('ours-seed%d' % seed)
  curve, done, seconds = [], 0, 0.0
  for stop in eval_steps:
    start = time.time()
    if has_checkpoint(logdir, stop):  # a rerun: this chunk is trained
      done = stop
      curve.append(evaluate(latest_checkpoint(logdir, stop), records,
                            logdir / ('eval-%d' % stop), log))
      continue
    run(['deeplab-train', '--train_logdir=%s' % logdir,
         '--dataset=pascal_voc_seg', '--dataset_dir=%s' % records,
         '--training_number_of_steps=%d' % steps,
         '--num_steps_more=%d' % (stop - done),
         # A new input order for each chunk (one seed would replay the
         # first chunk's batches after every restart).
         '--seed=%d' % (seed * 100000 + done),
         '--save_interval_secs=0', '--log_steps=100',
         '--save_summaries_secs=0'] + RECIPE, log)
    seconds += time.time() - start
    done = stop
    curve.append(evaluate(latest_checkpoint(logdir, stop), records,
                          logdir / ('eval-%d' % stop), log))
  return curve, seconds


def curve_original(original_dir, records, work, seed, steps, eval_steps,
                   log):
  logdir = work / ('original-seed%d' % seed)
  curve, seconds = [], 0.0
  for stop in eval_steps:
    start = time.time()
    if not has_checkpoint(logdir, stop):  # else a rerun: already trained
      run([str(original_dir / 'train.sh'), '--train_logdir=%s' % logdir,
           '--dataset=pascal_voc_seg', '--dataset_dir=%s' % records,
           '--training_number_of_steps=%d' % stop, '--decay_steps=%d' % (
               steps - 100), '--save_interval_secs=100000',
           '--log_steps=100', '--save_summaries_secs=100000'] + RECIPE, log)
    seconds += time.time() - start
    curve.append(evaluate(latest_checkpoint(logdir, stop), records,
                          logdir / ('eval-%d' % stop), log))
  return curve, seconds


def table(eval_steps, curves):
  lines = ['step   ' + '  '.join('%-22s' % name for name in curves)]
  for i, step in enumerate(eval_steps):
    cells = []
    for runs in curves.values():
      values = np.array([c[i] for c in runs])
      cells.append('%.3f +- %.3f (%s)' % (values.mean(), values.std(),
                                          ' '.join('%.2f' % v for v in values)))
    lines.append('%-6d ' % step + '  '.join('%-22s' % c for c in cells))
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--original_dir', type=pathlib.Path)
  parser.add_argument('--work', type=pathlib.Path, default=REPO / 'work' /
                      'curves')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=3000)
  parser.add_argument('--eval_every', type=int, default=750)
  args = parser.parse_args()
  args.work = args.work.resolve()
  args.work.mkdir(parents=True, exist_ok=True)
  log = args.work / 'log.txt'
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  records = build_records(args.work, log)
  eval_steps = list(range(args.eval_every, args.steps + 1, args.eval_every))
  curves, seconds = {'deeplab-train': []}, {'deeplab-train': []}
  if args.original_dir:
    curves['original'], seconds['original'] = [], []
  for seed in range(1, args.seeds + 1):
    for name in curves:
      if name == 'original':
        curve, took = curve_original(args.original_dir, records, args.work,
                                     seed, args.steps, eval_steps, log)
      else:
        curve, took = curve_ours(records, args.work, seed, args.steps,
                                 eval_steps, log)
      curves[name].append(curve)
      seconds[name].append(took)
      print('seed %d %-14s %s  (%.0f s of training)' % (
          seed, name, ' '.join('%.3f' % v for v in curve), took), flush=True)
  report = {'eval_steps': eval_steps, 'curves': curves,
            'training_seconds': seconds, 'recipe': RECIPE}
  (args.work / 'curves.json').write_text(json.dumps(report, indent=1))
  print(table(eval_steps, curves))


if __name__ == '__main__':
  sys.exit(main())
