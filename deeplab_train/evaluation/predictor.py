"""In-graph inference on numpy images, shared by deeplab-eval and deeplab-vis.

The network is built once on a float32 placeholder; images of any size are
padded bottom/right with the backbone's mean pixel (so the padding becomes 0
after normalisation, as in the original preprocessing) to either the fixed
crop size or the smallest size `k * output_stride + 1` that holds the image,
and the predicted labels are cropped back to each image. An image's labels
do not depend on the batch it is in. Checkpoints are
checked against the graph's variables before restoring, so a checkpoint of a
different network fails with a message instead of a TensorFlow trace.
"""
import os
import re

import numpy as np
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train import restore as restore_lib
from deeplab_train.config.inference import fitting_size
from deeplab_train.model import deeplab
from deeplab_train.model import registry
from deeplab_train.runtime import checkpoint_state


class NoCheckpointError(config.ConfigError):
  """No checkpoint where one was expected."""


class CheckpointMismatchError(config.ConfigError):
  """The checkpoint's variables do not match the network being built."""


def padded_size(sizes, inference, output_stride, names=None):
  """The size a group of images is padded to.

  Args:
    sizes: [(height, width), ...] of the images of the batch.
    inference: InferenceOptions; its crop_size is fixed, or None to fit the
      batch.
    output_stride: the network's output stride.
    names: image names, for the error message.

  Returns:
    (height, width).

  Raises:
    config.ImageTooLargeError: an image is larger than crop_size.
  """
  if inference.crop_size is None:
    return fitting_size(max(h for h, _ in sizes), max(w for _, w in sizes),
                        output_stride)
  for i, (h, w) in enumerate(sizes):
    name = _text(names[i]) if names is not None else '#%d' % i
    inference.check_holds(h, w, output_stride, 'image %s' % name)
  return tuple(inference.crop_size)


def pad_images(images, size, mean_pixel):
  """Stacks images [h, w, 3] into [N, H, W, 3] padded with mean_pixel."""
  out = np.empty((len(images), size[0], size[1], 3), np.float32)
  out[...] = np.asarray(mean_pixel, np.float32)
  for i, image in enumerate(images):
    out[i, :image.shape[0], :image.shape[1]] = image
  return out


def resolve_checkpoint(path):
  """The checkpoint prefix for a checkpoint dir (its latest) or a prefix,
  held (restore.hold) while a restore.pinning block runs.

  Raises:
    NoCheckpointError: nothing to restore at `path`.
    restore.CheckpointGoneError: it was deleted before it was held.
  """
  if not path:
    raise NoCheckpointError('no checkpoint given: pass '
                            '{resolve_checkpoint.checkpoint_dir} (a '
                            'train_logdir) or a checkpoint prefix')
  return restore_lib.hold(checkpoint_state.resolve(
      path, '{resolve_checkpoint.checkpoint_dir}',
      'train first, or point {resolve_checkpoint.checkpoint_dir} at the '
      'train_logdir', NoCheckpointError))


def checkpoint_global_step(checkpoint_path):
  """The checkpoint's global_step (from the variable or the file name)."""
  reader = restore_lib.checkpoint_reader(checkpoint_path)
  if reader.has_tensor('global_step'):
    return int(reader.get_tensor('global_step'))
  match = re.search(r'-(\d+)$', checkpoint_path)
  return int(match.group(1)) if match else None


def check_checkpoint_matches(checkpoint_path, variables, num_classes):
  """Raises CheckpointMismatchError when variables are missing, reshaped or
  left out of the network.

  Args:
    checkpoint_path: a checkpoint prefix.
    variables: the graph's tf.Variables to restore.
    num_classes: the network's class count, for the message.
  """
  missing, reshaped, unused = restore_lib.compare_shapes(checkpoint_path,
                                                         variables)
  reshaped = ['%s: checkpoint %s, network %s' % entry for entry in reshaped]
  if missing or reshaped or unused:
    details = []
    if missing:
      details.append('%d variable(s) missing, e.g. %s'
                     % (len(missing), ', '.join(missing[:3])))
    if reshaped:
      details.append('%d with another shape, e.g. %s'
                     % (len(reshaped), '; '.join(reshaped[:3])))
    if unused:
      # A part of the network the flags left out (the decoder, ASPP): its
      # predictions were scored without a word.
      details.append('%d in the checkpoint that the network does not build, '
                     'e.g. %s' % (len(unused), ', '.join(unused[:3])))
    run_config = os.path.join(os.path.dirname(checkpoint_path),
                              config.RUN_CONFIG_FILENAME)
    if os.path.isfile(run_config):
      advice = ('The model options were read from %s beside it: does that '
                'file belong to another run?')
      values = [run_config]
    else:
      advice = ('Without a %s beside the checkpoint, pass the model flags it '
                'was trained with ({ModelOptions.model_variant}, '
                '{ModelOptions.output_stride}, {ModelOptions.atrous_rates}, '
                '{ModelOptions.decoder_output_stride}, '
                '{ModelOptions.depth_multiplier}, ...) and its class count '
                '(this network has %d classes)')
      values = [config.RUN_CONFIG_FILENAME, num_classes]
    # Paths and names go in as values, never into the template.
    raise CheckpointMismatchError(
        'checkpoint %s does not match the network built from the model '
        'options (%s). ' + advice, checkpoint_path, '; '.join(details),
        *values)


