"""TFLite export of the inference network, and a runner for .tflite files.

The .tflite model is the frozen export's network at one fixed size, made by
TensorFlow's own converter:

  ImageTensor            uint8 [1, crop_h, crop_w, 3], raw RGB values
  (cast to float; the backbone's normalisation is inside the network)
  network (single or multi-scale, flips), argmax inside
  SemanticPredictions    int32 [1, crop_h, crop_w] class ids
  SemanticProbabilities  float32 [1, crop_h, crop_w, num_classes] (optional)

Unlike the frozen graph it neither resizes nor pads: the caller gives an
image of exactly the crop size, already resized as in training
(min/max_resize_value) and padded bottom/right with the backbone's mean
pixel. uint8 cannot hold a mean pixel such as 127.5, so the padding is the
mean rounded (`padding_value`); labels next to the padding may then differ
slightly from the frozen graph's.

Quantization (`TfliteOptions.quantize`): 'none' (float32), 'float16'
(weights stored as float16), 'dynamic' (int8 weights, float activations) or
'int8' (weights and activations int8, calibrated on images of a split read
through the eval preprocessing; the uint8 input and int32 labels stay). The
file carries a small JSON metadata entry ('deeplab_train': num_classes, mean
pixel, crop size, model variant, quantize, the resize of its input) that
`TfliteRunner` reads.
"""
import dataclasses
import itertools
import json
import logging
import re
import warnings

import numpy as np
import tensorflow.compat.v1 as tf
# TensorFlow's own TFLite internals: the converter's error class and the
# .tflite flatbuffer schema (no public API has them).
from tensorflow.lite.python import convert_phase
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train import restore as restore_lib
from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_one_of
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.data import pipeline
from deeplab_train.evaluation import eval_loop
from deeplab_train.evaluation import predictor
from deeplab_train.export import freeze
from deeplab_train.model import deeplab
from deeplab_train.model import registry

QUANTIZE_MODES = config.TFLITE_QUANTIZE_MODES
METADATA_NAME = 'deeplab_train'

_log = logging.getLogger(__name__)


class UnconvertibleError(config.ConfigError):
  """TensorFlow's converter cannot turn this network into a TFLite model."""


@dataclasses.dataclass(frozen=True)
class TfliteOptions(JsonMixin):
  """How deeplab-export makes the .tflite model.

  Attributes:
    quantize: one of QUANTIZE_MODES (see the module docstring).
    calibration_split: int8 only: the split whose images calibrate the
      activation ranges.
    num_calibration_images: int8 only: how many of its images (fewer if the
      split has fewer).
  """
  quantize: str = 'none'
  calibration_split: str = 'train'
  num_calibration_images: int = 100

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_one_of('{TfliteOptions.quantize}', self.quantize, QUANTIZE_MODES)
    check(self.num_calibration_images >= 1,
          '{TfliteOptions.num_calibration_images} must be >= 1, got %d'
          % self.num_calibration_images)
    return self


def padding_value(mean_pixel):
  """The uint8 RGB value closest to a backbone's mean pixel."""
  return tuple(int(v) for v in np.clip(np.round(mean_pixel), 0, 255))


def _labels_int32(labels):
  """labels as int32, asking the argmax itself for int32 when it is the last
  op (TFLite's ARG_MAX then needs no int64 tensor nor CAST)."""
  if labels.op.type == 'ArgMax':
    values, axis = labels.op.inputs
    return tf.argmax(values, axis, output_type=tf.int32)
  return tf.cast(labels, tf.int32)


def build_tflite_graph(model_options, export_options):
  """Builds the TFLite model's graph in the default graph.

  Args:
    model_options: ModelOptions of the network (crop_size is replaced by the
      export crop size).
    export_options: ExportOptions (its crop size is the model's input size;
      the resize values are not used: the caller resizes).

  Returns:
    {'input': the uint8 ImageTensor placeholder, 'outputs': [labels (and
     probabilities)]}.
  """
  export_options.validate()
  crop_size = tuple(export_options.inference.crop_size)
  options = model_options.replace(crop_size=crop_size)
  input_image = tf.placeholder(tf.uint8, (1,) + crop_size + (3,),
                               name=freeze.INPUT_NAME)
  predictions = predictor.build_predictions(
      tf.cast(input_image, tf.float32), options, export_options.inference)
  labels = tf.identity(_labels_int32(predictions[deeplab.OUTPUT_TYPE]),
                       name=freeze.OUTPUT_NAME)
  outputs = [labels]
  if export_options.with_probabilities:
    probs = predictions[deeplab.OUTPUT_TYPE + deeplab.PROB_SUFFIX]
    outputs.append(tf.identity(tf.cast(probs, tf.float32),
                               name=freeze.PROB_NAME))
  return {'input': input_image, 'outputs': outputs}


