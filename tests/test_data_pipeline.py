"""make_dataset: round trip from folders, records in the original schema,
in-graph validation errors, split errors, batching and determinism."""
import io
import os
import re
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import PreprocessOptions
from deeplab_train.data import build
from deeplab_train.data import colormap
from deeplab_train.data import datasets
from deeplab_train.data import pipeline
from deeplab_train.data import tfrecord
import test_data_common as common

TINY = datasets.DatasetInfo(name='tiny', num_classes=4, ignore_label=255,
                            splits_to_sizes={})
EVAL = PreprocessOptions(crop_size=None)
TRAIN = PreprocessOptions(crop_size=(17, 19), min_scale_factor=0.5,
                          max_scale_factor=1.5, scale_factor_step_size=0.25)


@pytest.fixture(scope='module')
def tiny_dir(tmp_path_factory):
  """PNG/palette VOC folder (train 5, val 3) converted in-process."""
  root = tmp_path_factory.mktemp('tiny')
  splits = {'train': common.tiny_pairs(0, 5, prefix='tr'),
            'val': common.tiny_pairs(1, 3, prefix='va')}
  folders = common.write_voc_folder(str(root / 'voc'), splits)
  out = str(root / 'tfrecord')
  build.build_voc(*folders, out, build.BuildOptions(
      num_classes=4, dataset_name='tiny', num_shards=2), image_format='png')
  return out, splits


def records_dir(tmp_path, examples, split='val'):
  tmp_path.mkdir(parents=True, exist_ok=True)
  common.write_records(
      str(tmp_path / ('%s-00000-of-00001.tfrecord' % split)), examples)
  return str(tmp_path)


def eval_batches(dataset_dir, info=TINY, split='val', **kwargs):
  return common.take_batches(lambda: pipeline.make_dataset(
      dataset_dir, split, info, EVAL, 1, is_training=False, **kwargs))


def test_round_trip_through_the_cli(tmp_path):
  splits = {'train': common.tiny_pairs(2, 3, prefix='tr'),
            'val': common.tiny_pairs(3, 4, prefix='va')}
  images, labels, lists = common.write_voc_folder(str(tmp_path / 'voc'),
                                                  splits, label_mode='P')
  out = str(tmp_path / 'tfrecord')
  result = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.build_data',
       '--image_folder', images, '--semantic_segmentation_folder', labels,
       '--list_folder', lists, '--image_format', 'png', '--output_dir', out,
       '--num_classes', '4', '--dataset_name', 'tiny', '--num_shards', '2',
       '--class_names', 'bg,a,b,c'],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "dataset 'tiny', 4 classes" in result.stdout

  info = datasets.load_dataset_info('tiny', out)
  assert info.class_names == ('bg', 'a', 'b', 'c')
  assert info.splits_to_sizes == {'train': 3, 'val': 4}
  batches = eval_batches(out, info)
  assert len(batches) == 4
  for batch, (name, image, ids) in zip(batches, splits['val']):
    assert batch['image_name'][0] == name.encode()
    assert (batch['height'][0], batch['width'][0]) == ids.shape
    np.testing.assert_array_equal(batch['image'][0], image)
    np.testing.assert_array_equal(batch['original_image'][0], image)
    np.testing.assert_array_equal(batch['label'][0, ..., 0], ids)
    assert batch['image'].dtype == np.float32
    assert batch['label'].dtype == np.int32


def test_reads_records_built_by_hand_in_the_original_schema(tmp_path):
  rng = np.random.RandomState(4)
  image = common.random_image(rng, 21, 26)
  ids = common.blocky_label(rng, 21, 26, 4, block=4)
  smooth = np.kron(rng.randint(0, 256, (4, 4, 3)),
                   np.ones((8, 8, 1))).astype(np.uint8)[:30, :27]
  jpeg = io.BytesIO()
  Image.fromarray(smooth).save(jpeg, format='JPEG', quality=95)
  jpeg_ids = common.blocky_label(rng, 30, 27, 4, block=4)
  examples = [
      common.raw_example('png_one', common.encode_png(image),
                         common.encode_png(ids, 'L'), 21, 26),
      common.raw_example('jpeg_one', jpeg.getvalue(),
                         common.encode_png(jpeg_ids, 'L'), 30, 27,
                         image_format=b'jpeg')]
  batches = eval_batches(records_dir(tmp_path, examples))
  assert [b['image_name'][0] for b in batches] == [b'png_one', b'jpeg_one']
  np.testing.assert_array_equal(batches[0]['image'][0], image)
  np.testing.assert_array_equal(batches[0]['label'][0, ..., 0], ids)
  decoded = np.asarray(Image.open(io.BytesIO(jpeg.getvalue())), np.float32)
  assert np.abs(batches[1]['image'][0] - decoded).mean() < 1.0
  np.testing.assert_array_equal(batches[1]['label'][0, ..., 0], jpeg_ids)


