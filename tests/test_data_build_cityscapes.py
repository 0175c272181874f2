"""deeplab-build-data's Cityscapes layout: leftImg8bit/ and gtFine/ folders
by split and city, labels as train ids or as the label ids the dataset
ships (mapped to train ids)."""
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest

from deeplab_train.config import ConfigError
from deeplab_train.data import build
from deeplab_train.data import datasets
import test_data_build
import test_data_common as common

OPTIONS = build.BuildOptions(num_classes=19, dataset_name='cityscapes',
                             num_shards=2)

# Label ids of the dataset with the train id each stands for (255: not
# trained on): unlabeled, road, parking, building, guard rail, sky,
# license plate's 8-bit -1, bicycle.
LABEL_IDS = np.array([0, 7, 9, 11, 14, 23, 255, 33], dtype=np.uint8)
TRAIN_IDS = np.array([255, 0, 255, 2, 255, 10, 255, 18], dtype=np.uint8)


def write_city(root, split, city, count, rng, labels='train_ids'):
  """Writes `count` images of one city; returns {stem: want train ids}.

  Args:
    labels: 'train_ids' (*_gtFine_labelTrainIds.png), 'label_ids'
      (*_gtFine_labelIds.png, with the other label files the dataset
      ships beside them) or None (no label).
  """
  image_dir = os.path.join(root, 'leftImg8bit', split, city)
  label_dir = os.path.join(root, 'gtFine', split, city)
  os.makedirs(image_dir, exist_ok=True)
  os.makedirs(label_dir, exist_ok=True)
  want = {}
  for i in range(count):
    stem = '%s_%06d_000019' % (city, i)
    height, width = int(rng.randint(17, 30)), int(rng.randint(17, 30))
    Image.fromarray(common.random_image(rng, height, width)).save(
        os.path.join(image_dir, stem + '_leftImg8bit.png'))
    index = common.blocky_label(rng, height, width, len(LABEL_IDS), block=4)
    if labels == 'train_ids':
      Image.fromarray(TRAIN_IDS[index], 'L').save(
          os.path.join(label_dir, stem + '_gtFine_labelTrainIds.png'))
    elif labels == 'label_ids':
      label_ids = LABEL_IDS[index]
      Image.fromarray(label_ids, 'L').save(
          os.path.join(label_dir, stem + '_gtFine_labelIds.png'))
      # Files of the download that are not read: ids > 255 and colours.
      Image.fromarray(label_ids.astype(np.uint16) * 1000).save(
          os.path.join(label_dir, stem + '_gtFine_instanceIds.png'))
      Image.fromarray(common.random_image(rng, height, width)).save(
          os.path.join(label_dir, stem + '_gtFine_color.png'))
    want[stem] = TRAIN_IDS[index]
  return want


def records_by_name(out, split):
  return {r[0]['image/filename'].bytes_list.value[0].decode(): r
          for r in test_data_build.all_records(out, split, 2)}


def test_label_ids_map_to_the_train_ids_of_the_class_names():
  mapping = datasets.CITYSCAPES_LABEL_ID_TO_TRAIN_ID
  assert len(mapping) == 256
  # Ids 7 (road), 26 (car), 33 (bicycle) are train ids 0, 13, 18.
  named = dict(zip(datasets.CITYSCAPES_CLASSES, range(19)))
  assert (mapping[7], mapping[26], mapping[33]) == (
      named['road'], named['car'], named['bicycle'])
  trained = [i for i in range(256) if mapping[i] != 255]
  assert [mapping[i] for i in trained] == list(range(19))
  assert tuple(trained) == datasets.CITYSCAPES_TRAIN_ID_TO_LABEL_ID


