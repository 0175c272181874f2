"""The tf.data input pipeline: TFRecord shards -> batches of samples.

`make_dataset` lists a split's shards, interleaves their readers, shuffles
the serialized records (training), repeats (training), then in parallel
parses, decodes, validates and preprocesses each record, batches and
prefetches. Each sample is a dict with the original DeepLab's keys:

  'image'          float32 [B, H, W, 3], raw 0-255 values, padded with the
                   mean pixel;
  'label'          int32 [B, H, W, 1] (absent for unlabelled splits);
  'image_name'     string [B] ('image/filename' of the record);
  'height'/'width' int64 [B], size of the stored image;
  'original_image' uint8 [B, H0, W0, 3], only when `keep_original_image`
                   (by default: evaluation with batch size 1).

Records are checked in the graph: the label must exist, match the image size
and hold only ids in [0, num_classes) or the ignore label; otherwise the
iterator raises InvalidArgumentError naming the image. The pipeline works
eagerly and inside a tf.Graph (make_one_shot_iterator / get_next).
"""
import os
import random
import re

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import errors
from deeplab_train.data import datasets
from deeplab_train.data import preprocess
from deeplab_train.data import tfrecord

IMAGE = 'image'
LABEL = 'label'
IMAGE_NAME = 'image_name'
HEIGHT = 'height'
WIDTH = 'width'
ORIGINAL_IMAGE = 'original_image'

AUTOTUNE = tf.data.experimental.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 100  # records, as the original


# ---------------------------------------------------------------------------
# Finding the shards.
# ---------------------------------------------------------------------------
def _splits_present(dataset_dir):
  names = set()
  for f in os.listdir(dataset_dir):
    parsed = tfrecord.parse_shard_filename(f)
    if parsed and not f.startswith('.'):
      names.add(parsed[0])
  return sorted(names)


def _check_complete(files, split):
  """Standard `-of-N` shard sets must have all N shards (`files`: the
  split's, from list_split_files, which gives no other split's)."""
  totals = {}
  for path in files:
    parsed = tfrecord.parse_shard_filename(path)
    if parsed:
      totals.setdefault(parsed[2], set()).add(parsed[1])
  for total, indices in totals.items():
    missing = sorted(set(range(total)) - indices)
    if missing:
      raise ConfigError(
          'split %r is incomplete: shard(s) %s of %d missing in %s; rebuild '
          'the split with deeplab-build-data'
          % (split, ', '.join(tfrecord.shard_filename(split, i, total)
                              for i in missing[:4]), total,
             os.path.dirname(files[0])))


def split_files(dataset_dir, split):
  """The TFRecord files of `split`, checked to be present and non-empty.

  Raises:
    ConfigError: missing folder, a build stopped half-way through renaming
      its files into it, no `{split}-*` files, only empty files, an
      incomplete shard set, or a file cut short (which TensorFlow's reader
      may take for its end).
  """
  if not dataset_dir or not os.path.isdir(dataset_dir):
    raise ConfigError('{split_files.dataset_dir}=%s is not a folder',
                      dataset_dir)
  if any(c in split for c in '*?[]'):
    raise ConfigError(
        'split %r holds a pattern character (* ? [ ]): a split\'s shards '
        'are found as <split>-*, so it read several splits as one; give the '
        'split flag the name of one split', split)
  journal = tfrecord.unfinished_switch(dataset_dir)
  if journal:
    raise ConfigError(
        '%s holds a half-switched build: a deeplab-build-data run stopped '
        'while renaming its new records into place (%s is left), so its '
        'splits may mix two builds; run deeplab-build-data with this '
        'output folder again: it finishes that build first', dataset_dir,
        journal)
  files = tfrecord.list_split_files(dataset_dir, split)
  if not files:
    present = _splits_present(dataset_dir)
    raise ConfigError(
        'no TFRecords for split %r in %s (pattern %s); splits found: %s. '
        'Check the split flag or convert the data with deeplab-build-data'
        % (split, dataset_dir, tfrecord.shard_pattern(split),
           ', '.join(present) or 'none'))
  if all(os.path.getsize(f) == 0 for f in files):
    raise ConfigError('split %r in %s has no records (all %d files are '
                      'empty)' % (split, dataset_dir, len(files)))
  _check_complete(files, split)
  for path in files:
    cut = tfrecord.cut_short(path)
    if cut:
      raise ConfigError('%s', _damaged_message((path,) + cut))
  return files


# ---------------------------------------------------------------------------
# Per-record graph.
# ---------------------------------------------------------------------------
# Every in-graph check of the data starts its message with this tag:
# `data_error_message` tells a failed check from a bug by it, whatever the
# rest of the message says.
DATA_ERROR_TAG = 'bad input data: '


