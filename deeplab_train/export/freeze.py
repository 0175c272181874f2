"""Frozen inference GraphDef: `ImageTensor:0` -> `SemanticPredictions:0`.

The exported graph keeps the original DeepLab export's interface and
preprocessing, so serving code written for it runs unchanged:

  ImageTensor        uint8 [1, H, W, 3]
  (resize to range when min/max_resize_value are set)
  pad bottom/right to the crop size with the backbone's mean pixel
  network (single or multi-scale), labels at the crop size
  RawSemanticPredictions      float32 [1, crop_h, crop_w]
  RawSemanticProbabilities    float32 [1, crop_h, crop_w, num_classes]
  crop to the resized size, resize (nearest, align_corners) to H x W
  SemanticPredictions         int32 [1, H, W]
  SemanticProbabilities       float32 [1, H, W, num_classes] (bilinear)

Variables are replaced by constants read from the checkpoint.
"""
import os

import tensorflow.compat.v1 as tf

from deeplab_train.data import preprocess
from deeplab_train.evaluation import predictor
from deeplab_train import atomic
from deeplab_train import restore as restore_lib
from deeplab_train.model import deeplab
from deeplab_train.model import registry

INPUT_NAME = 'ImageTensor'
OUTPUT_NAME = 'SemanticPredictions'
RAW_OUTPUT_NAME = 'RawSemanticPredictions'
PROB_NAME = 'SemanticProbabilities'
RAW_PROB_NAME = 'RawSemanticProbabilities'
INFERENCE_GRAPH_NAME = 'inference_graph.pbtxt'


def _resize_to_range(image, export_options):
  """The training input's resize (min/max_resize_value), or the image."""
  if not (export_options.min_resize_value or export_options.max_resize_value):
    return image
  image, _ = preprocess.resize_to_range(
      image, min_size=export_options.min_resize_value,
      max_size=export_options.max_resize_value,
      factor=export_options.resize_factor)
  return image


def pad_to_crop(images, crop_size, mean_pixel):
  """Pads images [..., h, w, 3] bottom/right to crop_size with mean_pixel:
  `images - mean` padded with zeros, plus the mean (the frozen graph's
  arithmetic, which the SavedModel's signatures share bit for bit).

  The graph refuses (at run time, with a message) an image larger than the
  crop: the network is built for that size.
  """
  size = tf.shape(images)[-3:-1]
  fits = tf.debugging.assert_less_equal(
      size, tf.constant(crop_size, tf.int32),
      message='input image (after any resize) is larger than the export crop '
              'size %d,%d; re-export with a larger crop_size or with '
              'max_resize_value' % tuple(crop_size))
  mean = tf.constant(mean_pixel, tf.float32)
  leading = images.shape.ndims - 3
  with tf.control_dependencies([fits]):
    padding = [[0, 0]] * leading + [[0, crop_size[0] - size[0]],
                                    [0, crop_size[1] - size[1]], [0, 0]]
    padded = tf.pad(images - mean, padding) + mean
  padded.set_shape(images.shape[:leading].concatenate(
      [crop_size[0], crop_size[1], 3]))
  return padded


def _resize_label(labels, size):
  """Nearest-neighbour resize (align_corners) of labels [1, h, w]."""
  resized = tf.image.resize_nearest_neighbor(
      tf.expand_dims(labels, 3), size, align_corners=True)
  return tf.squeeze(resized, 3)


