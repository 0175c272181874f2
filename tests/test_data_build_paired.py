"""deeplab-build-data's ADE20K layout: the original ADE20K converter's
flags, a folder of images and one of labels for each of train and val."""
import json
import os

import numpy as np
from PIL import Image
import pytest

from deeplab_train.config import ConfigError
from deeplab_train.data import build
from deeplab_train.data import datasets
import test_data_build
import test_data_common as common

ADE = datasets.BUILTIN_DATASETS['ade20k']


def write_split(root, folder, seed, count):
  """ADEChallengeData2016's layout: images/<folder>/<stem>.jpg and
  annotations/<folder>/<stem>.png (grey, ids 0-150). Returns the image and
  label folders and {stem: ids}."""
  images = os.path.join(root, 'images', folder)
  labels = os.path.join(root, 'annotations', folder)
  os.makedirs(images)
  os.makedirs(labels)
  wanted = {}
  for i, (name, image, _) in enumerate(common.tiny_pairs(seed, count)):
    stem = 'ADE_%s_%08d' % (folder, seed * 100 + i)
    ids = np.random.RandomState(seed + i).randint(
        0, 151, image.shape[:2]).astype(np.uint8)
    Image.fromarray(image).save(os.path.join(images, stem + '.jpg'))
    Image.fromarray(ids).save(os.path.join(labels, stem + '.png'))
    wanted[stem] = ids
    del name
  return images, labels, wanted


def test_train_and_val_from_their_folders(tmp_path):
  root = str(tmp_path / 'ADEChallengeData2016')
  train = write_split(root, 'training', 1, 3)
  val = write_split(root, 'validation', 2, 2)
  out = str(tmp_path / 'out')
  options = build.BuildOptions(num_classes=151, ignore_label=0,
                               dataset_name='ade20k', num_shards=2)
  info = build.build_paired_splits(
      [('train', train[0], train[1]), ('val', val[0], val[1])], out, options)
  assert info.splits_to_sizes == {'train': 3, 'val': 2}
  for split, (_, _, wanted) in (('train', train), ('val', val)):
    records = test_data_build.records_by_name(out, split, 2)
    assert list(records) == sorted(wanted)
    for name, (_, _, ids) in records.items():
      np.testing.assert_array_equal(ids, wanted[name])

  # A folder of the pair missing is named by its split's field.
  with pytest.raises(ConfigError) as e:
    build.build_paired_splits(
        [('val', val[0], str(tmp_path / 'none'))], out, options)
  assert e.value.render() == 'val_image_label_folder=%s is not a folder' % (
      tmp_path / 'none')


def test_cli_takes_the_original_converters_flags(tmp_path):
  root = str(tmp_path / 'ADEChallengeData2016')
  train = write_split(root, 'training', 3, 2)
  val = write_split(root, 'validation', 4, 1)
  out = str(tmp_path / 'out')
  pairs = ['--train_image_folder', train[0],
           '--train_image_label_folder', train[1],
           '--val_image_folder', val[0], '--val_image_label_folder', val[1]]
  proc = test_data_build._cli(pairs + ['--output_dir', out,
                                       '--num_shards', '2'], str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.splitlines()[-1])
  assert (result['status'], result['dataset'], result['num_classes'],
          result['ignore_label'], result['splits']) == (
              'ok', 'ade20k', 151, 0, {'train': 2, 'val': 1})
  assert datasets.read_dataset_json(out).class_names == ADE.class_names
  # Each split converted now has its statistics table.
  tables = [line.split(':')[0] for line in proc.stdout.splitlines()
            if line.startswith('split ')]
  assert tables == ["split 'train'", "split 'val'"], proc.stdout

  # Bad flags are named before any conversion, and nothing is written.
  cases = [
      (['--val_image_folder', val[0]],
       '--val_image_folder=%s needs --val_image_label_folder: give the '
       'folder of the split\'s labels' % val[0]),
      (['--train_image_label_folder', train[1]],
       '--train_image_label_folder=%s needs --train_image_folder: give the '
       'folder of the split\'s images' % train[1]),
      (pairs + ['--split_name=val'],
       '--split_name is not read in the layout --train_image_folder selects: '
       'the splits converted are those whose --SPLIT_image_folder is given'),
      (pairs + ['--list_folder=lists'],
       '--list_folder is not read in the layout --train_image_folder '
       'selects'),
      (['--val_image_folder', val[0], '--val_image_label_folder', val[1],
        '--masks_folder', val[1]],
       '--masks_folder and --val_image_folder select two layouts; give one'),
      (['--train_image_label_folder', train[1], '--masks_folder', val[1]],
       '--masks_folder and --train_image_label_folder select two layouts; '
       'give one'),
      (['--train_image_folder', train[0], '--train_image_label_folder',
        str(tmp_path / 'none')],
       '--train_image_label_folder=%s is not a folder' % (tmp_path / 'none')),
  ]
  for args, message in cases:
    proc = test_data_build._cli(args + ['--output_dir', str(tmp_path / 'o')],
                                str(tmp_path))
    assert proc.returncode == 2, (args, proc.stderr)
    assert proc.stderr.splitlines()[-1].startswith(
        'deeplab-build-data: error: ' + message), proc.stderr
  assert not (tmp_path / 'o').exists()
