"""Class weights on a rare class: --label_weights none vs auto, same steps.

    python benchmarks/class_weights.py --work=work/class_weights \
        [--rare_class=3] [--keep=0.1] [--steps=1500] [--seed=0] \
        [--schemes=none,auto,auto_inverse_sqrt]

Copies the bundled sample data (data/) with class RARE made rare in the
train split: of the train images that contain it, only the share KEEP is
kept (the val split is left whole). Converts it with deeplab-build-data
(whose table shows the class's new share), then trains the demo's model
(half-width mobilenet_v2, crop 129, batch 8) for --steps steps once per
weighting scheme, with the same seed, and evaluates each on val with
deeplab-eval. Prints the rare class's IoU and the mIoU per scheme, and
writes them to WORK/class_weights.json. One seed per scheme: differences
of a few points can be noise; repeat with other --seed values.
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / 'data'
CLASS_NAMES = ('background,red_disk,green_striped_square,'
               'blue_dotted_triangle,yellow_ring')
TRAIN_FLAGS = ['--dataset=shapes', '--model_variant=mobilenet_v2',
               '--depth_multiplier=0.5', '--train_batch_size=8',
               '--train_crop_size=129,129', '--base_learning_rate=0.02',
               '--min_scale_factor=0.5', '--max_scale_factor=1.5',
               '--log_steps=100', '--save_summaries_secs=0']


def command(name):
  """A console script of this environment's deeplab-train."""
  return str(pathlib.Path(sys.executable).parent / name)


def run(argv, log):
  with open(log, 'a') as f:
    f.write('\n$ %s\n' % ' '.join(argv))
    f.flush()
    code = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT)
  if code:
    sys.exit('%s failed (exit %d): see %s' % (argv[0], code, log))


def make_rare(work, rare_class, keep, seed):
  """The sample's folders with few train images holding `rare_class`."""
  data = work / 'data'
  if data.exists():
    shutil.rmtree(data)
  shutil.copytree(SAMPLE, data)
  lists = data / 'ImageSets' / 'Segmentation'
  ids = (lists / 'train.txt').read_text().split()
  with_rare = [i for i in ids if rare_class in np.asarray(
      Image.open(data / 'SegmentationClass' / (i + '.png')))]
  rng = np.random.RandomState(seed)
  kept = set(rng.choice(with_rare, int(round(keep * len(with_rare))),
                        replace=False).tolist())
  train = [i for i in ids if i not in with_rare or i in kept]
  (lists / 'train.txt').write_text('\n'.join(train) + '\n')
  return data, len(with_rare), len(kept), len(train)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--work', default='work/class_weights')
  parser.add_argument('--rare_class', type=int, default=3)
  parser.add_argument('--keep', type=float, default=0.1)
  parser.add_argument('--steps', type=int, default=1500)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--schemes', default='none,auto,auto_inverse_sqrt')
  args = parser.parse_args()
  work = pathlib.Path(args.work).resolve()
  work.mkdir(parents=True, exist_ok=True)
  log = work / 'log.txt'
  data, had, kept, train_size = make_rare(work, args.rare_class, args.keep,
                                          args.seed)
  records = work / 'records'
  shutil.rmtree(records, ignore_errors=True)
  run([command('deeplab-build-data'),
       '--image_folder=%s' % (data / 'JPEGImages'),
       '--semantic_segmentation_folder=%s' % (data / 'SegmentationClass'),
       '--list_folder=%s' % (data / 'ImageSets' / 'Segmentation'),
       '--output_dir=%s' % records, '--dataset_name=shapes',
       '--num_classes=5', '--colormap=pascal',
       '--class_names=%s' % CLASS_NAMES], log)
  info = json.loads((records / 'dataset.json').read_text())
  counts = info['statistics']['train']['class_pixels']
  rare_name = CLASS_NAMES.split(',')[args.rare_class]
  results = {'rare_class': rare_name, 'train_images': train_size,
             'train_images_with_rare': [had, kept], 'steps': args.steps,
             'seed': args.seed, 'train_class_pixels': counts, 'runs': {}}
  for scheme in args.schemes.split(','):
    logdir = work / ('train_' + scheme)
    shutil.rmtree(logdir, ignore_errors=True)
    weights = [] if scheme == 'none' else ['--label_weights=' + scheme]
    run([command('deeplab-train'), '--train_logdir=%s' % logdir,
         '--dataset_dir=%s' % records, '--seed=%d' % args.seed,
         '--training_number_of_steps=%d' % args.steps] + TRAIN_FLAGS +
        weights, log)
    result_file = work / ('eval_%s.json' % scheme)
    run([command('deeplab-eval'), '--checkpoint_dir=%s' % logdir,
         '--dataset_dir=%s' % records, '--eval_logdir=%s' % (logdir / 'eval'),
         '--eval_result_json=%s' % result_file], log)
    result = json.loads(result_file.read_text())
    results['runs'][scheme] = {
        'miou': result['miou'],
        'rare_class_iou': result['per_class_iou'][rare_name],
        'per_class_iou': result['per_class_iou']}
  print('rare class %s: %d of %d train images holding it kept (%.2f %% of '
        'the train pixels); %d train images, %d steps, seed %d'
        % (rare_name, kept, had, 100.0 * counts[args.rare_class] / sum(counts),
           train_size, args.steps, args.seed))
  print('%-20s %10s %16s' % ('label_weights', 'mIoU', 'rare class IoU'))
  for scheme, run_result in results['runs'].items():
    print('%-20s %10.4f %16.4f' % (scheme, run_result['miou'],
                                   run_result['rare_class_iou']))
  (work / 'class_weights.json').write_text(json.dumps(results, indent=1))


if __name__ == '__main__':
  main()