def build_export_graph(model_options, export_options):
  """Builds the exported inference graph in the default graph.

  Args:
    model_options: ModelOptions of the network (crop_size is replaced by the
      export crop size).
    export_options: ExportOptions.

  Returns:
    {'input': the ImageTensor placeholder, 'outputs': [output tensors]}.
  """
  export_options.validate()
  crop_size = tuple(export_options.inference.crop_size)
  options = model_options.replace(crop_size=crop_size)
  mean_pixel = registry.mean_pixel(options.model_variant)

  input_image = tf.placeholder(tf.uint8, [1, None, None, 3], name=INPUT_NAME)
  original_size = tf.shape(input_image)[1:3]
  image = _resize_to_range(tf.cast(input_image[0], tf.float32),
                           export_options)
  resized_size = tf.shape(image)[:2]
  image = tf.expand_dims(pad_to_crop(image, crop_size, mean_pixel), 0)

  predictions = predictor.build_predictions(image, options,
                                            export_options.inference)
  raw_labels = tf.identity(
      tf.cast(predictions[deeplab.OUTPUT_TYPE], tf.float32), RAW_OUTPUT_NAME)
  labels = tf.cast(raw_labels[:, :resized_size[0], :resized_size[1]],
                   tf.int32)
  labels = tf.identity(_resize_label(labels, original_size), OUTPUT_NAME)
  outputs = [labels]
  if export_options.with_probabilities:
    raw_probs = tf.identity(
        tf.cast(predictions[deeplab.OUTPUT_TYPE + deeplab.PROB_SUFFIX],
                tf.float32), RAW_PROB_NAME)
    probs = tf.image.resize_bilinear(
        raw_probs[:, :resized_size[0], :resized_size[1]], original_size,
        align_corners=True, name=PROB_NAME)
    outputs.append(probs)
  return {'input': input_image, 'outputs': outputs}


def freeze(checkpoint_path, model_options, export_options):
  """Builds the export graph and folds the checkpoint's values into it.

  Args:
    checkpoint_path: checkpoint prefix, or a directory (its latest).
    model_options: ModelOptions.
    export_options: ExportOptions.

  Returns:
    (frozen GraphDef, inference GraphDef with variables, checkpoint prefix).

  Raises:
    predictor.NoCheckpointError: nothing to restore.
    predictor.CheckpointMismatchError: the checkpoint is another network.
  """
  checkpoint_path = predictor.resolve_checkpoint(checkpoint_path)
  with tf.Graph().as_default() as graph:
    tensors = build_export_graph(model_options, export_options)
    variables = tf.global_variables()
    predictor.check_checkpoint_matches(checkpoint_path, variables,
                                       model_options.num_classes)
    saver = tf.train.Saver(variables)
    graph_def = graph.as_graph_def(add_shapes=True)
    for node in graph_def.node:
      node.device = ''
    with tf.Session(graph=graph) as sess:
      restore_lib.restore(saver, sess, checkpoint_path)
      frozen = tf.graph_util.convert_variables_to_constants(
          sess, graph_def, [t.op.name for t in tensors['outputs']])
  return frozen, graph_def, checkpoint_path


def write_frozen_graph(frozen_graph_def, export_path):
  """Atomically writes a frozen GraphDef to `export_path` (binary .pb),
  the same bytes for the same graph (deterministic: attribute maps in key
  order; two exports of one checkpoint had other checksums)."""
  return atomic.write_bytes(
      export_path, frozen_graph_def.SerializeToString(deterministic=True))


def write_inference_graph(graph_def, export_path):
  """Writes the unfrozen graph as text beside export_path; returns its path."""
  path = os.path.join(os.path.dirname(os.path.abspath(export_path)),
                      INFERENCE_GRAPH_NAME)
  return atomic.write_bytes(path, str(graph_def).encode('utf-8'))


def load_frozen_graph(path):
  """Reads a frozen GraphDef written by `export_frozen_graph`."""
  graph_def = tf.GraphDef()
  with tf.io.gfile.GFile(path, 'rb') as f:
    graph_def.ParseFromString(f.read())
  return graph_def


def run_frozen_graph(graph_def, image, fetch=OUTPUT_NAME):
  """Runs a frozen graph on one uint8 image [H, W, 3]; returns fetch's value."""
  with tf.Graph().as_default() as graph:
    tf.import_graph_def(graph_def, name='')
    with tf.Session(graph=graph) as sess:
      return sess.run(fetch + ':0', {INPUT_NAME + ':0': image[None]})