def _error_of(dataset_dir, info=TINY, training=False):
  options = TRAIN if training else EVAL
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    common.take_batches(lambda: pipeline.make_dataset(
        dataset_dir, 'val', info, options, 1, is_training=training, seed=0))
  return str(error.value)


def test_palette_png_stored_as_is_is_rejected_naming_the_image(tmp_path):
  # The original's converter stored VOC palette PNGs unchanged; decoded with
  # channels=1 they become grey levels, which the reader must refuse.
  rng = np.random.RandomState(5)
  ids = common.blocky_label(rng, 16, 16, 3, block=4)
  ids[0, 0], ids[0, 1] = 1, 2
  palette = colormap.palette_for_png('pascal')
  example = common.raw_example(
      '2007_000032', common.encode_png(common.random_image(rng, 16, 16)),
      common.encode_png(ids, 'P', palette), 16, 16)
  message = _error_of(records_dir(tmp_path, [example]),
                      datasets.BUILTIN_DATASETS['pascal_voc_seg'])
  assert 'label values outside [0, 21) and not the ignore label 255' in message
  assert '2007_000032' in message
  assert 'rebuild the TFRecords with deeplab-build-data' in message


@pytest.mark.parametrize('training', [False, True])
def test_out_of_range_label_is_an_error_naming_image_and_values(tmp_path,
                                                                training):
  rng = np.random.RandomState(6)
  ids = common.blocky_label(rng, 20, 20, 4, block=4)
  ids[3, 3], ids[5, 5] = 9, 200
  example = common.raw_example('bad_label', common.encode_png(
      common.random_image(rng, 20, 20)), common.encode_png(ids, 'L'), 20, 20)
  message = _error_of(records_dir(tmp_path, [example]), training=training)
  assert 'bad_label' in message
  assert '[9 200]' in message or '[200 9]' in message


@pytest.mark.parametrize('values,dtype,num_classes,ignore,bad', [
    ([0, 3, 255], tf.uint8, 4, 255, None),          # valid, with ignore
    ([0, 4, 255, 7], tf.uint8, 4, 255, [4, 7]),
    ([0, 200, 255], tf.uint8, 300, 255, None),      # more classes than uint8
    ([0, 3, 5], tf.uint8, 4, 0, [5]),               # ignore inside the range
    ([0, 3, 255], tf.uint8, 4, 1000, [255]),        # ignore not a uint8
    ([-1, 0, 3, 255], tf.int32, 4, 255, [-1]),      # negative ids
    ([0, 3, 70000], tf.int32, 4, 255, [70000]),
])
def test_label_range_check_in_the_labels_own_dtype(values, dtype,
                                                   num_classes, ignore,
                                                   bad):
  # Eagerly the Assert runs (and raises) where it is made.
  label = tf.constant(np.reshape(values, (1, -1, 1)), dtype)
  if bad is None:
    pipeline.label_range_assertion(label, 'img_7', num_classes, ignore)
    return
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    pipeline.label_range_assertion(label, 'img_7', num_classes, ignore)
  message = str(info.value).strip()
  assert 'img_7' in message
  listed = message.splitlines()[-1].strip('[]').replace(',', ' ').split()
  assert sorted(int(v) for v in listed) == bad, message


def test_size_mismatch_and_missing_label_are_errors(tmp_path):
  rng = np.random.RandomState(7)
  image = common.encode_png(common.random_image(rng, 20, 20))
  mismatch = common.raw_example('wrong_size', image, common.encode_png(
      np.zeros((20, 19), np.uint8), 'L'), 20, 20)
  message = _error_of(records_dir(tmp_path / 'a', [mismatch]))
  assert 'image and label sizes differ' in message and 'wrong_size' in message
  unlabelled = common.raw_example('no_label', image, b'', 20, 20)
  message = _error_of(records_dir(tmp_path / 'b', [unlabelled]))
  assert 'record has no label' in message and 'no_label' in message


