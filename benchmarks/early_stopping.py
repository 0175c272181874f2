"""Early stopping on a run that overfits: where it stops, what best/ keeps.

    python benchmarks/early_stopping.py --work=work/early_stopping \
        [--train_images=4] [--steps=3000] [--interval=100] [--patience=4] \
        [--min_delta=0] [--learning_rate=0.05] [--seed=0]

Copies the bundled sample data (data/) with a train split cut down to its
first TRAIN_IMAGES images (the val split is left whole), so that the
demo's model (half-width mobilenet_v2, crop 129, batch 8, no scale
augmentation) learns those images by heart. Trains with validation on val
every INTERVAL steps and --early_stopping_patience=PATIENCE, then prints
the validation history, the peak, the step the run stopped at and why,
the number of evaluations between the peak and the stop, and the step
best/ holds. Writes them to WORK/early_stopping.json.
"""
import argparse
import json
import pathlib
import shutil

import class_weights as cw  # benchmarks/: command, run, the sample's names


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--work', default='work/early_stopping')
  parser.add_argument('--train_images', type=int, default=4)
  parser.add_argument('--steps', type=int, default=3000)
  parser.add_argument('--interval', type=int, default=100)
  parser.add_argument('--patience', type=int, default=4)
  parser.add_argument('--min_delta', type=float, default=0.0)
  parser.add_argument('--learning_rate', type=float, default=0.05)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  work = pathlib.Path(args.work).resolve()
  work.mkdir(parents=True, exist_ok=True)
  log = work / 'log.txt'
  data = work / 'data'
  shutil.rmtree(data, ignore_errors=True)
  shutil.copytree(cw.SAMPLE, data)
  lists = data / 'ImageSets' / 'Segmentation'
  ids = (lists / 'train.txt').read_text().split()[:args.train_images]
  (lists / 'train.txt').write_text('\n'.join(ids) + '\n')
  records = work / 'records'
  shutil.rmtree(records, ignore_errors=True)
  cw.run([cw.command('deeplab-build-data'),
          '--image_folder=%s' % (data / 'JPEGImages'),
          '--semantic_segmentation_folder=%s' % (data / 'SegmentationClass'),
          '--list_folder=%s' % lists, '--output_dir=%s' % records,
          '--dataset_name=shapes', '--num_classes=5', '--colormap=pascal',
          '--class_names=%s' % cw.CLASS_NAMES], log)
  logdir = work / 'train'
  shutil.rmtree(logdir, ignore_errors=True)
  result_file = work / 'train_result.json'
  flags = [f for f in cw.TRAIN_FLAGS if 'scale_factor' not in f
           and 'learning_rate' not in f]
  cw.run([cw.command('deeplab-train'), '--train_logdir=%s' % logdir,
          '--dataset_dir=%s' % records, '--seed=%d' % args.seed,
          '--training_number_of_steps=%d' % args.steps,
          '--base_learning_rate=%g' % args.learning_rate,
          '--min_scale_factor=1', '--max_scale_factor=1',
          '--eval_split=val', '--eval_interval_steps=%d' % args.interval,
          '--early_stopping_patience=%d' % args.patience,
          '--early_stopping_min_delta=%g' % args.min_delta,
          '--result_json=%s' % result_file] + flags, log)
  result = json.loads(result_file.read_text())
  history = [json.loads(line) for line in
             (logdir / 'metrics_history.jsonl').read_text().splitlines()
             if line.strip()]
  peak = max(history, key=lambda r: r['miou'])
  after_peak = sum(1 for r in history if r['step'] > peak['step'])
  best_state = (logdir / 'best' / 'checkpoint').read_text()
  summary = {
      'train_images': len(ids), 'interval': args.interval,
      'patience': args.patience, 'min_delta': args.min_delta,
      'stop_reason': result['stop_reason'],
      'stopped_at': result['global_step'],
      'peak': {'step': peak['step'], 'miou': peak['miou']},
      'evaluations_after_peak': after_peak,
      'best_checkpoint_state': best_state.splitlines()[0],
      'history': [(r['step'], r['miou']) for r in history]}
  print('%8s %8s' % ('step', 'val mIoU'))
  for step, miou in summary['history']:
    print('%8d %8.4f%s' % (step, miou,
                           '  <- peak' if step == peak['step'] else ''))
  print('stopped at step %d (%s), %d evaluations after the peak at step %d '
        '(patience %d); best/: %s'
        % (result['global_step'], result['stop_reason'], after_peak,
           peak['step'], args.patience, summary['best_checkpoint_state']))
  (work / 'early_stopping.json').write_text(json.dumps(summary, indent=1))


if __name__ == '__main__':
  main()
