"""The TFRecord schema shared with the original DeepLab converters.

One tf.train.Example per image with the original keys (see `KEYS`); shards
are named `{split}-{i:05d}-of-{n:05d}.tfrecord` and read back with the
pattern `{split}-*`. The label is a single-channel PNG whose pixel values are
class ids: readers decode it with `decode_png(channels=1)`, so a palette PNG
stored as-is would decode to grey levels instead of ids.

`encode_example` is the Python (writer) side; `parse_example` and
`decode_image_and_label` are graph ops for the tf.data reader.
"""
import fnmatch
import os
import re
import struct

import tensorflow.compat.v1 as tf

IMAGE_ENCODED = 'image/encoded'
IMAGE_FILENAME = 'image/filename'
IMAGE_FORMAT = 'image/format'
IMAGE_HEIGHT = 'image/height'
IMAGE_WIDTH = 'image/width'
IMAGE_CHANNELS = 'image/channels'
LABEL_ENCODED = 'image/segmentation/class/encoded'
LABEL_FORMAT = 'image/segmentation/class/format'

KEYS = (IMAGE_ENCODED, IMAGE_FILENAME, IMAGE_FORMAT, IMAGE_HEIGHT,
        IMAGE_WIDTH, IMAGE_CHANNELS, LABEL_ENCODED, LABEL_FORMAT)

# The original's name for each accepted image file format.
IMAGE_FORMATS = {'jpg': 'jpeg', 'jpeg': 'jpeg', 'png': 'png'}

_SHARD_RE = re.compile(r'^(?P<split>.+)-(?P<index>\d{5})-of-(?P<total>\d{5})'
                       r'\.tfrecord$')


def shard_filename(split, index, num_shards):
  """'train-00001-of-00004.tfrecord' for split 'train', shard 1 of 4."""
  return '%s-%05d-of-%05d.tfrecord' % (split, index, num_shards)


def shard_pattern(split):
  """The glob the original reader uses for a split's shards."""
  return '%s-*' % split


def parse_shard_filename(filename):
  """(split, index, num_shards) for a standard shard name, else None."""
  m = _SHARD_RE.match(os.path.basename(filename))
  if not m:
    return None
  return m.group('split'), int(m.group('index')), int(m.group('total'))


# Left in a TFRecord folder while deeplab-build-data renames a finished
# build into place (data/build.py): its presence means a build stopped
# half-way through that, which the next build finishes.
SWITCH_JOURNAL = '.deeplab-build-data.switch.json'


def unfinished_switch(dataset_dir):
  """The switch journal's path when a build stopped while renaming its
  files into `dataset_dir` (its shards may mix two builds), else None."""
  path = os.path.join(dataset_dir, SWITCH_JOURNAL)
  return path if os.path.exists(path) else None


def list_split_files(dataset_dir, split):
  """The shard files of `split` in `dataset_dir`, sorted.

  Matches the original's `{split}-*` glob, less the standard shards of
  another split it takes in (`val-hard-00000-of-00002.tfrecord` for split
  'val'); hidden files (our in-progress temp shards start with '.') never
  match.
  """
  if not os.path.isdir(dataset_dir):
    return []
  pattern = shard_pattern(split)
  return sorted(os.path.join(dataset_dir, f)
                for f in os.listdir(dataset_dir)
                if fnmatch.fnmatchcase(f, pattern) and not f.startswith('.')
                and _not_of_another_split(f, split))


def _not_of_another_split(filename, split):
  parsed = parse_shard_filename(filename)
  return parsed is None or parsed[0] == split


# A record's frame: its length (8 bytes, little-endian), the length's CRC
# (4), the data, the data's CRC (4).
_HEADER_BYTES = 12
_FOOTER_BYTES = 4


def cut_short(path):
  """(record index, byte offset) of the record of the TFRecord file `path`
  that the file ends inside of, or None when it ends after a whole record.

  TensorFlow's reader takes a file that ends inside a record's 12-byte
  header for a file that ends there: the records from there on are lost
  without an error. Only the lengths are read (a seek per record), not the
  data; checksums are the reader's. Remembered per file version (inode,
  size, mtime): split_files asks at every evaluation of a run.
  """
  info = os.stat(path)
  key = (path, info.st_ino, info.st_size, info.st_mtime_ns)
  if key not in _CUT_SHORT:
    _CUT_SHORT[key] = _cut_short(path, info.st_size)
  return _CUT_SHORT[key]


# cut_short's answers, by (path, inode, size, mtime).
_CUT_SHORT = {}


def _cut_short(path, size):
  index = offset = 0
  # Unbuffered: 8 bytes read per record, not a buffer's worth.
  with open(path, 'rb', buffering=0) as f:
    while offset < size:
      if size - offset < _HEADER_BYTES:
        return index, offset
      f.seek(offset)
      length = struct.unpack('<Q', f.read(8))[0]
      end = offset + _HEADER_BYTES + length + _FOOTER_BYTES
      if end > size:
        return index, offset
      offset = end
      index += 1
  return None


