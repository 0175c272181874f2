"""SavedModel of the export network: a batch signature and a one-image one.

Both signatures run the network of the frozen graph (`freeze.py`) with the
same preprocessing and weights (stored once, as constants), so each image
gets exactly the labels the `.pb` gives it:

  serving_default   images         uint8 [N, H, W, 3]: N images of one size
                    labels         int32 [N, H, W]
                    probabilities  float32 [N, H, W, C] (if exported)
  single_image      image          uint8 [1, H, W, 3]: one image, any size
                    labels         int32 [1, H, W]       (as ImageTensor:0 ->
                    probabilities  float32 [1, H, W, C]   SemanticPredictions:0)

Each image is resized as in training (when min/max_resize_value were set),
padded bottom/right to the export crop size with the backbone's mean pixel,
and its labels are brought back to H x W. The batch signature does this for
all N images at once (one network run), so they must share one size; send
images of different sizes one by one to either signature. In TensorFlow 2:

    model = tf.saved_model.load(path)
    batch = model.signatures['serving_default']
    labels = batch(images=tf.constant(uint8_images))['labels']  # [N, H, W]
    one = model.signatures['single_image']
    labels = one(image=tf.constant(uint8_image[None]))['labels']  # [1, H, W]
"""
import os

import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train import restore as restore_lib
from deeplab_train.data import image_ops
from deeplab_train.evaluation import predictor
from deeplab_train.export import freeze
from deeplab_train.model import deeplab
from deeplab_train.model import registry

SIGNATURE_KEY = 'serving_default'
IMAGE_SIGNATURE_KEY = 'single_image'
INPUT_KEY = 'images'
IMAGE_INPUT_KEY = 'image'
LABELS_KEY = 'labels'
PROBABILITIES_KEY = 'probabilities'
# Name of the batch signature's uint8 placeholder in the graph.
BATCH_INPUT_NAME = 'BatchImageTensor'
# What a SavedModel folder holds (TensorFlow's names): an export replaces
# the folder as a whole, so one holding anything else is refused.
SAVED_MODEL_ENTRIES = frozenset(('saved_model.pb', 'saved_model.pbtxt',
                                 'variables', 'assets', 'assets.extra',
                                 'fingerprint.pb'))


def foreign_entries(export_dir):
  """The entries of the existing folder `export_dir` that are not a
  SavedModel's, sorted (none for a new or empty folder, or a SavedModel)."""
  if not os.path.isdir(export_dir):
    return []
  return sorted(set(os.listdir(export_dir)) - SAVED_MODEL_ENTRIES)


def _resize_batch_to_range(images, export_options):
  """The training input's resize of [N, h, w, 3] images of one size.

  The same size computation and kernel as the frozen graph's per-image
  resize, so each image of the batch is resized exactly as it would be
  alone.
  """
  if not (export_options.min_resize_value or export_options.max_resize_value):
    return images
  shape = tf.shape(images)
  new_size = image_ops.resize_to_range_size(
      shape[1], shape[2], export_options.min_resize_value,
      export_options.max_resize_value, export_options.resize_factor)
  return tf.raw_ops.ResizeBilinear(images=images, size=new_size,
                                   align_corners=True,
                                   half_pixel_centers=False)


def build_batch_graph(model_options, export_options):
  """Builds the batch signature's graph in the default graph.

  The network's variables are created, or reused when `build_export_graph`
  already made them in this graph.

  Args:
    model_options: ModelOptions of the network (crop_size is replaced by the
      export crop size).
    export_options: ExportOptions.

  Returns:
    {'input': uint8 placeholder [N, H, W, 3], 'labels': int32 [N, H, W],
     'probabilities': float32 [N, H, W, C] or None}.
  """
  export_options.validate()
  crop_size = tuple(export_options.inference.crop_size)
  options = model_options.replace(crop_size=crop_size)
  mean_pixel = registry.mean_pixel(options.model_variant)

  images = tf.placeholder(tf.uint8, [None, None, None, 3],
                          name=BATCH_INPUT_NAME)
  original_size = tf.shape(images)[1:3]
  resized = _resize_batch_to_range(tf.cast(images, tf.float32),
                                   export_options)
  resized_size = tf.shape(resized)[1:3]
  padded = freeze.pad_to_crop(resized, crop_size, mean_pixel)
  predictions = predictor.build_predictions(padded, options,
                                            export_options.inference)
  labels = tf.cast(
      predictions[deeplab.OUTPUT_TYPE][:, :resized_size[0], :resized_size[1]],
      tf.int32)
  labels = tf.squeeze(tf.image.resize_nearest_neighbor(
      tf.expand_dims(labels, 3), original_size, align_corners=True), 3)
  probs = None
  if export_options.with_probabilities:
    raw_probs = tf.cast(predictions[deeplab.OUTPUT_TYPE + deeplab.PROB_SUFFIX],
                        tf.float32)
    probs = tf.image.resize_bilinear(
        raw_probs[:, :resized_size[0], :resized_size[1]], original_size,
        align_corners=True)
  return {'input': images, 'labels': tf.identity(labels, 'BatchPredictions'),
          'probabilities': (None if probs is None else
                            tf.identity(probs, 'BatchProbabilities'))}


