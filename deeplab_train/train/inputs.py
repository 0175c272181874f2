"""The training input: the data pipeline's batches as graph tensors, and the
recognition of input errors raised while training."""
import re

import tensorflow.compat.v1 as tf

from deeplab_train.data import pipeline

# Messages of the pipeline's in-graph checks (data/pipeline.py); an
# InvalidArgumentError carrying one is the user's data, not a bug.
_DATA_ERROR_MARKERS = ('label values outside', 'image and label sizes differ',
                       'record has no label')


def make_input_fn(dataset_dir, split, dataset_info, preprocess_options,
                  batch_size, mean_pixel, seed=None):
  """fn() -> the next training batch {'image', 'label', ...} as tensors.

  Args:
    dataset_dir: folder of the TFRecords.
    split: split to train on.
    dataset_info: DatasetInfo.
    preprocess_options: PreprocessOptions (crop size, scaling, resizing).
    batch_size: the whole batch (all towers).
    mean_pixel: padding value of the images (the backbone's mean pixel).
    seed: for a reproducible input order and augmentation.

  Returns:
    The input_fn for `build_training_graph`.
  """
  def input_fn():
    dataset = pipeline.make_dataset(
        dataset_dir, split, dataset_info, preprocess_options, batch_size,
        is_training=True, mean_pixel=mean_pixel, seed=seed)
    return tf.data.make_one_shot_iterator(dataset).get_next()
  return input_fn


def input_error_message(error):
  """A one-line message when `error` comes from bad input data, else None.

  Args:
    error: an exception raised by a training step.
  """
  if isinstance(error, tf.errors.DataLossError):
    return 'corrupted TFRecord input: %s' % _first_line(error.message)
  if isinstance(error, tf.errors.InvalidArgumentError):
    text = error.message
    for marker in _DATA_ERROR_MARKERS:
      if marker in text:
        start = text.index(marker)
        return 'bad input data: ' + _first_line(text[start:])
  return None


def _first_line(text):
  line = text.strip().splitlines()[0] if text.strip() else ''
  # Graph error messages append node details after ' [[': drop them.
  return re.split(r'\s*\[\[', line)[0]