def test_split_errors_are_clear_and_immediate(tmp_path, tiny_dir):
  out, _ = tiny_dir
  make = lambda d, split: pipeline.make_dataset(d, split, TINY, TRAIN, 2,
                                                is_training=True)
  with pytest.raises(ConfigError, match=r"no TFRecords for split 'trainval' in "
                                        r".*splits found: train, val"):
    make(out, 'trainval')
  with pytest.raises(ConfigError, match='is not a folder'):
    make(str(tmp_path / 'nowhere'), 'train')
  (tmp_path / 'train-00000-of-00001.tfrecord').write_bytes(b'')
  with pytest.raises(ConfigError, match=r"split 'train' .* has no records"):
    make(str(tmp_path), 'train')
  (tmp_path / 'val-00001-of-00002.tfrecord').write_bytes(b'x')
  with pytest.raises(ConfigError, match=r"split 'val' is incomplete: "
                                        r"shard\(s\) val-00000-of-00002"):
    make(str(tmp_path), 'val')


def test_a_shard_cut_inside_a_header_is_named_not_read_as_its_end(
    tmp_path, tiny_dir, monkeypatch):
  """TensorFlow's reader takes a file ending inside a record's 12-byte
  header (or one of 1 to 11 bytes) for one that ends there: deeplab-stats
  and deeplab-eval counted the split short with exit 0."""
  out, _ = tiny_dir
  shard = sorted(f for f in os.listdir(out) if f.startswith('val-'))[0]
  data = open(os.path.join(out, shard), 'rb').read()
  sizes = [len(r) + 16 for r in tf.io.tf_record_iterator(
      os.path.join(out, shard))]
  assert len(sizes) >= 2 and sum(sizes) == len(data)
  whole = sizes[0]
  for kept, record, offset in ((sum(sizes[:-1]) + 6, len(sizes) - 1,
                                sum(sizes[:-1])),   # in the last header
                               (whole + 12 + 3, 1, whole),  # in its data
                               (5, 0, 0), (11, 0, 0)):
    copy = tmp_path / ('cut%d' % kept)
    copy.mkdir()
    for name in os.listdir(out):
      if name.startswith('val-'):
        (copy / name).write_bytes(open(os.path.join(out, name), 'rb').read())
    (copy / shard).write_bytes(data[:kept])
    path = str(copy / shard)
    assert tfrecord.cut_short(path) == (record, offset), kept
    with pytest.raises(ConfigError) as error:
      pipeline.split_files(str(copy), 'val')
    assert str(error.value) == (
        'corrupted TFRecord input: %s: record %d (byte offset %d) is damaged '
        'or cut short; convert the data again with deeplab-build-data'
        % (path, record, offset))
    # Named also when a read failed on it (the file cut after the check).
    assert pipeline.damaged_record([path]) == (path, record, offset)
  assert tfrecord.cut_short(os.path.join(out, shard)) is None
  # Asked again (split_files runs at every evaluation), the file is not
  # read again while it is the same.
  real_open = open
  reads = []

  def counted(path, *args, **kwargs):
    reads.append(path)
    return real_open(path, *args, **kwargs)
  monkeypatch.setattr('builtins.open', counted)
  assert tfrecord.cut_short(os.path.join(out, shard)) is None
  assert reads == []
  monkeypatch.undo()
  # Eight bytes of garbage: a length far past the file's end.
  (tmp_path / 'garbage').write_bytes(b'\xff' * 8)
  assert tfrecord.cut_short(str(tmp_path / 'garbage')) == (0, 0)


def test_training_batches_repeat_with_static_shapes(tiny_dir):
  out, _ = tiny_dir

  def make():
    dataset = pipeline.make_dataset(out, 'train', TINY, TRAIN, 2,
                                    is_training=True, seed=1)
    assert dataset.element_spec['image'].shape.as_list() == [2, 17, 19, 3]
    assert dataset.element_spec['label'].shape.as_list() == [2, 17, 19, 1]
    assert 'original_image' not in dataset.element_spec
    return dataset
  batches = common.take_batches(make, limit=6)  # 12 samples of 5 records
  assert len(batches) == 6
  labels = np.concatenate([b['label'] for b in batches])
  assert set(np.unique(labels)) <= {0, 1, 2, 3, 255}
  names = np.concatenate([b['image_name'] for b in batches])
  assert set(names) == {('tr_%02d' % i).encode() for i in range(5)}