def data_error_message(error, record_files=None):
  """A one-line message when a step failed on bad input data, else None.

  Bad input data: a damaged file, a failed check of the pipeline (tagged),
  or a parse or decode op of the pipeline that failed (the error came
  through the input iterator). Any other error is not recognised.

  Args:
    error: an exception raised while running a graph fed by this pipeline.
    record_files: the TFRecord files it read, to name the damaged one
      (TensorFlow's error does not).
  """
  if isinstance(error, tf.errors.DataLossError):
    found = damaged_record(record_files or ())
    if found:
      return _damaged_message(found)
    return 'corrupted TFRecord input: %s' % _first_line(error.message)
  if not isinstance(error, tf.errors.InvalidArgumentError):
    return None
  text = error.message
  if DATA_ERROR_TAG in text:
    return _first_line(text[text.index(DATA_ERROR_TAG):])
  if _INPUT_ITERATOR.search(text):
    # A parse or decode op of the pipeline failed (not one of its checks,
    # which are tagged): not a tf.Example, or an image that is not one.
    found = unparsable_record(record_files or ())
    if found:
      return (DATA_ERROR_TAG + '%s: record %d is not a tf.Example (%s); '
              'convert the data again with deeplab-build-data'
              % (found + (error_reason(text),)))
    return (DATA_ERROR_TAG + 'a record of %s cannot be parsed or decoded: '
            '%s; convert the data again with deeplab-build-data'
            % (_files_named(record_files), error_reason(text)))
  return None


# Where TensorFlow's message says the failing op ran inside the input
# pipeline: the op name of the iterator's get_next ("[[input/IteratorGetNext]]").
_INPUT_ITERATOR = re.compile(r'\[\[[^\]]*IteratorGetNext[^\]]*\]\]')


def error_reason(message):
  """The line of a TensorFlow error message that says what failed, without
  the session's 'Graph execution error:' heading and the node names."""
  for line in message.strip().splitlines():
    line = _DATASET_FUNCTION.sub('', _first_line(line)).rstrip('.')
    if line and not line.startswith('Graph execution error'):
      # A record's bytes may be quoted whole ("value: '...'").
      return line if len(line) <= _MAX_REASON else (
          line[:_MAX_REASON] + '...')
  return _first_line(message)


_MAX_REASON = 240
# tf.data's heading when the error came from a dataset function.
_DATASET_FUNCTION = re.compile(r'^Error in user-defined function passed to '
                               r'.*? transformation with iterator: \S+: ')


def _files_named(files):
  return (errors.shortened(files, 2) if files
          else 'the split\'s TFRecord files')


def unparsable_record(files):
  """(file, record index) of the first record of `files` that is not a
  tf.Example, or None. Reads every file once: called only after a failure.
  """
  for path in files:
    try:
      for index, record in enumerate(tf.io.tf_record_iterator(path)):
        try:
          tf.train.Example.FromString(record)
        except Exception:  # pylint: disable=broad-except
          # protobuf's DecodeError: protobuf comes with TensorFlow, it is
          # not imported here for one exception class.
          return path, index
    except tf.errors.OpError:
      # Damaged or gone since: the message names the files instead.
      return None
  return None


def _damaged_message(found):
  """The message of `damaged_record`'s (file, record index, offset)."""
  return ('corrupted TFRecord input: %s: record %d (byte offset %d) is '
          'damaged or cut short; convert the data again with '
          'deeplab-build-data' % found)


def damaged_record(files):
  """(file, record index, byte offset) of the first record of `files` that
  cannot be read (cut short or failing its checksum), or None.

  Reads every file once: called only after a read failed.
  """
  for path in files:
    index = offset = 0
    try:
      for record in tf.io.tf_record_iterator(path):
        # Each record: length (8), its CRC (4), the data, the data's CRC (4).
        offset += len(record) + 16
        index += 1
    except tf.errors.DataLossError:
      return path, index, offset
    # The reader stops without an error in a cut-short header.
    cut = tfrecord.cut_short(path) if os.path.isfile(path) else None
    if cut:
      return (path,) + cut
  return None


def _first_line(text):
  line = text.strip().splitlines()[0] if text.strip() else ''
  # Graph error messages append node details after ' [[': drop them.
  return re.split(r'\s*\[\[', line)[0]


def _assert_label_present(features, name):
  present = tf.strings.length(features[tfrecord.LABEL_ENCODED]) > 0
  return tf.Assert(present, [DATA_ERROR_TAG + 'record has no label '
                             '(image/segmentation/class/encoded); image:',
                             name])


