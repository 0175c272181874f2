"""Class statistics: counted by deeplab-build-data into dataset.json, by
deeplab-stats from existing records (ours and the original converter's),
their warnings, and the class weights --label_weights=auto derives."""
import contextlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys

from absl import flags
import numpy as np
import pytest

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import stats as stats_cli
from deeplab_train.cli import train_flags
from deeplab_train.data import build
from deeplab_train.data import datasets
from deeplab_train.data import stats
import test_data_common as common
import train_testing as tt

FLAGS = flags.FLAGS
NAMES = ('sky', 'road', 'car', 'bike')
OPTIONS = build.BuildOptions(num_classes=4, dataset_name='tiny',
                             class_names=NAMES, num_shards=2)


def _pairs(seed, count, prefix):
  """Tiny pairs of classes 0..2, a 4x4 ignore corner in each and one pixel
  of class 3 in the first (a rare class)."""
  pairs = common.tiny_pairs(seed, count, num_classes=3, prefix=prefix)
  for _, _, ids in pairs:
    ids[:4, :4] = 255
  pairs[0][2][-1, -1] = 3
  return pairs


def _numpy_stats(pairs, num_classes=4, ignore_label=255):
  counts = np.zeros(256, np.int64)
  for _, _, ids in pairs:
    counts += np.bincount(ids.ravel(), minlength=256)
  heights = [ids.shape[0] for _, _, ids in pairs]
  widths = [ids.shape[1] for _, _, ids in pairs]
  return stats.SplitStats(
      num_images=len(pairs), min_height=min(heights), max_height=max(heights),
      min_width=min(widths), max_width=max(widths),
      class_pixels=tuple(counts[:num_classes]),
      ignore_pixels=counts[ignore_label])


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  """A two-split build: (output folder, {split: pairs})."""
  root = tmp_path_factory.mktemp('built')
  splits = {'train': _pairs(0, 5, 'tr'), 'val': _pairs(1, 3, 'va')}
  images, labels, lists = common.write_voc_folder(str(root / 'voc'), splits)
  out = str(root / 'out')
  build.build_voc(images, labels, lists, out, OPTIONS, image_format='png')
  return out, splits


def _run_stats(args):
  """deeplab-stats ARGS in-process: (exit code, stdout, result dict)."""
  return tt.main_in_process('deeplab-stats', stats_cli.main, args)


@contextlib.contextmanager
def _flags(args):
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + args)
    yield
  finally:
    FLAGS.unparse_flags()


# ---------------------------------------------------------------------------
# Counting.
# ---------------------------------------------------------------------------
def test_build_records_the_numpy_counts_in_dataset_json(built):
  out, splits = built
  info = datasets.read_dataset_json(out)
  assert sorted(info.statistics) == ['train', 'val']
  for split, pairs in splits.items():
    want = _numpy_stats(pairs)
    assert info.split_statistics(split) == want
    assert want.ignore_pixels == 16 * len(pairs)
    assert want.class_pixels[3] == 1
  with open(os.path.join(out, 'dataset.json')) as f:
    saved = json.load(f)['statistics']['train']
  assert saved['class_pixels'] == list(_numpy_stats(splits['train'])
                                       .class_pixels)
  assert saved['invalid_pixels'] == 0 and saved['unlabelled_images'] == 0


def test_one_split_rebuilt_keeps_the_others_counts(built, tmp_path):
  out, splits = built
  copy = tmp_path / 'copy'
  copy.mkdir()
  for name in os.listdir(out):
    (copy / name).write_bytes(open(os.path.join(out, name), 'rb').read())
  new_val = _pairs(7, 2, 'va')
  images, labels, lists = common.write_voc_folder(str(tmp_path / 'voc'),
                                                  {'val': new_val})
  info = build.build_voc(images, labels, lists, str(copy), OPTIONS,
                         image_format='png', split_name='val')
  assert info.split_statistics('val') == _numpy_stats(new_val)
  assert info.split_statistics('train') == _numpy_stats(splits['train'])


