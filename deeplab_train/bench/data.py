"""The benchmark's data: VOC-sized synthetic records, or the bundled sample
dataset converted; both written to a folder the real input pipeline reads."""
import io
import os

import numpy as np
from PIL import Image
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train.config import ConfigError
from deeplab_train.data import datasets
from deeplab_train.data import tfrecord

SYNTHETIC_CLASSES = 21
SYNTHETIC_SIZE = (375, 500)  # height, width of a typical PASCAL VOC image
SAMPLE_CLASSES = 5


def _smooth_noise(rng, height, width, cell=32):
  grid = rng.randint(0, 256, (height // cell + 2, width // cell + 2, 3))
  coarse = Image.fromarray(grid.astype(np.uint8))
  return np.array(coarse.resize((width, height), Image.BILINEAR))


def synthetic_example(rng, index, num_classes, size):
  """One VOC-like record: a smooth image with class rectangles.

  Returns:
    A tf.train.Example in the project's TFRecord schema.
  """
  height, width = size
  if rng.rand() < 0.5:
    height, width = width, height
  image = _smooth_noise(rng, height, width)
  label = np.zeros((height, width), np.uint8)
  for _ in range(rng.randint(1, 4)):
    top, left = rng.randint(0, height // 2), rng.randint(0, width // 2)
    bottom = top + rng.randint(height // 8, height // 2)
    right = left + rng.randint(width // 8, width // 2)
    class_id = rng.randint(1, num_classes)
    label[top:bottom, left:right] = 255  # an ignore border, as in VOC
    label[top + 2:bottom - 2, left + 2:right - 2] = class_id
    image[top + 2:bottom - 2, left + 2:right - 2] = (class_id * 37) % 256
  jpeg, png = io.BytesIO(), io.BytesIO()
  Image.fromarray(image).save(jpeg, format='JPEG', quality=90)
  Image.fromarray(label).save(png, format='PNG')
  return tfrecord.encode_example(jpeg.getvalue(), 'synthetic_%06d' % index,
                                 'jpeg', height, width, png.getvalue())


def write_synthetic_dataset(output_dir, num_images=64, num_shards=4,
                            num_classes=SYNTHETIC_CLASSES,
                            size=SYNTHETIC_SIZE, seed=0, split='train'):
  """Writes `num_images` synthetic records as `split` shards.

  Returns:
    The DatasetInfo of the written data.
  """
  rng = np.random.RandomState(seed)
  for shard in range(num_shards):
    path = os.path.join(output_dir, tfrecord.shard_filename(
        split, shard, num_shards))
    with atomic.writing(path) as tmp:
      with tf.io.TFRecordWriter(tmp) as writer:
        for index in range(shard, num_images, num_shards):
          writer.write(synthetic_example(rng, index, num_classes,
                                         size).SerializeToString())
  return datasets.DatasetInfo(name='synthetic', num_classes=num_classes,
                              ignore_label=255,
                              splits_to_sizes={split: num_images})


def sample_data_folder():
  """The bundled sample dataset (VOC layout) of the source tree.

  Raises:
    ConfigError: not found (e.g. an installed package without the sources).
  """
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  folder = os.path.join(os.path.dirname(package), 'data')
  if not os.path.isdir(os.path.join(folder, 'JPEGImages')):
    raise ConfigError('the sample dataset %s is missing (it ships with the '
                      'source tree; make it with scripts/make_sample_data.py)'
                      ' or use synthetic data' % folder)
  return folder


def convert_sample_dataset(output_dir, split='train',
                           num_classes=SAMPLE_CLASSES, dataset_name='sample'):
  """Converts the bundled sample dataset's `split` into `output_dir`, as a
  dataset of `num_classes` classes named `dataset_name`.

  Returns:
    The DatasetInfo written.
  """
  from deeplab_train.data import build  # pylint: disable=g-import-not-at-top
  data = sample_data_folder()
  options = build.BuildOptions(num_classes=num_classes,
                               dataset_name=dataset_name)
  return build.build_voc(os.path.join(data, 'JPEGImages'),
                         os.path.join(data, 'SegmentationClass'),
                         os.path.join(data, 'ImageSets', 'Segmentation'),
                         output_dir, options, split_name=split)
