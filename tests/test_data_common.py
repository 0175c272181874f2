"""Helpers shared by the data tests (tiny folders, hand-made records), and
tests of the TFRecord schema module itself."""
import contextlib
import io
import os

import numpy as np
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.data import colormap
from deeplab_train.data import tfrecord


@contextlib.contextmanager
def eager_mode():
  """Runs the block eagerly even when another test module disabled v2
  behaviour process-wide (tf.disable_v2_behavior is global)."""
  if tf.executing_eagerly():
    yield
    return
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  with context.eager_mode():
    yield


def run_in_graph(build, feed=None):
  """Builds `build()` in a fresh graph and returns its value (numpy)."""
  with tf.Graph().as_default():
    fetches = build()
    with tf.Session() as sess:
      return sess.run(fetches, feed_dict=feed)


def take_batches(make_dataset, limit=1000):
  """All batches (up to `limit`) of the dataset `make_dataset()` builds,
  read through a one-shot iterator in a fresh graph (the trainer's way)."""
  out = []
  with tf.Graph().as_default():
    next_batch = tf.data.make_one_shot_iterator(make_dataset()).get_next()
    with tf.Session() as sess:
      try:
        while len(out) < limit:
          out.append(sess.run(next_batch))
      except tf.errors.OutOfRangeError:
        pass
  return out


def blocky_label(rng, height, width, num_classes, block=8):
  """uint8 ids [H, W] constant on block x block tiles."""
  tiles = rng.randint(0, num_classes, size=(height // block + 1,
                                            width // block + 1))
  return np.kron(tiles, np.ones((block, block), dtype=np.int64))[
      :height, :width].astype(np.uint8)


def random_image(rng, height, width):
  return rng.randint(0, 256, size=(height, width, 3)).astype(np.uint8)


def encode_png(array, mode=None, palette=None):
  im = Image.fromarray(array, mode) if mode else Image.fromarray(array)
  if palette is not None:
    im.putpalette(palette)
  buf = io.BytesIO()
  im.save(buf, format='PNG')
  return buf.getvalue()


def save_label(path, ids, mode='P'):
  """Saves ids as a palette ('P'), grey ('L') or PASCAL-coloured 'RGB' PNG."""
  if mode == 'P':
    im = Image.fromarray(ids.astype(np.uint8), 'P')
    im.putpalette(colormap.palette_for_png('pascal'))
  elif mode == 'L':
    im = Image.fromarray(ids.astype(np.uint8), 'L')
  elif mode == 'RGB':
    im = Image.fromarray(colormap.get_colormap('pascal')[ids], 'RGB')
  else:
    raise ValueError(mode)
  im.save(path)


def write_voc_folder(root, splits, image_format='png', label_mode='P'):
  """Writes a VOC-layout folder.

  Args:
    root: folder to create.
    splits: {split: [(name, image uint8 [H,W,3], ids uint8 [H,W]), ...]}.
    image_format: 'png' (lossless) or 'jpg'.
    label_mode: see save_label.

  Returns:
    (image_folder, label_folder, list_folder).
  """
  images = os.path.join(root, 'JPEGImages')
  labels = os.path.join(root, 'SegmentationClass')
  lists = os.path.join(root, 'ImageSets', 'Segmentation')
  for d in (images, labels, lists):
    os.makedirs(d, exist_ok=True)
  for split, pairs in splits.items():
    for name, image, ids in pairs:
      Image.fromarray(image).save(
          os.path.join(images, '%s.%s' % (name, image_format)))
      save_label(os.path.join(labels, name + '.png'), ids, label_mode)
    with open(os.path.join(lists, split + '.txt'), 'w') as f:
      f.write(''.join(name + '\n' for name, _, _ in pairs))
  return images, labels, lists


def folder_contents(folder):
  """{file name: bytes} of every file in `folder` (hidden ones included)."""
  out = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), 'rb') as f:
      out[name] = f.read()
  return out


def tiny_pairs(seed, count, num_classes=4, prefix='img', sizes=None):
  """[(name, image, ids)] of small random images with blocky labels."""
  rng = np.random.RandomState(seed)
  sizes = sizes or [(int(rng.randint(17, 40)), int(rng.randint(17, 40)))
                    for _ in range(count)]
  return [('%s_%02d' % (prefix, i), random_image(rng, h, w),
           blocky_label(rng, h, w, num_classes, block=5))
          for i, (h, w) in enumerate(sizes)]


def raw_example(name, image_png, label_png, height, width,
                image_format=b'png'):
  """A record in the original converter's schema, built by hand."""
  def b(v):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

  def i(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
  return tf.train.Example(features=tf.train.Features(feature={
      'image/encoded': b(image_png),
      'image/filename': b(name.encode()),
      'image/format': b(image_format),
      'image/height': i(height),
      'image/width': i(width),
      'image/channels': i(3),
      'image/segmentation/class/encoded': b(label_png),
      'image/segmentation/class/format': b(b'png'),
  }))


def write_records(path, examples):
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      writer.write(example.SerializeToString())


# ---------------------------------------------------------------------------
# tfrecord module tests.
# ---------------------------------------------------------------------------
def test_shard_names_match_the_original():
  assert tfrecord.shard_filename('train', 1, 4) == (
      'train-00001-of-00004.tfrecord')
  assert tfrecord.parse_shard_filename('val-00003-of-00010.tfrecord') == (
      'val', 3, 10)
  assert tfrecord.parse_shard_filename('.val-00003-of-00010.tfrecord.tmp') \
      is None
  assert tfrecord.shard_pattern('train_aug') == 'train_aug-*'


def test_list_split_files_ignores_temp_and_other_splits(tmp_path):
  for name in ('train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord',
               '.train-00001-of-00002.tfrecord.tmp-1',
               'train_aug-00000-of-00001.tfrecord', 'val-00000-of-00001.tfrecord'):
    (tmp_path / name).write_bytes(b'')
  files = [os.path.basename(f)
           for f in tfrecord.list_split_files(str(tmp_path), 'train')]
  assert files == ['train-00000-of-00002.tfrecord',
                   'train-00001-of-00002.tfrecord']


def test_encoded_example_has_exactly_the_original_keys():
  ex = tfrecord.encode_example(b'img', 'name_1', 'jpg', 7, 9, b'lab')
  feature = ex.features.feature
  assert sorted(feature) == sorted(tfrecord.KEYS)
  assert feature['image/format'].bytes_list.value == [b'jpeg']
  assert feature['image/filename'].bytes_list.value == [b'name_1']
  assert feature['image/height'].int64_list.value == [7]
  assert feature['image/width'].int64_list.value == [9]
  assert feature['image/channels'].int64_list.value == [3]
  assert feature['image/segmentation/class/format'].bytes_list.value == [b'png']
  with pytest.raises(ValueError, match='image format'):
    tfrecord.encode_example(b'', 'x', 'bmp', 1, 1, b'')


def test_parse_example_reads_a_hand_built_record():
  rng = np.random.RandomState(0)
  image = random_image(rng, 5, 6)
  ids = blocky_label(rng, 5, 6, 3, block=2)
  ex = raw_example('a', encode_png(image), encode_png(ids, 'L'), 5, 6)

  def build():
    features = tfrecord.parse_example(tf.constant(ex.SerializeToString()))
    got_image, got_label = tfrecord.decode_image_and_label(features)
    return got_image, got_label, features['image/filename']
  got_image, got_label, name = run_in_graph(build)
  np.testing.assert_array_equal(got_image, image)
  np.testing.assert_array_equal(got_label[..., 0], ids)
  assert name == b'a'