def build_predictions(images, model_options, inference):
  """Label (and probability) tensors for float images [N, H, W, 3].

  Args:
    images: float32 tensor, raw pixel values, padded to the size in
      model_options.crop_size (or any size when that is None).
    model_options: ModelOptions (crop_size set as wanted).
    inference: InferenceOptions (scales, flips, image pyramid). Flipped
      images are used even with the single scale 1.0.

  Returns:
    {'semantic': int64 [N, H, W], 'semantic_prob': float [N, H, W, C]}.
  """
  if not inference.multi_scale:
    return deeplab.predict_labels(images, model_options,
                                  image_pyramid=inference.image_pyramid)
  return deeplab.predict_labels_multi_scale(
      images, model_options, eval_scales=inference.scales,
      add_flipped_images=inference.add_flipped_images)


class Predictor:
  """A session holding the inference graph; restore(), then predict().

  Args:
    model_options: ModelOptions of the network (its crop_size is replaced by
      inference.crop_size).
    inference: InferenceOptions.
    session_config: optional tf.ConfigProto.
  """

  def __init__(self, model_options, inference, session_config=None):
    self.options = model_options.replace(crop_size=inference.crop_size)
    self.inference = inference
    self.mean_pixel = registry.mean_pixel(self.options.model_variant)
    self.graph = tf.Graph()
    with self.graph.as_default():
      crop = inference.crop_size or (None, None)
      self._images = tf.placeholder(tf.float32, [None, crop[0], crop[1], 3],
                                    name='images')
      self._labels = build_predictions(self._images, self.options,
                                       inference)[deeplab.OUTPUT_TYPE]
      self._variables = tf.global_variables()
      self._saver = tf.train.Saver(self._variables)
    self._session = tf.Session(graph=self.graph, config=session_config)
    self.checkpoint_path = None

  def restore(self, checkpoint_path):
    """Loads the network's variables from a checkpoint prefix."""
    check_checkpoint_matches(checkpoint_path, self._variables,
                             self.options.num_classes)
    with self.graph.as_default():
      restore_lib.restore(self._saver, self._session, checkpoint_path)
    self.checkpoint_path = checkpoint_path

  def predict(self, images, names=None):
    """Labels of a list of images.

    Args:
      images: list of float arrays [h_i, w_i, 3] with raw 0-255 values.
      names: optional image names for error messages.

    Returns:
      list of int32 arrays [h_i, w_i].

    Raises:
      config.ImageTooLargeError: an image does not fit the fixed crop size.
    """
    sizes = [im.shape[:2] for im in images]
    names = names if names is not None else ['#%d' % i
                                             for i in range(len(images))]
    # The padding is seen by the image-level pooling, so each image gets the
    # same padding whatever batch it is in: the crop, or its own fitting
    # size (images of equal fitting size share one run).
    groups = {}
    for i, (h, w) in enumerate(sizes):
      size = padded_size([(h, w)], self.inference,
                         self.options.output_stride, [names[i]])
      groups.setdefault(size, []).append(i)
    out = [None] * len(images)
    for size, members in groups.items():
      batch = pad_images([images[i] for i in members], size, self.mean_pixel)
      labels = self._session.run(self._labels, {self._images: batch})
      for row, i in enumerate(members):
        h, w = sizes[i]
        out[i] = labels[row, :h, :w].astype(np.int32)
    return out

  def close(self):
    self._session.close()

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()


def _text(name):
  return name.decode() if isinstance(name, bytes) else str(name)