def check_calibration_split(dataset_dir, split):
  """Raises ConfigError (naming the option) when int8 calibration would
  find no records: no dataset folder, no or only empty files of `split`."""
  if not dataset_dir:
    raise config.ConfigError(
        '{TfliteOptions.quantize}=int8 calibrates on images of the dataset: '
        'give {calibration_images.dataset_dir} (the TFRecords folder)')
  try:
    pipeline.split_files(dataset_dir, split)
  except config.ConfigError as e:
    # e's own option references stay references (shown as flags).
    template = e.template if e.values else e.template.replace('%', '%%')
    raise config.ConfigError(
        'no calibration images ({TfliteOptions.calibration_split}=%s): '
        + template,
        split, *e.values) from None


def calibration_images(dataset_dir, split, dataset_info, preprocess_options,
                       mean_pixel, crop_size, count):
  """Yields up to `count` uint8 images [1, crop_h, crop_w, 3] of a split.

  The images go through the eval preprocessing (decode, min/max resize) and
  are padded bottom/right with the mean pixel as the TFLite model expects;
  an image larger than the crop is cropped to it (calibration only needs
  representative values). Labels are not read.

  Raises:
    ConfigError: no dataset folder or no records of the split.
    eval_loop.InputDataError: a record cannot be decoded.
  """
  check_calibration_split(dataset_dir, split)
  samples = eval_loop.iterate_split(dataset_dir, split, dataset_info,
                                    preprocess_options, mean_pixel,
                                    with_label=False)
  try:
    for sample in itertools.islice(samples, count):
      image = sample['image'][:crop_size[0], :crop_size[1]]
      padded = predictor.pad_images([image], crop_size, mean_pixel)
      yield np.clip(np.round(padded), 0, 255).astype(np.uint8)
  finally:
    samples.close()


def _set_quantization(converter, quantize, calibration):
  """Configures the converter for a TfliteOptions.quantize mode.

  Returns:
    A list that counts the calibration images used (int8), else None.
  """
  if quantize == 'none':
    return None
  converter.optimizations = [tf.lite.Optimize.DEFAULT]
  if quantize == 'float16':
    converter.target_spec.supported_types = [tf.float16]
  if quantize != 'int8':
    return None
  if calibration is None:
    raise ValueError('int8 quantization needs calibration images')
  used = []

  def representative_dataset():
    for image in calibration:
      used.append(1)
      yield [image]

  converter.representative_dataset = representative_dataset
  return used


# Ops the converter refuses in some configurations, and the option that
# avoids them.
_AVOIDED_BY = {
    # The argmax upsampled as int64 labels: TFLite has no such resize.
    'ResizeNearestNeighbor': (
        'it comes from {ModelOptions.prediction_with_upsampled_logits}'
        '=false (int64 labels resized after the argmax); avoid it with '
        '{ModelOptions.prediction_with_upsampled_logits}=true (logits '
        'upsampled before the argmax, the default; it changes no variable, '
        'so it also applies to a checkpoint trained with false)'),
}
# How the converter names an op it has no kernel for.
_REFUSED_OP = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a "
                         r"flex op")


def unconvertible_error(message, quantize):
  """An UnconvertibleError naming the refused ops (from the converter's
  `message`) and the option that avoids them, when known."""
  ops = sorted(set(_REFUSED_OP.findall(message)))
  if not ops:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return UnconvertibleError(
        'the TFLite converter cannot convert this network '
        '({TfliteOptions.quantize}=%s): %s', quantize,
        ' / '.join(lines[:3])[:600] or 'no reason given')
  # The hints are fixed texts: they go into the template, so their option
  # references are shown as the command's flags.
  hints = ''.join('; ' + _AVOIDED_BY[op] for op in ops if op in _AVOIDED_BY)
  return UnconvertibleError(
      'the TFLite converter cannot convert this network '
      '({TfliteOptions.quantize}=%s): TFLite has no kernel for op(s) %s'
      + hints, quantize, ', '.join(ops))