def test_deeplab_stats_on_built_records_equals_dataset_json(built):
  out, _ = built
  code, text, result = _run_stats(['--dataset_dir=' + out])
  assert code == 0 and result['status'] == 'ok'
  recorded = datasets.read_dataset_json(out).split_statistics('train')
  assert stats.SplitStats.from_dict(result['statistics']) == recorded
  assert result['split'] == 'train' and result['dataset'] == 'tiny'
  assert result['ignore_share'] == pytest.approx(recorded.ignore_share)
  assert "split 'train': 5 images" in text
  assert 'bike' in text and 'rare' in text
  code, _, result = _run_stats(['--dataset_dir=' + out, '--split=val'])
  assert code == 0
  assert (stats.SplitStats.from_dict(result['statistics']) ==
          datasets.read_dataset_json(out).split_statistics('val'))
  assert not [w for w in result['warnings'] if 'records' in w]


def test_a_count_other_than_dataset_json_records_is_named(built, tmp_path):
  """dataset.json recording 999 val images beside records holding 3 gave
  no word."""
  out = tmp_path / 'out'
  shutil.copytree(built[0], out)
  recorded = json.loads((out / 'dataset.json').read_text())
  recorded['splits_to_sizes']['val'] = 999
  (out / 'dataset.json').write_text(json.dumps(recorded))
  code, _, result = _run_stats(['--dataset_dir=%s' % out, '--split=val'])
  assert code == 0
  assert ('%s records 999 images for split \'val\', its TFRecords hold 3: '
          'the records were changed or replaced since it was written'
          % (out / 'dataset.json')) in ' '.join(result['warnings']), result


def _original_records(path, rng):
  """Records as the original converter wrote them: a grey ('L') label of
  ids, a palette label stored as-is, and an unlabelled image.

  Returns:
    (the grey label's ids, the palette label's ids).
  """
  grey = common.blocky_label(rng, 21, 30, 4, block=4)
  grey[:3, :] = 255
  palette_ids = common.blocky_label(rng, 17, 19, 4, block=4)
  image = lambda h, w: common.encode_png(common.random_image(rng, h, w))
  palette = common.encode_png(palette_ids, 'P',
                              common.colormap.palette_for_png('pascal'))
  common.write_records(path, [
      common.raw_example('a', image(21, 30), common.encode_png(grey, 'L'),
                         21, 30),
      common.raw_example('b', image(17, 19), palette, 17, 19),
      common.raw_example('c', image(40, 9), b'', 40, 9),
  ])
  return grey, palette_ids


def test_records_of_the_original_converter(tmp_path):
  grey, palette_ids = _original_records(
      str(tmp_path / 'train-00000-of-00001.tfrecord'),
      np.random.RandomState(3))
  code, text, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                   '--dataset=pascal_voc_seg'])
  assert code == 0
  counted = stats.SplitStats.from_dict(result['statistics'])
  want = np.bincount(grey.ravel(), minlength=256)
  # The palette label decodes to grey levels (as in the trainer): its class
  # 0 (black) stays 0, the other ids become values outside the classes.
  want[0] += np.sum(palette_ids == 0)
  assert counted.class_pixels == tuple(want[:21])
  assert counted.ignore_pixels == want[255] == 90
  assert counted.invalid_pixels == np.sum(palette_ids > 0)
  assert len(counted.invalid_values) == len(set(palette_ids.ravel()) - {0})
  assert all(21 <= v < 255 for v in counted.invalid_values)
  assert (counted.num_images, counted.unlabelled_images) == (3, 1)
  assert (counted.min_height, counted.max_height) == (17, 40)
  assert (counted.min_width, counted.max_width) == (9, 30)
  assert 'aeroplane' in text  # the built-in dataset's class names
  assert any('neither a class nor the ignore label' in w and 'palette' in w
             for w in result['warnings'])
  assert not (tmp_path / 'dataset.json').exists()