def _assert_same_size(image, label, name):
  image_hw = tf.shape(image)[:2]
  label_hw = tf.shape(label)[:2]
  return tf.Assert(tf.reduce_all(tf.equal(image_hw, label_hw)),
                   [DATA_ERROR_TAG + 'image and label sizes differ; image, '
                    'its HxW, label HxW:',
                    name, image_hw, label_hw])


def _invalid_ids(ids, num_classes, ignore_label):
  """Where `ids` (any integer type, compared in that type: no cast of the
  whole label) are outside [0, num_classes) and not the ignore label."""
  dtype = ids.dtype
  if num_classes > dtype.max:
    invalid = tf.zeros_like(ids, tf.bool)
  else:
    invalid = ids >= tf.cast(num_classes, dtype)
    if dtype.min <= ignore_label <= dtype.max:
      invalid = tf.logical_and(invalid,
                               tf.not_equal(ids, tf.cast(ignore_label, dtype)))
  if dtype.min < 0:
    invalid = tf.logical_or(invalid, ids < 0)
  return invalid


def label_range_assertion(label, name, num_classes, ignore_label):
  """An Assert op failing when `label` holds ids outside the valid set.

  The message names the image and lists the offending values, with a hint
  for the classic mistake (palette PNGs stored as-is decode to grey levels).
  """
  flat = tf.reshape(label, [-1])
  all_valid = tf.logical_not(tf.reduce_any(_invalid_ids(flat, num_classes,
                                                        ignore_label)))
  # The offending values are looked for only when there are some.
  def find_bad_values():
    flat_ids = tf.cast(flat, tf.int32)
    invalid = _invalid_ids(flat_ids, num_classes, ignore_label)
    return tf.unique(tf.boolean_mask(flat_ids, invalid))[0]
  bad_values = tf.cond(all_valid, lambda: tf.zeros([0], tf.int32),
                       find_bad_values)
  message = DATA_ERROR_TAG + (
      'label values outside [0, %d) and not the ignore label %d (a colour '
      'palette PNG stored as-is decodes to grey levels 38, 75, ...: rebuild '
      'the TFRecords with deeplab-build-data, or fix num_classes / '
      'ignore_label in dataset.json); image, bad values:'
      % (num_classes, ignore_label))
  return tf.Assert(all_valid, [message, name, bad_values], summarize=20)


def parse_and_decode(serialized, dataset_info, with_label=True):
  """Parses one record and decodes + validates its image and label.

  Returns:
    (image uint8 [H, W, 3], label uint8 [H, W, 1] or None, name string).
  """
  features = tfrecord.parse_example(serialized)
  name = features[tfrecord.IMAGE_FILENAME]
  image = tfrecord.decode_image(features[tfrecord.IMAGE_ENCODED], 3)
  if not with_label:
    return image, None, name
  with tf.control_dependencies([_assert_label_present(features, name)]):
    label = tfrecord.decode_image(features[tfrecord.LABEL_ENCODED], 1)
  checks = [_assert_same_size(image, label, name),
            label_range_assertion(label, name, dataset_info.num_classes,
                                  dataset_info.ignore_label)]
  with tf.control_dependencies(checks):
    label = tf.identity(label)
  return image, label, name


def _sample_fn(dataset_info, options, is_training, mean_pixel, crop_size,
               with_label, keep_original_image):
  def make_sample(serialized, seed):
    image, label, name = parse_and_decode(serialized, dataset_info,
                                          with_label)
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    original, image, label = preprocess.preprocess_image_and_label(
        image, label, options, ignore_label=dataset_info.ignore_label,
        is_training=is_training, mean_pixel=mean_pixel, crop_size=crop_size,
        seed=seed, name=name)
    sample = {IMAGE: image, IMAGE_NAME: name,
              HEIGHT: tf.cast(height, tf.int64),
              WIDTH: tf.cast(width, tf.int64)}
    if label is not None:
      sample[LABEL] = label
    if keep_original_image:
      sample[ORIGINAL_IMAGE] = original
    return sample
  return make_sample