def _frozen_graph(checkpoint_path, model_options, export_options):
  """(frozen GraphDef of the TFLite graph, input name, output names)."""
  with tf.Graph().as_default() as graph:
    tensors = build_tflite_graph(model_options, export_options)
    variables = tf.global_variables()
    predictor.check_checkpoint_matches(checkpoint_path, variables,
                                       model_options.num_classes)
    saver = tf.train.Saver(variables)
    outputs = [t.op.name for t in tensors['outputs']]
    with tf.Session(graph=graph) as sess:
      restore_lib.restore(saver, sess, checkpoint_path)
      frozen = tf.graph_util.convert_variables_to_constants(
          sess, graph.as_graph_def(), outputs)
  return frozen, tensors['input'].op.name, outputs


def convert(checkpoint_path, model_options, export_options, tflite_options,
            calibration=None):
  """The TFLite model of a checkpoint's network, as bytes.

  Args:
    checkpoint_path: checkpoint prefix, or a directory (its latest).
    model_options: ModelOptions.
    export_options: ExportOptions (crop size, scales, flips,
      probabilities).
    tflite_options: TfliteOptions.
    calibration: int8 only: iterable of uint8 [1, crop_h, crop_w, 3] images
      (see `calibration_images`).

  Returns:
    (the .tflite bytes, number of calibration images used or None).

  Raises:
    predictor.NoCheckpointError, predictor.CheckpointMismatchError: bad
      checkpoint.
    UnconvertibleError: the converter refuses the network.
    ConfigError: int8 calibration found no image.
  """
  tflite_options.validate()
  checkpoint_path = predictor.resolve_checkpoint(checkpoint_path)
  frozen, input_name, output_names = _frozen_graph(
      checkpoint_path, model_options, export_options)
  with tf.Graph().as_default() as graph:
    tf.import_graph_def(frozen, name='')
    converter = tf.lite.TFLiteConverter(
        frozen, [graph.get_tensor_by_name(input_name + ':0')],
        [graph.get_tensor_by_name(name + ':0') for name in output_names])
    used = _set_quantization(converter, tflite_options.quantize, calibration)
    try:
      model = converter.convert()
    except convert_phase.ConverterError as e:
      raise unconvertible_error(str(e), tflite_options.quantize) from None
  if used is not None and not used:
    raise config.ConfigError(
        'no calibration images ({TfliteOptions.calibration_split}=%s gave '
        'no image)', tflite_options.calibration_split)
  if used is not None:
    _log.info('int8 quantization calibrated on %d image(s) of split %r',
              len(used), tflite_options.calibration_split)
  metadata = _metadata(model_options, export_options, tflite_options)
  return add_metadata(model, metadata), (len(used) if used is not None
                                         else None)


def _metadata(model_options, export_options, tflite_options):
  """What a runner needs to know beyond the model's tensors."""
  return {'num_classes': model_options.num_classes,
          'model_variant': model_options.model_variant,
          'mean_pixel': list(registry.mean_pixel(model_options.model_variant)),
          'input_size': list(export_options.inference.crop_size),
          'quantize': tflite_options.quantize,
          'with_probabilities': export_options.with_probabilities,
          # The resize its input needs outside (the other formats resize
          # inside): without it an evaluation skipped it and scored another
          # model, exit 0.
          'resize': {name: getattr(export_options, name)
                     for name in config.RESIZE_FIELDS}}


def add_metadata(model, payload):
  """The .tflite bytes `model` with `payload` (JSON) as a metadata entry."""
  model_t = flatbuffer_utils.read_model_from_bytearray(bytearray(model))
  buffer_t = schema.BufferT()
  buffer_t.data = np.frombuffer(json.dumps(payload, sort_keys=True).encode(),
                                np.uint8)
  model_t.buffers.append(buffer_t)
  metadata_t = schema.MetadataT()
  metadata_t.name = METADATA_NAME
  metadata_t.buffer = len(model_t.buffers) - 1
  model_t.metadata = list(model_t.metadata or []) + [metadata_t]
  return bytes(flatbuffer_utils.convert_object_to_bytearray(model_t))


def read_metadata(model):
  """The payload `add_metadata` put in .tflite bytes, or None."""
  flat = schema.Model.GetRootAsModel(bytearray(model), 0)
  for i in range(flat.MetadataLength()):
    entry = flat.Metadata(i)
    if entry.Name().decode() == METADATA_NAME:
      data = flat.Buffers(entry.Buffer()).DataAsNumpy()
      return json.loads(bytes(data).decode())
  return None


