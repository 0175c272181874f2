#!/usr/bin/env python3
"""Throughput of the training input pipeline on the bundled sample data.

    python benchmarks/bench_input.py [--crop 321] [--batch_size 4] [--steps 100]

Converts data/ (the sample dataset) into TFRecords in a temp folder, builds
the training pipeline (shuffle, repeat, random scale 0.5-2.0 in 0.25 steps,
pad, crop, flip) and times `--steps` batches after `--warmup` batches.
Prints images/s and a JSON line.
"""
import argparse
import json
import os
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow.compat.v1 as tf  # noqa: E402

from deeplab_train.config import PreprocessOptions  # noqa: E402
from deeplab_train.data import build  # noqa: E402
from deeplab_train.data import pipeline  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def convert_sample_data(output_dir):
  data = os.path.join(REPO, 'data')
  options = build.BuildOptions(num_classes=5, dataset_name='shapes')
  return build.build_voc(os.path.join(data, 'JPEGImages'),
                         os.path.join(data, 'SegmentationClass'),
                         os.path.join(data, 'ImageSets', 'Segmentation'),
                         output_dir, options, split_name='train')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--crop', type=int, default=321)
  parser.add_argument('--batch_size', type=int, default=4)
  parser.add_argument('--warmup', type=int, default=10)
  parser.add_argument('--steps', type=int, default=100)
  parser.add_argument('--num_parallel_calls', type=int,
                      default=pipeline.AUTOTUNE)
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    info = convert_sample_data(tmp)
    options = PreprocessOptions(crop_size=(args.crop, args.crop),
                                min_scale_factor=0.5, max_scale_factor=2.0,
                                scale_factor_step_size=0.25)
    with tf.Graph().as_default():
      dataset = pipeline.make_dataset(
          tmp, 'train', info, options, args.batch_size, is_training=True,
          num_parallel_calls=args.num_parallel_calls, seed=0)
      batch = tf.data.make_one_shot_iterator(dataset).get_next()
      with tf.Session() as sess:
        for _ in range(args.warmup):
          sess.run(batch)
        start = time.perf_counter()
        for _ in range(args.steps):
          sess.run(batch)
        seconds = time.perf_counter() - start
  images = args.steps * args.batch_size
  rate = images / seconds
  print('input pipeline: %.1f images/s (%d images of %dx%d in %.2f s, '
        'batch %d, %d cores)' % (rate, images, args.crop, args.crop, seconds,
                                 args.batch_size, os.cpu_count()))
  print(json.dumps({'benchmark': 'input_pipeline', 'images_per_sec':
                    round(rate, 1), 'crop': args.crop,
                    'batch_size': args.batch_size, 'steps': args.steps,
                    'cpu_count': os.cpu_count()}))


if __name__ == '__main__':
  main()