# ---------------------------------------------------------------------------
# The dataset.
# ---------------------------------------------------------------------------
def make_dataset(dataset_dir, split, dataset_info, preprocess_options,
                 batch_size, is_training, mean_pixel=(127.5, 127.5, 127.5),
                 crop_size=preprocess.FROM_OPTIONS, num_readers=None,
                 num_parallel_calls=AUTOTUNE,
                 shuffle_buffer_size=DEFAULT_SHUFFLE_BUFFER, seed=None,
                 repeat=None, keep_original_image=None, with_label=None,
                 prefetch_buffer_size=AUTOTUNE):
  """Builds the input pipeline of one split.

  Args:
    dataset_dir: folder of the TFRecord shards.
    split: split name; shards are `{split}-*`.
    dataset_info: DatasetInfo (num_classes, ignore_label).
    preprocess_options: PreprocessOptions.
    batch_size: samples per batch (training drops the last partial batch).
    is_training: augment, shuffle and repeat.
    mean_pixel: RGB padding value of images (the backbone's mean pixel).
    crop_size: (height, width) or None (eval: no padding, batch size 1);
      by default `preprocess_options.crop_size`.
    num_readers: shards read at once (training); default min(4, shards).
      Evaluation reads the shards in order.
    num_parallel_calls: parallel decode/preprocess calls (AUTOTUNE).
    shuffle_buffer_size: records in the shuffle buffer (training).
    seed: int for a reproducible order and augmentation; None: random.
    repeat: repeat forever; default is_training.
    keep_original_image: add 'original_image'; default: eval with batch 1.
    with_label: decode labels; default: every split but 'test'.
    prefetch_buffer_size: batches to prefetch (AUTOTUNE).

  Returns:
    A tf.data.Dataset of sample dicts (see the module docstring).

  Raises:
    ConfigError: bad split or folder, or inconsistent batch/crop settings.
  """
  if crop_size == preprocess.FROM_OPTIONS:
    crop_size = preprocess_options.crop_size
  crop_size = tuple(crop_size) if crop_size is not None else None
  preprocess_options.replace(crop_size=crop_size).validate()
  if batch_size < 1:
    raise ConfigError('batch size must be >= 1, got %d' % batch_size)
  if crop_size is None and batch_size != 1:
    raise ConfigError('without a crop size images keep their own size, so '
                      'the batch size must be 1 (got %d); set a crop size to '
                      'batch them' % batch_size)
  if is_training and crop_size is None:
    raise ConfigError('training needs a crop size '
                      '({PreprocessOptions.crop_size})')
  if with_label is None:
    with_label = split != 'test'
  if is_training and not with_label:
    raise ConfigError('cannot train on split %r without labels' % split)
  if repeat is None:
    repeat = is_training
  if keep_original_image is None:
    keep_original_image = not is_training and batch_size == 1
  files = split_files(dataset_dir, split)
  base_seed = seed if seed is not None else random.randrange(2**31 - 1)
  deterministic = seed is not None or not is_training

  records = _read_records(files, is_training, num_readers, base_seed,
                          deterministic, shuffle_buffer_size)
  if repeat:
    records = records.repeat()
  # The mapped functions are graph code already (tf.cond where a branch
  # depends on a tensor), so they run as written: AutoGraph would rewrite
  # each function they call (about 50) at every build, 2.7-4.2 s of
  # building a training pipeline against 0.6-0.7 s without.
  plain = tf.autograph.experimental.do_not_convert
  # Element i is augmented with the stateless seed (base_seed, i), so runs
  # with the same seed match even with parallel map calls.
  seeds = tf.data.Dataset.counter().map(plain(
      lambda i: tf.stack([tf.constant(base_seed, tf.int64), i])))
  make_sample = _sample_fn(dataset_info, preprocess_options, is_training,
                           tuple(float(v) for v in mean_pixel), crop_size,
                           with_label, keep_original_image)
  samples = tf.data.Dataset.zip((records, seeds)).map(
      plain(make_sample), num_parallel_calls=num_parallel_calls,
      deterministic=deterministic)
  batches = samples.batch(batch_size, drop_remainder=is_training)
  return batches.prefetch(prefetch_buffer_size)


def _read_records(files, is_training, num_readers, seed, deterministic,
                  shuffle_buffer_size):
  file_names = tf.data.Dataset.from_tensor_slices(files)
  if not is_training:
    return tf.data.TFRecordDataset(file_names)
  file_names = file_names.shuffle(len(files), seed=seed)
  cycle = num_readers or min(4, len(files))
  records = file_names.interleave(
      tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
      num_parallel_calls=min(cycle, 4), deterministic=deterministic)
  return records.shuffle(shuffle_buffer_size, seed=seed,
                         reshuffle_each_iteration=True)


def make_dataset_from_name(dataset_name, dataset_dir, split,
                           preprocess_options, batch_size, is_training,
                           **kwargs):
  """`make_dataset` with the DatasetInfo looked up by name / dataset.json.

  Returns:
    (tf.data.Dataset, DatasetInfo).
  """
  info = datasets.load_dataset_info(dataset_name, dataset_dir)
  return make_dataset(dataset_dir, split, info, preprocess_options,
                      batch_size, is_training, **kwargs), info