def write_tflite(model, path):
  """Atomically writes .tflite bytes to `path`; returns path."""
  return atomic.write_bytes(path, model)


def _interpreter_class():
  """LiteRT's Interpreter when installed, else TensorFlow's (deprecated
  there, with a warning we silence)."""
  try:
    # pylint: disable-next=g-import-not-at-top
    from ai_edge_litert import interpreter
    return interpreter.Interpreter
  except ImportError:
    return tf.lite.Interpreter


class TfliteRunner:
  """Runs a .tflite segmentation model on uint8 images.

  The model takes uint8 [1, height, width, 3] images of exactly
  `input_size`: raw RGB values, already resized as in training and padded
  bottom/right with the backbone's mean pixel rounded to uint8 (see
  `padding_value`; `mean_pixel` holds the backbone's when the file says).
  It returns int32 class ids [1, height, width].

  Args:
    path: the .tflite file (written by deeplab-export --tflite_path).
    num_threads: interpreter threads (None: TFLite's default).

  Attributes:
    input_size: (height, width) of the images `predict` takes.
    num_classes: classes of the network, or None if the file does not say
      (no metadata and no probabilities output).
    mean_pixel: RGB mean pixel of the backbone, or None if unknown.
    metadata: the file's deeplab_train metadata dict, or None.
    resize: {'min_resize_value': .., 'max_resize_value': ..,
      'resize_factor': ..} its input needs, or None if the file does not
      say.
  """

  def __init__(self, path, num_threads=None):
    with open(path, 'rb') as f:
      model = f.read()
    with warnings.catch_warnings():
      warnings.filterwarnings('ignore', '.*tf.lite.Interpreter is deprecated')
      self._interpreter = _interpreter_class()(model_content=model,
                                               num_threads=num_threads)
    self._interpreter.allocate_tensors()
    self.metadata = read_metadata(model)
    inputs = self._interpreter.get_input_details()
    outputs = {d['name']: d for d in self._interpreter.get_output_details()}
    self._input = inputs[0]
    labels = [d for name, d in outputs.items()
              if name == freeze.OUTPUT_NAME or d['dtype'] == np.int32]
    if len(inputs) != 1 or not labels:
      raise ValueError('%s is not a segmentation model of deeplab-export: '
                       'want one image input and an int32 labels output'
                       % path)
    self._labels = outputs.get(freeze.OUTPUT_NAME, labels[0])
    self.input_size = tuple(int(v) for v in self._input['shape'][1:3])
    self._batch = int(self._input['shape'][0])
    probs = outputs.get(freeze.PROB_NAME)
    # The resize its input needs ({field: value}), or None when the file
    # does not say (exported before it was recorded).
    self.resize = None
    if self.metadata is not None:
      self.num_classes = self.metadata.get('num_classes')
      self.mean_pixel = tuple(self.metadata.get('mean_pixel') or ()) or None
      self.resize = self.metadata.get('resize')
    else:
      self.num_classes = int(probs['shape'][-1]) if probs else None
      self.mean_pixel = None

  def predict(self, images):
    """Labels of a batch of images.

    Args:
      images: uint8 array [N, height, width, 3] at `input_size`.

    Returns:
      int32 array [N, height, width].

    Raises:
      ValueError: images of another size or type.
    """
    images = np.asarray(images)
    if (images.ndim != 4 or images.shape[1:3] != self.input_size or
        images.shape[3] != 3):
      raise ValueError('TfliteRunner.predict takes images [N, %d, %d, 3], '
                       'got shape %s: pad (or resize) them to the model\'s '
                       'input size first' % (self.input_size + (images.shape,)))
    if images.dtype != np.uint8:
      raise ValueError('TfliteRunner.predict takes uint8 images, got %s'
                       % images.dtype)
    if len(images) % self._batch:
      raise ValueError('this model runs batches of %d images; got %d'
                       % (self._batch, len(images)))
    out = []
    for start in range(0, len(images), self._batch):
      self._interpreter.set_tensor(self._input['index'],
                                   images[start:start + self._batch])
      self._interpreter.invoke()
      out.append(self._interpreter.get_tensor(self._labels['index']))
    if not out:
      return np.zeros((0,) + self.input_size, np.int32)
    return np.concatenate(out).astype(np.int32, copy=False)