def test_same_seed_same_batches(tiny_dir):
  out, _ = tiny_dir

  def batches(seed):
    got = common.take_batches(lambda: pipeline.make_dataset(
        out, 'train', TINY, TRAIN, 2, is_training=True, seed=seed,
        num_parallel_calls=2), limit=3)
    return np.concatenate([b['image'] for b in got])
  first = batches(3)
  np.testing.assert_array_equal(first, batches(3))
  assert not np.array_equal(first, batches(4))


def test_eval_batching_rules(tiny_dir):
  out, splits = tiny_dir
  with pytest.raises(ConfigError, match='batch size must be 1'):
    pipeline.make_dataset(out, 'val', TINY, EVAL, 2, is_training=False)
  with pytest.raises(ConfigError, match='training needs a crop size'):
    pipeline.make_dataset(out, 'train', TINY, EVAL, 1, is_training=True)
  # With a crop size, eval pads (no randomness) and can batch; the last
  # partial batch is kept.
  padded = PreprocessOptions(crop_size=(41, 41))
  batches = common.take_batches(lambda: pipeline.make_dataset(
      out, 'val', TINY, padded, 2, is_training=False))
  assert [len(b['image']) for b in batches] == [2, 1]
  assert 'original_image' not in batches[0]
  name, image, ids = splits['val'][0]
  h, w = ids.shape
  np.testing.assert_array_equal(batches[0]['image'][0, :h, :w], image)
  assert (batches[0]['image'][0, h:] == 127.5).all()
  assert (batches[0]['label'][0, h:] == 255).all()
  assert batches[0]['image_name'][0] == name.encode()


def test_unlabelled_split_has_no_label_key(tiny_dir):
  out, _ = tiny_dir
  batches = eval_batches(out, split='val', with_label=False)
  assert len(batches) == 3 and 'label' not in batches[0]


def test_pipeline_runs_eagerly(tiny_dir):
  out, _ = tiny_dir
  with common.eager_mode():
    dataset = pipeline.make_dataset(out, 'train', TINY, TRAIN, 2,
                                    is_training=True, seed=0)
    for batch in dataset.take(2):
      assert batch['image'].shape == (2, 17, 19, 3)


def test_data_errors_are_recognised_by_the_pipelines_tag_not_their_wording():
  tagged = tf.errors.InvalidArgumentError(
      None, None, 'Graph execution error:\n\nassertion failed: [%sany '
      'wording at all] [img_7]\n\t [[node Assert]]'
      % pipeline.DATA_ERROR_TAG)
  message = pipeline.data_error_message(tagged)
  assert message.startswith(pipeline.DATA_ERROR_TAG + 'any wording at all')
  assert '[[' not in message
  untagged = tf.errors.InvalidArgumentError(None, None,
                                            'label values outside [0, 5)')
  assert pipeline.data_error_message(untagged) is None
  assert pipeline.data_error_message(ValueError('x')) is None
  lost = pipeline.data_error_message(
      tf.errors.DataLossError(None, None, 'truncated record at 12'))
  assert lost == 'corrupted TFRecord input: truncated record at 12'


def _unreadable_splits(tmp_path):
  """{split: (dataset_dir, first bad file)}: 'junk' holds a good record then
  one that is not a tf.Example, 'noimage' a record whose image bytes are no
  image."""
  rng = np.random.RandomState(3)
  image = common.encode_png(common.random_image(rng, 9, 9))
  label = common.encode_png(common.blocky_label(rng, 9, 9, 4), 'L')
  good = common.raw_example('good', image, label, 9, 9).SerializeToString()
  junk = str(tmp_path / 'junk-00000-of-00001.tfrecord')
  with tf.io.TFRecordWriter(junk) as writer:
    writer.write(good)
    writer.write(b'not an example at all')
  noimage = str(tmp_path / 'noimage-00000-of-00001.tfrecord')
  common.write_records(noimage, [
      common.raw_example('bad', b'\x89PNG but cut', label, 9, 9)])
  return junk, noimage