def largest_image_size(files, resize=None):
  """(height, width): the largest height and width of the images of the
  records in `files`, read from their image/height and image/width
  (nothing is decoded); None when a record lacks them or cannot be read
  (the reader names such a record).

  Args:
    files: TFRecord files.
    resize: fn(height, width) -> int [2], the size an image is resized to
      (image_ops.resize_to_range_size with its bounds), or None.
  """
  sizes = {key: tf.FixedLenFeature([], tf.int64, default_value=-1)
           for key in (IMAGE_HEIGHT, IMAGE_WIDTH)}

  def bounds_of(height, width):
    return {'height': height, 'width': width,
            'smallest': tf.minimum(height, width)}

  def resized(record):
    size = tf.cast(resize(tf.maximum(record['height'], 1),
                          tf.maximum(record['width'], 1)), tf.int64)
    return dict(record, height=size[0], width=size[1])

  with tf.Graph().as_default():
    parsed = tf.data.TFRecordDataset(files).batch(256).map(
        lambda batch: tf.io.parse_example(batch, sizes)).map(
            lambda b: bounds_of(b[IMAGE_HEIGHT], b[IMAGE_WIDTH]))
    if resize is not None:
      parsed = parsed.unbatch().map(resized).batch(256)
    bounds = parsed.reduce(
        tf.constant([0, 0, 1 << 30], tf.int64),
        lambda acc, b: tf.stack([
            tf.maximum(acc[0], tf.reduce_max(b['height'])),
            tf.maximum(acc[1], tf.reduce_max(b['width'])),
            tf.minimum(acc[2], tf.reduce_min(b['smallest']))]))
    with tf.Session() as session:
      try:
        height, width, smallest = session.run(bounds)
      except tf.errors.OpError:
        return None
  if smallest <= 0 or not height:
    return None
  return int(height), int(width)


def _bytes(value):
  if isinstance(value, str):
    value = value.encode('utf-8')
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))


def encode_example(image_data, filename, image_format, height, width,
                   label_data, label_format='png'):
  """One image/label pair as a tf.train.Example in the original schema.

  Args:
    image_data: encoded image bytes (JPEG or PNG).
    filename: image name stored as 'image/filename' (the original stores the
      id from the list file, without extension).
    image_format: 'jpeg'/'jpg' or 'png'.
    height: image height in pixels.
    width: image width in pixels.
    label_data: single-channel PNG bytes of class ids, or None for an
      unlabelled (test) image.
    label_format: stored as 'image/segmentation/class/format'.

  Returns:
    A tf.train.Example.

  Raises:
    ValueError: unknown image format.
  """
  if image_format not in IMAGE_FORMATS:
    raise ValueError('image format must be one of %s, got %r'
                     % (sorted(IMAGE_FORMATS), image_format))
  feature = {
      IMAGE_ENCODED: _bytes(image_data),
      IMAGE_FILENAME: _bytes(filename),
      IMAGE_FORMAT: _bytes(IMAGE_FORMATS[image_format]),
      IMAGE_HEIGHT: _int64(height),
      IMAGE_WIDTH: _int64(width),
      IMAGE_CHANNELS: _int64(3),
      LABEL_ENCODED: _bytes(label_data if label_data is not None else b''),
      LABEL_FORMAT: _bytes(label_format),
  }
  return tf.train.Example(features=tf.train.Features(feature=feature))


def _feature_spec():
  # Same keys and defaults as the original reader; 'image/channels' is not
  # read (the image is always decoded to 3 channels).
  return {
      IMAGE_ENCODED: tf.FixedLenFeature((), tf.string, default_value=''),
      IMAGE_FILENAME: tf.FixedLenFeature((), tf.string, default_value=''),
      IMAGE_FORMAT: tf.FixedLenFeature((), tf.string, default_value='jpeg'),
      IMAGE_HEIGHT: tf.FixedLenFeature((), tf.int64, default_value=0),
      IMAGE_WIDTH: tf.FixedLenFeature((), tf.int64, default_value=0),
      LABEL_ENCODED: tf.FixedLenFeature((), tf.string, default_value=''),
      LABEL_FORMAT: tf.FixedLenFeature((), tf.string, default_value='png'),
  }


def parse_example(serialized):
  """Parses one serialized Example into its raw fields (graph op).

  Args:
    serialized: scalar string tensor.

  Returns:
    Dict keyed like the schema (see `KEYS`, without 'image/channels').
  """
  return tf.io.parse_single_example(serialized, _feature_spec())


def decode_image(encoded, channels):
  """Decodes JPEG or PNG (or BMP/GIF) bytes to uint8 [H, W, channels]."""
  return tf.io.decode_image(encoded, channels=channels,
                            expand_animations=False)


def decode_image_and_label(features, with_label=True):
  """Decodes the image and (optionally) the label of a parsed Example.

  Args:
    features: output of `parse_example`.
    with_label: decode the label too.

  Returns:
    (image uint8 [H, W, 3], label uint8 [H, W, 1] or None).
  """
  image = decode_image(features[IMAGE_ENCODED], 3)
  label = None
  if with_label:
    label = decode_image(features[LABEL_ENCODED], 1)
  return image, label