def _signatures(single, batch):
  """{signature key: (inputs {key: tensor}, outputs {key: tensor})}."""
  single_outputs = {LABELS_KEY: single['outputs'][0]}
  if len(single['outputs']) > 1:
    single_outputs[PROBABILITIES_KEY] = single['outputs'][1]
  batch_outputs = {LABELS_KEY: batch['labels']}
  if batch['probabilities'] is not None:
    batch_outputs[PROBABILITIES_KEY] = batch['probabilities']
  return {SIGNATURE_KEY: ({INPUT_KEY: batch['input']}, batch_outputs),
          IMAGE_SIGNATURE_KEY: ({IMAGE_INPUT_KEY: single['input']},
                                single_outputs)}


def freeze_serving_graph(checkpoint_path, model_options, export_options):
  """Both signatures' graphs in one GraphDef, the checkpoint folded in.

  The one-image path is `freeze.build_export_graph` (built first, so its
  tensors keep the `.pb`'s names); the batch path shares its weights.

  Args:
    checkpoint_path: checkpoint prefix, or a directory (its latest).
    model_options: ModelOptions.
    export_options: ExportOptions.

  Returns:
    (frozen GraphDef, {signature key: (inputs, outputs)} with tensor names).

  Raises:
    predictor.NoCheckpointError: nothing to restore.
    predictor.CheckpointMismatchError: the checkpoint is another network.
  """
  checkpoint_path = predictor.resolve_checkpoint(checkpoint_path)
  with tf.Graph().as_default() as graph:
    single = freeze.build_export_graph(model_options, export_options)
    with tf.name_scope('batch'):
      batch = build_batch_graph(model_options, export_options)
    signatures = {
        key: tuple({k: t.name for k, t in tensors.items()}
                   for tensors in pair)
        for key, pair in _signatures(single, batch).items()}
    variables = tf.global_variables()
    predictor.check_checkpoint_matches(checkpoint_path, variables,
                                       model_options.num_classes)
    saver = tf.train.Saver(variables)
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
      node.device = ''
    outputs = sorted({name.split(':')[0] for _, outs in signatures.values()
                      for name in outs.values()})
    with tf.Session(graph=graph) as sess:
      restore_lib.restore(saver, sess, checkpoint_path)
      frozen = tf.graph_util.convert_variables_to_constants(
          sess, graph_def, outputs)
  return frozen, signatures


def write_saved_model(checkpoint_path, model_options, export_options,
                      export_dir):
  """Writes the SavedModel (tag 'serve') of a checkpoint's network.

  Args:
    checkpoint_path: checkpoint prefix, or a directory (its latest).
    model_options: ModelOptions.
    export_options: ExportOptions (the frozen graph's).
    export_dir: the SavedModel directory; replaced atomically if it exists.

  Returns:
    export_dir.

  Raises:
    predictor.NoCheckpointError, predictor.CheckpointMismatchError: bad
      checkpoint.
  """
  frozen, signatures = freeze_serving_graph(checkpoint_path, model_options,
                                            export_options)
  with atomic.writing_dir(export_dir) as tmp, \
      tf.Graph().as_default() as graph:
    tf.import_graph_def(frozen, name='')
    signature_defs = {}
    for key, (inputs, outputs) in signatures.items():
      signature_defs[key] = (
          tf.saved_model.signature_def_utils.predict_signature_def(
              {k: graph.get_tensor_by_name(n) for k, n in inputs.items()},
              {k: graph.get_tensor_by_name(n) for k, n in outputs.items()}))
    with tf.Session(graph=graph) as sess:
      builder = tf.saved_model.Builder(tmp)
      builder.add_meta_graph_and_variables(
          sess, [tf.saved_model.tag_constants.SERVING],
          signature_def_map=signature_defs, strip_default_attrs=True)
      try:
        builder.save()
      except (OSError, tf.errors.OpError) as e:
        # E.g. a full disk (TensorFlow's ResourceExhaustedError).
        raise atomic.not_written(export_dir, e) from None
  return export_dir
