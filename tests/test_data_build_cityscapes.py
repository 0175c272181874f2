"""deeplab-build-data's Cityscapes layout: leftImg8bit/ and gtFine/ folders
by split and city, labels as train ids or as the label ids the dataset
ships (mapped to train ids); its records against those of the original's
converter on the same tree."""
import json
import os

import numpy as np
from PIL import Image
import pytest

from deeplab_train.config import ConfigError
from deeplab_train.data import build
from deeplab_train.data import datasets
import cityscapes_tree
import test_data_build

OPTIONS = build.BuildOptions(num_classes=19, dataset_name='cityscapes',
                             num_shards=2)
write_city = cityscapes_tree.write_city


def records_by_name(out, split):
  return test_data_build.records_by_name(out, split, 2)


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
  root = str(tmp_path / 'cityscapes')
  want = write_city(root, 'train', 'bremen', 3, 0)
  want.update(write_city(root, 'train', 'aachen', 2, 1, labels='label_ids'))
  want_val = write_city(root, 'val', 'lindau', 2, 2, labels='label_ids')
  write_city(root, 'test', 'berlin', 1, 3, labels=None)
  out = str(tmp_path / 'out')

  info = build.build_cityscapes(root, out, OPTIONS)
  # train and val, as the original converter; not test.
  assert info.splits_to_sizes == {'train': 5, 'val': 2}
  assert info.name == 'cityscapes' and info.palette == 'cityscapes'
  assert info.class_names == datasets.CITYSCAPES_CLASSES
  for split, wanted in (('train', want), ('val', want_val)):
    records = records_by_name(out, split)
    # Named by stem (no _leftImg8bit), in order of city, then stem.
    assert list(records) == sorted(wanted)
    for name, (_, image, ids) in records.items():
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
  write_city(root, 'test', 'berlin', 1, 4)
  info = build.build_cityscapes(root, out, OPTIONS, split_name='test')
  assert info.splits_to_sizes == {'train': 5, 'val': 2, 'test': 1}


def test_records_equal_the_original_converters(tmp_path, reference_dir):
  """The records of the original's build_cityscapes_data.py on the same
  tree (tests/reference/cityscapes_records.npz): the same order in the
  same 10 shards, the same features, the same decoded image and label."""
  want = np.load(str(reference_dir / 'cityscapes_records.npz'))
  root = str(tmp_path / 'cityscapes')
  cityscapes_tree.write_reference_tree(root)
  out = str(tmp_path / 'out')
  build.build_cityscapes(root, out, build.BuildOptions(
      num_classes=19, dataset_name='cityscapes', num_shards=10))
  compared = 0
  for split in ('train', 'val'):
    records = test_data_build.all_records(out, split, 10)
    assert len(records) == int(want[split + '/count']) > 0
    for i, (feature, image, label) in enumerate(records):
      prefix = '%s/%d/' % (split, i)
      keys = {k[len(prefix):] for k in want.files if k.startswith(prefix)}
      assert keys == {k.replace('/encoded', '/decoded') for k in feature}
      for key in keys - {'image/decoded', 'image/segmentation/class/decoded'}:
        value = feature[key]
        got = (value.bytes_list.value[0].decode() if value.bytes_list.value
               else value.int64_list.value[0])
        assert got == want[prefix + key].item(), (prefix + key, got)
      np.testing.assert_array_equal(image, want[prefix + 'image/decoded'])
      np.testing.assert_array_equal(
          label, want[prefix + 'image/segmentation/class/decoded'])
      compared += 1
  assert compared == 7


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
  write_city(str(root), 'train_extra', 'ulm', 1, 5, labels='label_ids')
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
  write_city(root, 'train', 'jena', 2, 6, labels='label_ids')
  write_city(root, 'val', 'ulm', 1, 7)
  out = str(tmp_path / 'out')
  proc = test_data_build._cli(
      ['--cityscapes_root', root, '--output_dir', out, '--num_shards', '2'],
      str(tmp_path))
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
  proc = test_data_build._cli(
      ['--cityscapes_root', root, '--masks_folder', root, '--output_dir', out],
      str(tmp_path))
  assert proc.returncode == 2
  assert proc.stderr.splitlines()[-1] == (
      'deeplab-build-data: error: --cityscapes_root and --masks_folder '
      'select two layouts; give one')