@pytest.mark.parametrize('num_classes', [257, 1000000000])
def test_a_class_count_past_8_bit_labels_is_refused(tmp_path, num_classes):
  """--num_classes=1000000000 (a typo) took all the memory there was, then
  a MemoryError traceback (exit 1); 100000 printed a 100,003-line table."""
  _original_records(str(tmp_path / 'val-00000-of-00001.tfrecord'),
                    np.random.RandomState(4))
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--split=val', '--dataset=mine',
                                '--num_classes=%d' % num_classes])
  assert (code, result['status']) == (2, 'bad_input')
  assert result['message'] == (
      '--num_classes=%d --ignore_label=255: num_classes must be at most 256 '
      '(labels are 8-bit PNGs: ids 0..255), got %d'
      % (num_classes, num_classes))


def test_write_dataset_json_to_a_read_only_folder_is_refused_first(
    tmp_path, monkeypatch):
  """It counted the whole split, printed the table, then failed (exit 1)
  taking the folder's lock."""
  _original_records(str(tmp_path / 'train-00000-of-00001.tfrecord'),
                    np.random.RandomState(4))
  real_access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode: (
      False if p == str(tmp_path) else real_access(p, mode)))
  counted = []
  monkeypatch.setattr(stats_cli, 'count', counted.append)
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=pascal_voc_seg',
                                '--write_dataset_json'])
  assert (code, result['status'], counted) == (2, 'bad_input', [])
  assert result['message'] == (
      '--dataset_dir=%s is not writable: --write_dataset_json writes its '
      'dataset.json (and its lock) there; leave that flag out to count only'
      % tmp_path)
  assert sorted(os.listdir(tmp_path)) == ['train-00000-of-00001.tfrecord']


def test_write_dataset_json_enables_auto_weights(tmp_path, caplog):
  _original_records(str(tmp_path / 'train-00000-of-00001.tfrecord'),
                    np.random.RandomState(4))
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=pascal_voc_seg',
                                '--write_dataset_json'])
  assert code == 0
  assert result['dataset_json'] == str(tmp_path / 'dataset.json')
  info = datasets.read_dataset_json(str(tmp_path))
  assert info.name == 'pascal_voc_seg' and info.num_classes == 21
  assert info.splits_to_sizes['train'] == 3
  assert info.splits_to_sizes['val'] == 1449  # the built-in's, kept
  counted = info.split_statistics('train')
  assert counted == stats.SplitStats.from_dict(result['statistics'])
  with caplog.at_level(logging.INFO), _flags(['--dataset_dir=%s' % tmp_path,
                                              '--label_weights=auto']):
    weights = train_flags.train_options().label_weights
  assert weights == pytest.approx(
      stats.class_weights(counted.class_pixels, 'auto')[0])
  assert "split 'train' has no pixel of 'boat' (4), 'bottle' (5)" in (
      caplog.text)


def test_records_of_a_dataset_the_original_was_taught_by_hand(tmp_path):
  """A dataset added to the original's data_generator.py (its classes and
  ignore label written there) has records but no dataset.json: --num_classes
  and --ignore_label describe it, and --write_dataset_json records it for
  every command. Before, only a built-in --dataset or a hand-written file."""
  _original_records(str(tmp_path / 'train-00000-of-00001.tfrecord'),
                    np.random.RandomState(5))
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=shapes9'])
  message = result['message']
  assert code == 2
  assert ("unknown dataset 'shapes9'" in message
          and '--num_classes' in message and '--ignore_label' in message)
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=cityscapes', '--ignore_label=0'])
  assert code == 2
  assert result['message'] == ('--dataset=cityscapes is described by the '
                               'built-in dataset: drop --ignore_label')
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=shapes9', '--num_classes=9',
                                '--ignore_label=255', '--write_dataset_json'])
  assert code == 0, result
  assert (result['num_classes'], result['ignore_label']) == (9, 255)
  info = datasets.read_dataset_json(str(tmp_path))
  assert (info.name, info.num_classes, info.ignore_label) == ('shapes9', 9,
                                                              255)
  assert info.splits_to_sizes == {'train': 3}
  assert info.split_statistics('train').num_images == 3
  assert datasets.load_dataset_info('shapes9', str(tmp_path)) == info

  # Described now: the flags would contradict it (as for a built-in one).
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=shapes9', '--num_classes=9'])
  assert code == 2
  assert result['message'] == ('--dataset=shapes9 is described by %s: drop '
                               '--num_classes' % (tmp_path / 'dataset.json'))
  # Without --dataset the file's dataset is named, not the default one.
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--ignore_label=0'])
  assert code == 2
  assert result['message'] == ("dataset 'shapes9' is described by %s: drop "
                               '--ignore_label' % (tmp_path / 'dataset.json'))