def test_records_that_cannot_be_parsed_or_decoded_are_named(tmp_path):
  """Not a tf.Example, or an image TensorFlow cannot decode: the parse and
  decode ops fail (not the pipeline's tagged checks); the reader says so on
  one line, naming the file (and the record, for one that is no Example)."""
  from deeplab_train.evaluation import eval_loop  # pylint: disable=g-import-not-at-top
  junk, noimage = _unreadable_splits(tmp_path)

  def read_error(split):
    with pytest.raises(eval_loop.InputDataError) as error:
      list(eval_loop.iterate_split(str(tmp_path), split, TINY, EVAL,
                                   (127.5, 127.5, 127.5)))
    message = str(error.value)
    assert '\n' not in message and '[[' not in message, message
    assert 'Graph execution error' not in message, message
    return message

  assert read_error('junk') == (
      "split 'junk' of %s: %s%s: record 1 is not a tf.Example (Could not "
      "parse example input, value: 'not an example at all'); convert the "
      'data again with deeplab-build-data'
      % (tmp_path, pipeline.DATA_ERROR_TAG, junk))
  message = read_error('noimage')
  assert message.startswith(
      "split 'noimage' of %s: %sa record of %s cannot be parsed or decoded: "
      % (tmp_path, pipeline.DATA_ERROR_TAG, noimage)), message
  assert message.endswith('; convert the data again with deeplab-build-data')


def test_a_failed_read_is_told_from_a_failed_op_by_the_iterator():
  """In training, an error the input iterator raised is bad input data (exit
  2); the same error raised elsewhere in the step is not."""
  text = ('Graph execution error:\n\nUnknown image file format. One of JPEG, '
          'PNG required.\n\t [[{{node decode_image/DecodeImage}}]]\n\t '
          '[[%s]]')
  from_input = tf.errors.InvalidArgumentError(
      None, None, text % 'input/IteratorGetNext')
  assert pipeline.data_error_message(from_input, ['a.tfrecord']) == (
      pipeline.DATA_ERROR_TAG + 'a record of a.tfrecord cannot be parsed or '
      'decoded: Unknown image file format. One of JPEG, PNG required; '
      'convert the data again with deeplab-build-data')
  elsewhere = tf.errors.InvalidArgumentError(
      None, None, text % 'tower_0/loss/SparseSoftmaxCrossEntropyWithLogits')
  assert pipeline.data_error_message(elsewhere, ['a.tfrecord']) is None
  assert pipeline.error_reason(
      'Graph execution error:\n\nError in user-defined function passed to '
      'ParallelMapDatasetV2:2 transformation with iterator: Iterator::Root::'
      'ParallelMapV2: Could not parse example input, value: \'x\'\n\t '
      '[[{{node ParseExample}}]]') == (
          "Could not parse example input, value: 'x'")


@pytest.mark.parametrize('split', ['*', 'tr*', 'va?', '[tv]al'])
def test_a_split_given_as_a_pattern_is_refused(tmp_path, split):
  """The shards are found by `{split}-*`: 'tr*' or '*' (for
  --calibration_split, --eval_split...) read several splits as one."""
  for name in ('train-00000-of-00001.tfrecord', 'val-00000-of-00001.tfrecord'):
    (tmp_path / name).write_bytes(b'')
  with pytest.raises(ConfigError, match=re.escape(
      'split %r holds a pattern character (* ? [ ]): a split\'s shards are '
      'found as <split>-*, so it read several splits as one; give the split '
      'flag the name of one split' % split)):
    pipeline.split_files(str(tmp_path), split)


def test_a_split_does_not_take_in_the_shards_of_another(tmp_path):
  """`val-*` took in the shards of a split 'val-hard' too; a file of
  another name (the original's records may be named freely) still is."""
  for name in ('val-00000-of-00001.tfrecord',
               'val-hard-00000-of-00002.tfrecord',
               'val-hard-00001-of-00002.tfrecord', 'val-extra.tfrecord'):
    (tmp_path / name).write_bytes(b'')
  assert [os.path.basename(f) for f in tfrecord.list_split_files(
      str(tmp_path), 'val')] == ['val-00000-of-00001.tfrecord',
                                 'val-extra.tfrecord']
  assert len(tfrecord.list_split_files(str(tmp_path), 'val-hard')) == 2