def test_train_and_val_from_train_ids_or_label_ids(tmp_path):
  rng = np.random.RandomState(0)
  root = str(tmp_path / 'cityscapes')
  want = write_city(root, 'train', 'bremen', 3, rng)
  want.update(write_city(root, 'train', 'aachen', 2, rng,
                         labels='label_ids'))
  want_val = write_city(root, 'val', 'lindau', 2, rng, labels='label_ids')
  write_city(root, 'test', 'berlin', 1, rng, labels=None)
  out = str(tmp_path / 'out')

  info = build.build_cityscapes(root, out, OPTIONS)
  # train and val, as the original converter; not test.
  assert info.splits_to_sizes == {'train': 5, 'val': 2}
  assert info.name == 'cityscapes' and info.palette == 'cityscapes'
  assert info.class_names == datasets.CITYSCAPES_CLASSES
  for split, wanted in (('train', want), ('val', want_val)):
    records = test_data_build.all_records(out, split, 2)
    names = [r[0]['image/filename'].bytes_list.value[0].decode()
             for r in records]
    # Named by stem (no _leftImg8bit), in order of city, then stem.
    assert names == sorted(wanted)
    for name, (_, image, ids) in zip(names, records):
      np.testing.assert_array_equal(ids, wanted[name])
      assert image.shape[:2] == ids.shape

  # One split on its own, also one the default leaves out; its images
  # need labels too.
  with pytest.raises(build.DataError,
                     match=r"1 image\(s\) in .*test have no "
                           r"<stem>_gtFine_labelTrainIds.png or "
                           r"_gtFine_labelIds.png label .*: "
                           r"berlin/berlin_000000_000019_leftImg8bit.png"):
    build.build_cityscapes(root, out, OPTIONS, split_name='test')
  assert sorted(json.loads(open(os.path.join(
      out, 'dataset.json')).read())['splits_to_sizes']) == ['train', 'val']
  write_city(root, 'test', 'berlin', 1, np.random.RandomState(1))
  info = build.build_cityscapes(root, out, OPTIONS, split_name='test')
  assert info.splits_to_sizes == {'train': 5, 'val': 2, 'test': 1}


def test_layout_errors_name_the_folder(tmp_path):
  root = tmp_path / 'cityscapes'
  with pytest.raises(ConfigError, match='^root=.* is not a folder'):
    build.build_cityscapes(str(root), str(tmp_path / 'out'), OPTIONS)
  root.mkdir()
  with pytest.raises(ConfigError, match='has no leftImg8bit folder'):
    build.build_cityscapes(str(root), str(tmp_path / 'out'), OPTIONS)
  (root / 'leftImg8bit' / 'train_extra').mkdir(parents=True)
  with pytest.raises(ConfigError, match=r'holds no train or val folder '
                                        r'\(found: train_extra\)'):
    build.build_cityscapes(str(root), str(tmp_path / 'out'), OPTIONS)
  with pytest.raises(ConfigError, match=r'^split_name=val: no .* folder '
                                        r'\(found: train_extra\)'):
    build.build_cityscapes(str(root), str(tmp_path / 'out'), OPTIONS,
                           split_name='val')
  with pytest.raises(build.DataError, match='holds no <city>/'
                                            r'\*_leftImg8bit.png images'):
    build.build_cityscapes(str(root), str(tmp_path / 'out'), OPTIONS,
                           split_name='train_extra')
  # A label of label ids above 255 (a 16-bit PNG) is refused, not wrapped.
  label_dir = root / 'gtFine' / 'train_extra' / 'ulm'
  write_city(str(root), 'train_extra', 'ulm', 1, np.random.RandomState(2),
             labels='label_ids')
  path = label_dir / 'ulm_000000_000019_gtFine_labelIds.png'
  shape = np.asarray(Image.open(str(path))).shape
  Image.fromarray(np.full(shape, 300, np.uint16)).save(str(path))
  with pytest.raises(build.DataError,
                     match='labelIds.png: label values 300..300, expected '
                           '8-bit label ids'):
    build.build_cityscapes(str(root), str(tmp_path / 'out'), OPTIONS,
                           split_name='train_extra')
  assert not (tmp_path / 'out').exists() or not os.listdir(
      str(tmp_path / 'out'))


def test_cli_defaults_to_cityscapes_classes(tmp_path):
  root = str(tmp_path / 'cityscapes')
  rng = np.random.RandomState(3)
  write_city(root, 'train', 'jena', 2, rng, labels='label_ids')
  write_city(root, 'val', 'ulm', 1, rng)
  out = str(tmp_path / 'out')
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.build_data',
       '--cityscapes_root', root, '--output_dir', out, '--num_shards', '2'],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), capture_output=True,
      text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.splitlines()[-1])
  assert result['status'] == 'ok'
  assert (result['dataset'], result['num_classes'], result['ignore_label'],
          result['splits']) == ('cityscapes', 19, 255,
                                {'train': 2, 'val': 1})
  info = datasets.read_dataset_json(out)
  assert info.class_names == datasets.CITYSCAPES_CLASSES
  assert sorted(records_by_name(out, 'val')) == ['ulm_000000_000019']

  # The layouts' flags exclude each other, named before any conversion.
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.build_data',
       '--cityscapes_root', root, '--masks_folder', root,
       '--output_dir', out],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), capture_output=True,
      text=True, timeout=120, check=False)
  assert proc.returncode == 2
  assert proc.stderr.splitlines()[-1] == (
      'deeplab-build-data: error: --cityscapes_root and --masks_folder '
      'select two layouts; give one')
