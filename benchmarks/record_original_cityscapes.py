"""Records what the original DeepLab's Cityscapes converter writes, as
reference facts for deeplab-build-data's Cityscapes layout.

Run with the original's environment (see record_original_step.py):

    source DIR/env.sh
    python benchmarks/record_original_cityscapes.py \\
        --original_dir DIR --out tests/reference/cityscapes_records.npz

It writes the fixed tiny tree of tests/cityscapes_tree.py (labels as train
ids, the original converter's input), runs the original's
datasets/build_cityscapes_data.py on it (train and val, its 10 shards per
split) and stores every record, in the order of its shards: the features
other than the encoded bytes, and the decoded image and label (so that
PNG encoders of other versions compare equal).

The converter is run with two import shims, as the rest of the original
here: `tensorflow` is tensorflow.compat.v1, and `collections.Iterable` is
collections.abc.Iterable (gone in Python 3.10).
"""
import argparse
import collections
import collections.abc
import glob
import io
import os
import runpy
import sys
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                '..', 'tests'))
import cityscapes_tree  # pylint: disable=g-import-not-at-top,wrong-import-position

SPLITS = ('train', 'val')


def run_original_converter(original_dir, root, output_dir):
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  collections.Iterable = collections.abc.Iterable
  sys.modules['tensorflow'] = tf1
  script = os.path.join(original_dir, 'research', 'deeplab', 'datasets',
                        'build_cityscapes_data.py')
  sys.path.insert(0, os.path.dirname(script))
  sys.argv = [script, '--cityscapes_root=' + root,
              '--output_dir=' + output_dir]
  try:
    runpy.run_path(script, run_name='__main__')
  except SystemExit as e:  # tf.app.run exits
    if e.code:
      raise


def read_records(output_dir, split):
  import tensorflow.compat.v1 as tf1  # pylint: disable=g-import-not-at-top
  out = []
  for path in sorted(glob.glob(os.path.join(output_dir, split + '-*'))):
    for raw in tf1.io.tf_record_iterator(path):
      out.append(tf1.train.Example.FromString(raw).features.feature)
  return out


def facts(output_dir):
  """{key: array} of every record of SPLITS."""
  out = {}
  for split in SPLITS:
    records = read_records(output_dir, split)
    out[split + '/count'] = np.array(len(records))
    for i, feature in enumerate(records):
      prefix = '%s/%d/' % (split, i)
      for key, value in sorted(feature.items()):
        if key.endswith('/encoded'):
          array = np.asarray(Image.open(io.BytesIO(value.bytes_list.value[0])))
          out[prefix + key.replace('/encoded', '/decoded')] = array
        elif value.bytes_list.value:
          out[prefix + key] = np.array(value.bytes_list.value[0].decode())
        else:
          out[prefix + key] = np.array(value.int64_list.value[0])
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--original_dir', required=True)
  parser.add_argument('--out', required=True)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as work:
    root = os.path.join(work, 'cityscapes')
    output_dir = os.path.join(work, 'tfrecord')
    os.makedirs(output_dir)
    cityscapes_tree.write_reference_tree(root)
    run_original_converter(os.path.abspath(args.original_dir), root,
                           output_dir)
    recorded = facts(output_dir)
  temp = args.out + '.tmp.npz'
  np.savez_compressed(temp, **recorded)
  os.replace(temp, args.out)
  print('wrote %s: %s' % (args.out, ', '.join(
      '%s %d records' % (s, recorded[s + '/count']) for s in SPLITS)))


if __name__ == '__main__':
  main()