@pytest.mark.parametrize('args, message', [
    (['--dataset_dir=/nonexistent/records'],
     '--dataset_dir=/nonexistent/records is not a folder'),
    ([], '--dataset_dir is required'),
    (['--split=test'], "no TFRecords for split 'test'"),
    # Parsed (deeplab_train/cli/common_flags.py defines them for every
    # command), but not read here.
    (['--dataset_dir=/r', '--model_variant=xception_65', '--master=grpc://h:1'],
     '--master is not a deeplab-stats flag'),
    (['--quantize_delay_step=0'], 'remove --quantize_delay_step'),
    # Counted train and val as one, and recorded a split '*'.
    (['--split=*', '--write_dataset_json'],
     '--split=*: a split name starts the names of its files'),
])
def test_bad_dir_or_split_exit_2_with_one_line(built, capsys, args, message):
  out, _ = built
  if args and args[0].startswith('--split'):
    args = ['--dataset_dir=' + out] + args
  code, _, result = _run_stats(args)
  assert code == 2 and result['status'] == 'bad_input'
  assert message in result['message']
  err = [l for l in capsys.readouterr().err.splitlines()
         if l.startswith('deeplab-stats: error:')]
  assert len(err) == 1 and message in err[0]


def test_damaged_record_is_named(built, tmp_path):
  out, _ = built
  shard = tmp_path / 'train-00000-of-00001.tfrecord'
  shard.write_bytes(open(os.path.join(out, 'train-00000-of-00002.tfrecord'),
                         'rb').read()[:40])
  (tmp_path / 'dataset.json').write_bytes(
      open(os.path.join(out, 'dataset.json'), 'rb').read())
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path])
  assert code == 2
  assert result['message'].startswith('corrupted TFRecord input: %s' % shard)


def test_undecodable_label_is_an_error_naming_the_record(tmp_path):
  rng = np.random.RandomState(5)
  good = common.blocky_label(rng, 9, 9, 4)
  common.write_records(str(tmp_path / 'train-00000-of-00001.tfrecord'), [
      common.raw_example('a', common.encode_png(common.random_image(rng, 9, 9)),
                         common.encode_png(good, 'L'), 9, 9),
      common.raw_example('b', common.encode_png(common.random_image(rng, 9, 9)),
                         b'not a png', 9, 9)])
  code, _, result = _run_stats(['--dataset_dir=%s' % tmp_path,
                                '--dataset=pascal_voc_seg'])
  assert code == 2
  assert result['message'].startswith(
      "split 'train': record 1 (counting from 0, files in name order: %s) "
      'cannot be decoded: ' % (tmp_path / 'train-00000-of-00001.tfrecord'))
  # What TensorFlow says failed, not its 'Graph execution error:' heading.
  # (The formats listed depend on TensorFlow's version.)
  assert re.search(r'cannot be decoded: Unknown image file format\. One of '
                   r'JPEG, [A-Za-z, ]+ required$', result['message']), (
                       result['message'])


# ---------------------------------------------------------------------------
# Warnings.
# ---------------------------------------------------------------------------
def _split_stats(class_pixels, ignore_pixels=0, **kwargs):
  return stats.SplitStats(num_images=2, min_height=5, max_height=9,
                          min_width=5, max_width=9, class_pixels=class_pixels,
                          ignore_pixels=ignore_pixels, **kwargs)


