"""Dataset descriptors: built-ins, dataset.json precedence and errors."""
import json

import pytest

from deeplab_train import config
from deeplab_train.config import ConfigError
from deeplab_train.data import datasets


def test_builtin_datasets_match_the_original_table():
  voc = datasets.load_dataset_info('pascal_voc_seg')
  assert (voc.num_classes, voc.ignore_label) == (21, 255)
  assert voc.splits_to_sizes == {'train': 1464, 'train_aug': 10582,
                                 'trainval': 2913, 'val': 1449}
  assert voc.class_names[0] == 'background' and voc.class_names[15] == 'person'
  city = datasets.load_dataset_info('cityscapes')
  assert (city.num_classes, city.ignore_label) == (19, 255)
  assert city.splits_to_sizes == {'train': 2975, 'val': 500}
  ade = datasets.load_dataset_info('ade20k')
  assert (ade.num_classes, ade.ignore_label) == (151, 0)
  assert ade.splits_to_sizes == {'train': 20210, 'val': 2000}
  for info in datasets.BUILTIN_DATASETS.values():
    assert info.validate() is info
    assert info.colormap().shape == (256, 3)


def test_dataset_json_wins_and_round_trips(tmp_path):
  info = datasets.DatasetInfo(
      name='shapes', num_classes=3, ignore_label=255,
      splits_to_sizes={'train': 10, 'val': 2},
      class_names=('bg', 'disk', 'ring'), palette=[[0, 0, 0], [9, 9, 9],
                                                   [7, 7, 7]])
  datasets.write_dataset_json(str(tmp_path), info)
  assert [p.name for p in tmp_path.iterdir()] == ['dataset.json']
  loaded = datasets.load_dataset_info('shapes', str(tmp_path))
  assert loaded == info
  assert loaded.colormap()[1].tolist() == [9, 9, 9]
  # Even under a built-in name, the file describes what was converted.
  assert datasets.load_dataset_info('pascal_voc_seg', str(tmp_path)) == info
  # Without the file, the built-in table answers.
  assert datasets.load_dataset_info('pascal_voc_seg', str(tmp_path / 'x')
                                    ).num_classes == 21


def test_minimal_hand_written_dataset_json(tmp_path):
  (tmp_path / 'dataset.json').write_text(
      json.dumps({'num_classes': 2, 'ignore_label': 0}))
  info = datasets.load_dataset_info('anything', str(tmp_path))
  assert (info.num_classes, info.ignore_label, info.splits_to_sizes) == (
      2, 0, {})


def test_unknown_dataset_names_both_options(tmp_path):
  with pytest.raises(ConfigError, match=r"unknown dataset 'mine' and no "
                                        r".*dataset.json: use a built-in "
                                        r"dataset \(ade20k, cityscapes, "
                                        r"pascal_voc_seg\) or write"):
    datasets.load_dataset_info('mine', str(tmp_path))


@pytest.mark.parametrize('payload, match', [
    ('{not json', 'not valid JSON'),
    ('{"num_classes": 3}', r"missing key\(s\) \['ignore_label'\]"),
    ('{"num_classes": 3, "ignore_label": 255, "colours": 1}',
     r"unknown key\(s\) \['colours'\]"),
    ('{"num_classes": 3, "ignore_label": 255, "class_names": ["a"]}',
     '1 class_names for num_classes=3'),
    ('{"num_classes": 0, "ignore_label": 255}', 'num_classes must be'),
    ('{"num_classes": 3, "ignore_label": 255, "palette": "rainbow"}',
     'bad palette'),
])
def test_bad_dataset_json_names_the_file(tmp_path, payload, match):
  (tmp_path / 'dataset.json').write_text(payload)
  with pytest.raises(ConfigError, match=match) as error:
    datasets.load_dataset_info('x', str(tmp_path))
  assert 'dataset.json' in str(error.value)


@pytest.mark.parametrize('payload', ['{not json', '{"model_options": {}}'])
def test_bad_run_config_names_the_file(tmp_path, payload):
  # Braces in the folder name stay as they are (not option references).
  logdir = tmp_path / '{run.1}'
  logdir.mkdir()
  (logdir / config.RUN_CONFIG_FILENAME).write_text(payload)
  with pytest.raises(ConfigError, match='is not a valid deeplab config') as e:
    config.load_run_config(str(logdir))
  assert str(e.value).startswith(str(logdir / config.RUN_CONFIG_FILENAME))
  assert config.load_run_config(str(tmp_path)) is None  # no file: no config


def test_ade20k_names_one_per_class():
  assert len(datasets.ADE20K_CLASSES) == 151
  assert len(set(datasets.ADE20K_CLASSES)) == 151
  assert len(datasets.CITYSCAPES_CLASSES) == 19
