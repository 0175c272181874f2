"""The training input: the data pipeline's batches as graph tensors.

A step that fails on bad data is recognised by the pipeline itself
(`pipeline.data_error_message`).
"""
import tensorflow.compat.v1 as tf

from deeplab_train.data import pipeline


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
    The input_fn for `build_training_graph`; its `record_files()` lists the
    TFRecord files it reads (to name a damaged one).
  """
  def input_fn():
    dataset = pipeline.make_dataset(
        dataset_dir, split, dataset_info, preprocess_options, batch_size,
        is_training=True, mean_pixel=mean_pixel, seed=seed)
    return tf.data.make_one_shot_iterator(dataset).get_next()
  # Which files a failed read came from is looked up only after a failure.
  input_fn.record_files = lambda: pipeline.split_files(dataset_dir, split)
  return input_fn