def test_warnings_name_the_classes():
  counted = _split_stats((600000, 0, 400, 0), ignore_pixels=300000)
  warnings = stats.split_warnings('train', counted, NAMES, 255)
  assert warnings == [
      "split 'train' has no pixel of 'road' (1), 'bike' (3): the model "
      'cannot learn them',
      "split 'train': class is under 0.1 % of the labelled pixels: 'car' "
      '(2) 0.0666 %',
      "split 'train': 33.3 % of all label pixels are ignore (id 255) (over "
      '30 %): check the ignore label']
  # Without names, ids; a missing class is not reported outside training
  # splits.
  warnings = stats.split_warnings('val', counted)
  assert len(warnings) == 2
  assert 'class 2 0.0666 %' in warnings[0]
  assert stats.split_warnings('train', _split_stats((5, 5, 5, 5),
                                                    ignore_pixels=8)) == []


def test_binary_masks_of_0_and_255_get_a_hint():
  """0/255 masks with 2 classes: the foreground is the ignore label, and the
  warning said only that class 1 has no pixel."""
  counted = _split_stats((870, 0), ignore_pixels=130)
  assert stats.split_warnings('train', counted, None, 255) == [
      "split 'train' has no pixel of class 1: the model cannot learn them; "
      'its labels hold 0 and the ignore label 255 only: if 255 marks the '
      'foreground (binary masks of 0 and 255), save the masks with 1 for the '
      'foreground']
  # Without ignore pixels, nothing suggests 0/255 masks.
  assert 'binary' not in ' '.join(stats.split_warnings(
      'train', _split_stats((870, 0)), None, 255))


def test_table_shows_counts_shares_and_marks():
  counted = _split_stats((600000, 0, 400, 0), ignore_pixels=300000)
  table = stats.format_table('train', counted, NAMES, 255)
  lines = table.splitlines()
  assert lines[0].startswith("split 'train': 2 images, height 5..9, width "
                             '5..9; 900,400 label pixels, 33.32 % of them '
                             'ignore (id 255)')
  assert lines[2].split() == ['0', 'sky', '600,000', '99.933%']
  assert lines[3].split() == ['1', 'road', '0', '0.000%', 'none']
  assert lines[4].split() == ['2', 'car', '400', '0.067%', 'rare']


def test_build_data_prints_the_table_and_warns(tmp_path):
  # 40 % ignore; one pixel of class 3 in 1,920 labelled ones (0.05 %).
  pairs = common.tiny_pairs(9, 2, num_classes=3, sizes=[(40, 40)] * 2)
  for _, _, ids in pairs:
    ids[:16, :] = 255
  pairs[0][2][-1, -1] = 3
  images, labels, lists = common.write_voc_folder(str(tmp_path / 'voc'),
                                                  {'train': pairs})
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.build_data',
       '--image_folder', images, '--semantic_segmentation_folder', labels,
       '--list_folder', lists, '--image_format', 'png', '--output_dir',
       str(tmp_path / 'out'), '--num_classes', '5', '--dataset_name', 'x',
       '--class_names', 'a,b,c,d,e', '--num_shards', '1'],
      env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "split 'train': 2 images" in proc.stdout
  assert "has no pixel of 'e' (4)" in proc.stderr
  assert "under 0.1 % of the labelled pixels: 'd' (3)" in proc.stderr
  assert '% of all label pixels are ignore (id 255)' in proc.stderr
  result = json.loads(proc.stdout.splitlines()[-1])
  assert len(result['warnings']) == 3
  counted = datasets.read_dataset_json(str(tmp_path / 'out')
                                       ).split_statistics('train')
  assert counted == _numpy_stats(pairs, num_classes=5)


def test_an_ignore_label_that_is_a_class_id_is_counted_once(tmp_path):
  """ADE20K's ignore label is its class 0: its pixels were counted both as
  ignore and as class 0, so the shares, the missing classes and the auto
  weights all took an ignored id for a trained class."""
  ids = np.array([[0, 0, 0, 1], [1, 2, 2, 0], [0, 0, 1, 1]], np.uint8)
  counter = stats.SplitCounter(4, 0)
  counter.add(*ids.shape, ids)
  counted = counter.result()
  assert counted.class_pixels == (0, 4, 2, 0)
  assert counted.ignore_pixels == 6
  assert counted.total_pixels == ids.size
  assert counted.class_shares()[1] == pytest.approx(4 / 6)
  # Class 0 is neither missing nor absent; class 3 is.
  assert stats.split_warnings('train', counted, None, 0) == [
      "split 'train' has no pixel of class 3: the model cannot learn them",
      "split 'train': 50.0 % of all label pixels are ignore (id 0) (over "
      '30 %): check the ignore label']
  table = stats.format_table('train', counted, None, 0).splitlines()
  assert table[0].endswith('12 label pixels, 50.00 % of them ignore (id 0)')
  assert table[2].split() == ['0', '0', '0.000%', 'ignored', '(the',
                              'ignore', 'label)']
  weights, absent = stats.class_weights(counted.class_pixels, 'auto_median',
                                        ignore_label=0)
  # freq 4/6, 2/6 for classes 1 and 2: median 0.5.
  assert weights == pytest.approx((0., 0.75, 1.5, 1.5))
  assert absent == (3,)
  # A dataset.json written before counted class 0 twice: read right.
  (tmp_path / 'dataset.json').write_text(json.dumps({
      'name': 'ade_like', 'num_classes': 4, 'ignore_label': 0,
      'splits_to_sizes': {'train': 1},
      'statistics': {'train': dict(counted.to_dict(),
                                   class_pixels=[6, 4, 2, 0])}}))
  info = datasets.read_dataset_json(str(tmp_path))
  assert info.split_statistics('train') == counted


# ---------------------------------------------------------------------------
# dataset.json compatibility.
# ---------------------------------------------------------------------------
def test_dataset_json_without_statistics_still_loads(tmp_path):
  (tmp_path / 'dataset.json').write_text(json.dumps({
      'name': 'old', 'num_classes': 3, 'ignore_label': 255,
      'splits_to_sizes': {'train': 4}, 'class_names': None,
      'palette': 'pascal'}))
  info = datasets.load_dataset_info('old', str(tmp_path))
  assert info.statistics is None and info.split_statistics('train') is None
  assert 'statistics' not in info.to_dict()


def test_statistics_round_trip_and_stale_ones_are_dropped(tmp_path, caplog):
  info = datasets.DatasetInfo(
      name='s', num_classes=2, ignore_label=255, splits_to_sizes={'train': 2},
      statistics={'train': _split_stats((3, 4), ignore_pixels=1)})
  datasets.write_dataset_json(str(tmp_path), info)
  assert datasets.read_dataset_json(str(tmp_path)) == info
  # num_classes edited by hand: the counts no longer fit; dropped, warned.
  payload = json.loads((tmp_path / 'dataset.json').read_text())
  payload['num_classes'] = 3
  (tmp_path / 'dataset.json').write_text(json.dumps(payload))
  with caplog.at_level(logging.WARNING):
    loaded = datasets.read_dataset_json(str(tmp_path))
  assert loaded.split_statistics('train') is None
  assert "ignoring the statistics of split 'train'" in caplog.text
  with pytest.raises(config.ConfigError, match='count 2 classes'):
    datasets.DatasetInfo(
        name='s', num_classes=3, ignore_label=255, splits_to_sizes={},
        statistics=info.statistics).validate()
  payload['statistics']['train'] = {'num_images': 1}
  (tmp_path / 'dataset.json').write_text(json.dumps(payload))
  with pytest.raises(config.ConfigError, match='dataset.json: split statistics '
                     'lack key'):
    datasets.read_dataset_json(str(tmp_path))


# ---------------------------------------------------------------------------
# Class weights.
# ---------------------------------------------------------------------------
def test_weight_formulas_on_a_hand_made_count_vector():
  pixels = (600, 300, 100, 0)   # freq 0.6, 0.3, 0.1; class 3 absent
  weights, absent = stats.class_weights(pixels, 'auto_median')
  # median(0.6, 0.3, 0.1) = 0.3; the absent class gets the largest weight.
  assert weights == pytest.approx((0.5, 1.0, 3.0, 3.0))
  assert absent == (3,)
  assert stats.class_weights(pixels, 'auto') == (weights, absent)
  weights, absent = stats.class_weights(pixels, 'auto_inverse_sqrt')
  raw = 1 / np.sqrt([0.6, 0.3, 0.1])
  want = raw / raw.mean()
  assert weights == pytest.approx(tuple(want) + (want.max(),))
  assert np.mean(weights[:3]) == pytest.approx(1.0)
  assert stats.class_weights((5, 5), 'auto_median')[0] == (1.0, 1.0)
  with pytest.raises(config.ConfigError, match='no labelled pixel'):
    stats.class_weights((0, 0), 'auto')


def test_auto_label_weights_through_the_train_flags(built, caplog):
  out, splits = built
  counted = _numpy_stats(splits['train'])
  for scheme in stats.WEIGHT_SCHEMES:
    # (Parsing the flags sets absl's log level: the capture's level after.)
    with _flags(['--dataset_dir=' + out, '--label_weights=' + scheme]), (
        caplog.at_level(logging.INFO, logger='absl')):
      options = train_flags.train_options()
    assert options.label_weights == pytest.approx(
        stats.class_weights(counted.class_pixels, scheme)[0])
  assert 'weight_c = 1 / sqrt(freq_c), normalised to mean 1' in caplog.text
  assert 'bike' in caplog.text  # the table names the classes
  # Another split's counts; explicit weights as before.
  with _flags(['--dataset_dir=' + out, '--label_weights=auto',
               '--train_split=val']):
    assert train_flags.train_options().label_weights == pytest.approx(
        stats.class_weights(_numpy_stats(splits['val']).class_pixels,
                            'auto')[0])
  with _flags(['--label_weights=1', '--label_weights=2.5']):
    assert train_flags.train_options().label_weights == (1.0, 2.5)
  with _flags([]):
    assert train_flags.train_options().label_weights is None


def test_auto_label_weights_errors(built, tmp_path):
  out, _ = built
  with _flags(['--dataset_dir=' + out, '--label_weights=auto',
               '--label_weights=1']):
    with pytest.raises(config.ConfigError, match='give it alone'):
      train_flags.train_options()
  with _flags(['--dataset_dir=%s' % tmp_path, '--label_weights=auto']):
    with pytest.raises(config.ConfigError) as error:
      train_flags.train_options()
  assert str(error.value) == (
      "--label_weights=auto needs the pixel counts of split 'train', which "
      '%s does not hold: run deeplab-stats --dataset_dir=%s --split=train '
      '--write_dataset_json, or rebuild the split with deeplab-build-data'
      % (tmp_path / 'dataset.json', tmp_path))
  with pytest.raises(flags.IllegalFlagValueError,
                     match='neither a number nor one of auto'):
    FLAGS(['deeplab-train', '--label_weights=automatic'])
  FLAGS.unparse_flags()


def test_train_without_statistics_exits_2_naming_the_flag(built, tmp_path):
  # pylint: disable=g-import-not-at-top
  from deeplab_train.cli import train as train_cli
  import train_testing as tt
  out, _ = built
  old = tmp_path / 'old'
  old.mkdir()
  for name in os.listdir(out):
    if name.startswith('train-'):
      (old / name).write_bytes(open(os.path.join(out, name), 'rb').read())
  payload = json.loads(open(os.path.join(out, 'dataset.json')).read())
  del payload['statistics']
  (old / 'dataset.json').write_text(json.dumps(payload))
  args = tt.tiny_cli_args(tmp_path / 'log', old, 1, '--label_weights=auto')
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + args)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      code = train_cli.main(['deeplab-train'])
  finally:
    FLAGS.unparse_flags()
  result = json.loads(stdout.getvalue().splitlines()[-1])
  assert code == 2 and result['status'] == 'bad_input'
  assert result['message'].startswith('--label_weights=auto needs the pixel '
                                      "counts of split 'train'")
  assert 'deeplab-stats' in result['message']


def test_write_dataset_json_waits_for_no_build_and_loses_none(tmp_path,
                                                              monkeypatch):
  """--write_dataset_json rewrites dataset.json from what it read before
  counting: with a deeplab-build-data on the folder it exits 75, and if a
  build changed the records or dataset.json while it counted (here a val
  split added), it writes nothing instead of dropping the build's split."""
  folders = common.write_voc_folder(
      str(tmp_path / 'voc'), {'train': _pairs(6, 3, 'tr'),
                              'val': _pairs(7, 2, 'va')})
  out = str(tmp_path / 'out')
  build.build_voc(*folders, out, OPTIONS, image_format='png',
                  split_name='train')
  args = ['--dataset_dir=%s' % out, '--write_dataset_json']
  with build.folder_lock(out):
    code, _, result = _run_stats(args)
  assert (code, result['status']) == (75, 'locked')
  assert result['message'].startswith(
      '%s is locked by a running deeplab-build-data (pid %d' % (
          out, os.getpid()))
  count = stats_cli.count

  def build_meanwhile(job):
    counted = count(job)
    build.build_voc(*folders, out, OPTIONS, image_format='png',
                    split_name='val')
    return counted
  monkeypatch.setattr(stats_cli, 'count', build_meanwhile)
  code, _, result = _run_stats(args)
  assert (code, result['status']) == (2, 'bad_input')
  assert result['message'] == (
      "the records of split 'train' or dataset.json in %s changed while they "
      'were counted (a deeplab-build-data wrote them); nothing was written: '
      'run deeplab-stats again' % out)
  assert datasets.read_dataset_json(out).splits_to_sizes == {'train': 3,
                                                             'val': 2}
  monkeypatch.undo()
  # Nothing changed meanwhile: written, the lock file gone.
  code, _, result = _run_stats(args)
  assert code == 0 and result['dataset_json'] == os.path.join(
      out, 'dataset.json')
  assert datasets.read_dataset_json(out).splits_to_sizes == {'train': 3,
                                                             'val': 2}
  assert build.LOCK_FILENAME not in os.listdir(out)


def test_the_default_dataset_name_beside_a_dataset_json_is_no_warning(
    built, caplog):
  """Every command without --dataset warned 'dataset=pascal_voc_seg but
  .../dataset.json describes dataset ...' about a flag the user never set.
  """
  out, _ = built
  described = datasets.read_dataset_json(out).name
  assert described != FLAGS['dataset'].default
  with _flags(['--dataset_dir=%s' % out]), caplog.at_level('WARNING'):
    assert common_flags.dataset_info().name == described
  assert 'describes dataset' not in caplog.text
  # A --dataset given that the file contradicts still is, naming the flag
  # (it said 'dataset=pascal_voc_seg').
  with _flags(['--dataset_dir=%s' % out, '--dataset=pascal_voc_seg']):
    with caplog.at_level('WARNING'), app.flag_terms_in_logs():
      assert common_flags.dataset_info().name == described
  assert ('--dataset=pascal_voc_seg but %s describes dataset %r; using the '
          'file' % (os.path.join(out, 'dataset.json'), described)
          in caplog.text)
  # Without --dataset, eval, vis and export take the name the training run
  # saved: the warning named a --dataset the user never gave.
  caplog.clear()
  with _flags(['--dataset_dir=%s' % out]):
    with caplog.at_level('WARNING'), app.flag_terms_in_logs():
      assert common_flags.dataset_info({'name': 'cityscapes'}).name == (
          described)
  assert ("the training run's deeplab_config.json names dataset 'cityscapes' "
          'but %s describes dataset %r; using the file'
          % (os.path.join(out, 'dataset.json'), described) in caplog.text)
  assert '--dataset' not in caplog.text
