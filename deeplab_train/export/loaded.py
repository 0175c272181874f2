"""Runs an exported model, whatever its format, on numpy images.

deeplab-eval and deeplab-vis score and draw what deeplab-export wrote, so a
user sees what the deployed file (float or quantized) really does:

    with loaded.open_exported(path, mean_pixel=(127.5,) * 3) as model:
      labels = model.predict(uint8_image)           # int32 [H, W]
      labels = model.predict(uint8_images)          # [N, H, W] -> [N, H, W]
      labels = model.predict([image_a, image_b])    # list of [h_i, w_i]

Formats (`kind`):

  frozen_graph  a frozen GraphDef file (ImageTensor:0 -> SemanticPredictions:0),
                run one image at a time;
  saved_model   a SavedModel folder whose 'serving_default' signature takes
                uint8 images [N, H, W, 3] and returns int32 'labels'; images
                of one size share a run (unless its batch size is fixed at 1);
  tflite        a .tflite file (export/tflite.py) of a fixed input size:
                images are resized as in training (when `resize_options` say
                so) and rounded to uint8, padded bottom/right with the
                backbone's mean pixel rounded to uint8 (128 for 127.5), and
                the labels cropped and resized back; labels next to the
                padding may differ a little from the frozen graph's.

The frozen graph and the SavedModel resize and pad inside, as deployed.
Every image gets labels at its own size. Float images (as the eval pipeline
yields them) are rounded to uint8 first. Errors are `ConfigError`s naming
the file as {open_exported.path}, which each command shows as its flag.
"""
import os

import numpy as np
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.data import preprocess
from deeplab_train.export import freeze
from deeplab_train.export import savedmodel
from deeplab_train.export import tflite

FROZEN_GRAPH = 'frozen_graph'
SAVED_MODEL = 'saved_model'
TFLITE = 'tflite'
KINDS = (FROZEN_GRAPH, SAVED_MODEL, TFLITE)

# A .tflite file is a FlatBuffer whose identifier (bytes 4 to 8) is 'TFL3'.
_TFLITE_IDENTIFIER = b'TFL3'
_SAVED_MODEL_FILES = ('saved_model.pb', 'saved_model.pbtxt')


class ExportedModelError(config.ConfigError):
  """The exported model is missing, of an unknown format, or unusable."""


def detect_format(path):
  """The kind of exported model at `path` (one of KINDS).

  Raises:
    ExportedModelError: no such file or folder, or not a known format.
  """
  if not path:
    raise ExportedModelError('no exported model given: pass '
                             '{open_exported.path} (a frozen .pb, a '
                             'SavedModel folder or a .tflite file)')
  if os.path.isdir(path):
    if any(os.path.isfile(os.path.join(path, f)) for f in _SAVED_MODEL_FILES):
      return SAVED_MODEL
    raise ExportedModelError(
        '{open_exported.path}=%s is a folder but not a SavedModel (no '
        'saved_model.pb in it)', path)
  if not os.path.isfile(path):
    raise ExportedModelError('{open_exported.path}=%s does not exist', path)
  if os.path.basename(path) in _SAVED_MODEL_FILES:
    raise ExportedModelError(
        '{open_exported.path}=%s is the graph file of a SavedModel: pass its '
        'folder %s', path, os.path.dirname(os.path.abspath(path)))
  with open(path, 'rb') as f:
    head = f.read(8)
  if head[4:8] == _TFLITE_IDENTIFIER:
    return TFLITE
  if path.lower().endswith(('.tflite', '.lite')):
    raise ExportedModelError(
        '{open_exported.path}=%s is named like a TFLite model but is not one '
        '(no TFL3 identifier); the file may be cut short', path)
  return FROZEN_GRAPH


def run_config_folder(path):
  """The folder of the deeplab_config.json describing an exported model.

  Looked for beside the file (a SavedModel: in its folder, then beside it).

  Returns:
    The folder, or None when there is no such file.
  """
  path = os.path.abspath(path)
  folders = [os.path.dirname(path)]
  if os.path.isdir(path):
    folders.insert(0, path)
  for folder in folders:
    if os.path.isfile(os.path.join(folder, config.RUN_CONFIG_FILENAME)):
      return folder
  return None


def output_folder_beside(path, prefix):
  """A command's default output folder for an exported model: PREFIX_NAME
  beside it, its extension kept (OUT/eval_frozen_pb for OUT/frozen.pb):
  model.pb and model.tflite, a float export and its quantised one compared
  before shipping, wrote their results into one folder."""
  path = os.path.abspath(path.rstrip('/'))
  name = os.path.basename(path).replace('.', '_') or 'model'
  return os.path.join(os.path.dirname(path), '%s_%s' % (prefix, name))


def open_exported(path, mean_pixel=None, resize_options=None,
                  num_threads=None, resize_given=()):
  """Opens an exported model for `predict`.

  Args:
    path: a frozen GraphDef file, a SavedModel folder or a .tflite file.
    mean_pixel: RGB padding value of the backbone, for a TFLite model whose
      file does not record it (the other formats pad inside).
    resize_options: PreprocessOptions whose min/max_resize_value and
      resize_factor a TFLite model's input is resized with (the other
      formats resize inside); None: no resize.
    num_threads: TFLite interpreter threads (None: its default).
    resize_given: the fields of `resize_options` the user gave (flags):
      only those may not contradict the resize a TFLite file records; the
      others (the training run's, which deeplab-export may have overridden)
      give way to it.

  Returns:
    An ExportedModel.

  Raises:
    ExportedModelError: missing file, unknown format, no usable signature
      or tensors.
  """
  kind = detect_format(path)
  if kind == FROZEN_GRAPH:
    return _FrozenGraphModel(path)
  if kind == SAVED_MODEL:
    return _SavedModelModel(path)
  return _TfliteModel(path, mean_pixel, resize_options, num_threads,
                      resize_given)


def as_uint8(image):
  """uint8 pixels of an image; float values are rounded and clipped."""
  image = np.asarray(image)
  if image.dtype == np.uint8:
    return image
  return np.clip(np.round(image), 0, 255).astype(np.uint8)


class ExportedModel:
  """An exported model: predict() on numpy images, then close().

  Attributes:
    path: the file or folder.
    kind: one of KINDS.
    input_size: (height, width) the model's input is fixed to, or None when
      it takes any size (up to its export crop size).
    num_classes: classes the model predicts, or None when it does not say.
    max_batch: images per run (None: any number).
  """
  kind = None

  def __init__(self, path):
    self.path = path
    self.input_size = None
    self.num_classes = None
    self.max_batch = None

  def predict(self, images, names=None):
    """Labels of one image, a batch, or a list of images.

    Args:
      images: uint8 (or float 0-255) [H, W, 3]; [N, H, W, 3]; or a list of
        [h_i, w_i, 3] of any sizes.
      names: optional image names (a list for several images), for errors.

    Returns:
      int32 [H, W]; [N, H, W]; or a list of int32 [h_i, w_i].

    Raises:
      config.ImageTooLargeError: an image does not fit the model.
      ExportedModelError: the model failed on an image.
    """
    if isinstance(images, np.ndarray) and images.ndim == 3:
      if names is not None:
        names = [names] if isinstance(names, str) else list(names)
      return self.predict([images], names=names)[0]
    if isinstance(images, np.ndarray) and images.ndim == 4:
      return np.stack(self.predict(list(images), names=names))
    images = [as_uint8(image) for image in images]
    if names is None:
      names = ['#%d' % i for i in range(len(images))]
    groups = {}
    for i, image in enumerate(images):
      if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError('images must be [H, W, 3], got shape %s (%s)'
                         % (image.shape, names[i]))
      groups.setdefault(image.shape[:2], []).append(i)
    out = [None] * len(images)
    for members in groups.values():
      step = self.max_batch or len(members)
      for start in range(0, len(members), step):
        part = members[start:start + step]
        labels = self._predict_batch(np.stack([images[i] for i in part]),
                                     [names[i] for i in part])
        for row, i in enumerate(part):
          out[i] = np.asarray(labels[row], np.int32)
    return out

  def _predict_batch(self, images, names):
    """int32 labels [n, H, W] of uint8 images [n, H, W, 3] of one size."""
    raise NotImplementedError

  def check_num_classes(self, num_classes, source):
    """Raises ExportedModelError when the model says it predicts another
    number of classes than `num_classes` (read from `source`)."""
    if self.num_classes is not None and self.num_classes != num_classes:
      raise ExportedModelError(
          'the exported model {open_exported.path}=%s predicts %d classes '
          'but %s gives %d: give the dataset it was trained on '
          '({check_num_classes.dataset_dir}=ITS_TFRECORDS, or '
          '{check_num_classes.dataset}=ITS_NAME), or put the '
          'deeplab_config.json of its training run beside it',
          self.path, self.num_classes, source, num_classes)

  def close(self):
    pass

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()


class _GraphModel(ExportedModel):
  """A frozen graph or a SavedModel run in a TF1 session."""

  def _open_session(self):
    self._graph = tf.Graph()
    self._session = tf.Session(graph=self._graph)

  def _set_io(self, input_tensor, labels_tensor, probabilities_tensor=None):
    self._input = input_tensor
    self._labels = labels_tensor
    batch = input_tensor.shape[0] if input_tensor.shape.rank else None
    self.max_batch = 1 if batch is not None and int(batch) == 1 else None
    if (probabilities_tensor is not None and
        probabilities_tensor.shape.rank and
        probabilities_tensor.shape[-1] is not None):
      self.num_classes = int(probabilities_tensor.shape[-1])

  # The export crop size (h, w) of a graph that neither checks an image
  # against it nor resizes the image first (the original's export: it pads
  # a larger image to its own size, then cuts the labels to the crop and
  # stretches them back, or fails in its decoder), else None.
  _unchecked_crop = None

  def _predict_batch(self, images, names):
    crop = self._unchecked_crop
    if crop and (images.shape[1] > crop[0] or images.shape[2] > crop[1]):
      self._too_large(images, names, (
          'larger than the export crop size %d,%d (its %s:0), which that '
          'graph does not check: it would cut the labels to the crop; '
          're-export with a larger crop_size or with max_resize_value'
          % (crop[0], crop[1], freeze.RAW_OUTPUT_NAME)))
    try:
      return self._session.run(self._labels, {self._input: images})
    except tf.errors.InvalidArgumentError as e:
      message = _first_meaningful_line(e.message)
      if 'larger than the export crop size' in e.message:
        self._too_large(images, names, message)
      raise ExportedModelError(
          'the exported model {open_exported.path}=%s failed on image %s: %s',
          self.path, ', '.join(names), message) from None

  def _too_large(self, images, names, why):
    # The path without its option: deeplab-vis logs this as it skips the
    # image, in no command's terms ('path=').
    raise config.ImageTooLargeError(
        'image %s is %dx%d (height x width), too large for the exported '
        'model %s: %s', ', '.join(names), images.shape[1], images.shape[2],
        self.path, why) from None

  def close(self):
    self._session.close()


def _first_meaningful_line(message):
  """The line of a TensorFlow error that says what went wrong: the failed
  assertion's own message when there is one."""
  lines = [line.strip() for line in message.strip().splitlines()
           if line.strip()]
  for line in lines:
    if 'larger than the export crop size' in line:
      if 'input image' in line:
        line = line[line.index('input image'):]
      # Its own message, without TensorFlow's '] [Condition x <= y ...'.
      return line.split(']', 1)[0]
  # The node's name ("Node: 'concat'", '[[{{node concat}}]]') is no reason:
  # the reason follows it (after the stack where the graph was defined).
  generic = ('Graph execution error:', 'Detected at node', 'Node:', '[[')
  after_node = [i + 1 for i, line in enumerate(lines)
                if line.startswith('Node:')]
  meaningful = [line for line in lines[after_node[0] if after_node else 0:]
                if not line.startswith(generic)]
  return (meaningful or lines or ['unknown error'])[0]


class _FrozenGraphModel(_GraphModel):
  """A frozen GraphDef with the original export's tensors."""
  kind = FROZEN_GRAPH

  def __init__(self, path):
    super().__init__(path)
    try:
      graph_def = freeze.load_frozen_graph(path)
    except Exception:  # pylint: disable=broad-except
      # protobuf's DecodeError and friends: not a GraphDef.
      graph_def = None
    names = {n.name for n in graph_def.node} if graph_def is not None else ()
    if (not names or freeze.INPUT_NAME not in names or
        freeze.OUTPUT_NAME not in names):
      raise ExportedModelError(
          '{open_exported.path}=%s is not a known exported model: not a '
          'SavedModel folder nor a .tflite file, and %s', path,
          'not a GraphDef' if graph_def is None else
          'a GraphDef without the %s:0 input and %s:0 output of '
          'deeplab-export' % (freeze.INPUT_NAME, freeze.OUTPUT_NAME))
    self._open_session()
    with self._graph.as_default():
      tf.import_graph_def(graph_def, name='')
    get = self._graph.get_tensor_by_name
    self._set_io(get(freeze.INPUT_NAME + ':0'), get(freeze.OUTPUT_NAME + ':0'),
                 get(freeze.PROB_NAME + ':0') if freeze.PROB_NAME in names
                 else None)
    raw = (get(freeze.RAW_OUTPUT_NAME + ':0').shape
           if freeze.RAW_OUTPUT_NAME in names else None)
    if (raw is not None and raw.rank == 3 and None not in raw[1:]
        and not _checks_its_crop(graph_def)
        and not any(n.name.startswith('resize_to_range/')
                    for n in graph_def.node)):
      self._unchecked_crop = (int(raw[1]), int(raw[2]))


def _checks_its_crop(graph_def):
  """Whether a frozen graph refuses an image larger than its crop with
  deeplab-export's message (`freeze.pad_to_crop`). The original's export
  does not; where it resizes the images (min/max_resize_value), its graph
  has a 'resize_to_range' scope."""
  strings = tf.string.as_datatype_enum
  return any(n.op == 'Const' and n.attr['dtype'].type == strings and any(
      b'larger than the export crop size' in v
      for v in n.attr['value'].tensor.string_val) for n in graph_def.node)


def _signature_problem(signatures):
  """Why the SavedModel's signatures are not usable, or None."""
  signature = signatures.get(savedmodel.SIGNATURE_KEY)
  if signature is None:
    return 'no %r signature' % savedmodel.SIGNATURE_KEY
  inputs = list(signature.inputs.values())
  if (len(inputs) != 1 or inputs[0].dtype != tf.uint8.as_datatype_enum or
      (not inputs[0].tensor_shape.unknown_rank and
       len(inputs[0].tensor_shape.dim) != 4)):
    return ('its %r signature does not take one uint8 input [N, H, W, 3] '
            '(inputs: %s)' % (savedmodel.SIGNATURE_KEY,
                              ', '.join(sorted(signature.inputs)) or 'none'))
  if savedmodel.LABELS_KEY not in signature.outputs:
    return ('its %r signature has no %r output (outputs: %s)'
            % (savedmodel.SIGNATURE_KEY, savedmodel.LABELS_KEY,
               ', '.join(sorted(signature.outputs)) or 'none'))
  return None


class _SavedModelModel(_GraphModel):
  """A SavedModel folder, through its 'serving_default' signature."""
  kind = SAVED_MODEL

  def __init__(self, path):
    super().__init__(path)
    self._open_session()
    try:
      with self._graph.as_default():
        meta_graph = tf.saved_model.loader.load(
            self._session, [tf.saved_model.tag_constants.SERVING], path)
    except (RuntimeError, OSError, ValueError, tf.errors.OpError) as e:
      self.close()
      first = (getattr(e, 'message', None) or str(e)).strip().splitlines()
      raise ExportedModelError(
          'cannot load the SavedModel {open_exported.path}=%s with tag '
          '"serve": %s', path, first[0] if first else type(e).__name__
      ) from None
    signatures = meta_graph.signature_def
    problem = _signature_problem(signatures)
    if problem is not None:
      self.close()
      raise ExportedModelError(
          'the SavedModel {open_exported.path}=%s has %s (signatures: %s); '
          'export it with deeplab-export --saved_model_dir', path, problem,
          ', '.join(sorted(signatures)) or 'none')
    signature = signatures[savedmodel.SIGNATURE_KEY]
    get = self._graph.get_tensor_by_name
    probs = signature.outputs.get(savedmodel.PROBABILITIES_KEY)
    self._set_io(get(list(signature.inputs.values())[0].name),
                 get(signature.outputs[savedmodel.LABELS_KEY].name),
                 get(probs.name) if probs is not None else None)


class _Resizer:
  """The training input's resize of one image, and the labels' way back.

  The frozen graph's ops (bilinear resize into the range, nearest resize
  with aligned corners back), for a model that does not resize itself.
  """

  def __init__(self, resize_options):
    self._graph = tf.Graph()
    with self._graph.as_default():
      self._image = tf.placeholder(tf.float32, [None, None, 3])
      self._resized, _ = preprocess.resize_to_range(
          self._image, None, resize_options.min_resize_value,
          resize_options.max_resize_value, resize_options.resize_factor)
      self._labels = tf.placeholder(tf.int32, [None, None, None])
      self._size = tf.placeholder(tf.int32, [2])
      self._labels_back = tf.squeeze(tf.image.resize_nearest_neighbor(
          tf.expand_dims(self._labels, 3), self._size, align_corners=True), 3)
    self._session = tf.Session(graph=self._graph)

  def image(self, image):
    """uint8 [h, w, 3] -> uint8 image resized into the range."""
    resized = self._session.run(self._resized,
                                {self._image: image.astype(np.float32)})
    return as_uint8(resized)

  def labels(self, labels, size):
    """int32 [n, h, w] -> [n, size[0], size[1]] (nearest neighbour)."""
    return self._session.run(self._labels_back,
                             {self._labels: labels, self._size: size})

  def close(self):
    self._session.close()


class _TfliteModel(ExportedModel):
  """A .tflite model of a fixed input size (export/tflite.py)."""
  kind = TFLITE

  def __init__(self, path, mean_pixel, resize_options, num_threads,
               resize_given=()):
    super().__init__(path)
    try:
      self._runner = tflite.TfliteRunner(path, num_threads=num_threads)
    except (ValueError, RuntimeError) as e:
      raise ExportedModelError('cannot load the TFLite model '
                               '{open_exported.path}=%s: %s', path,
                               str(e).strip().splitlines()[0]) from None
    self.input_size = tuple(self._runner.input_size)
    self.num_classes = self._runner.num_classes
    # The file's own record wins over the caller's guess.
    mean_pixel = self._runner.mean_pixel or mean_pixel
    if mean_pixel is None:
      raise ExportedModelError(
          'the TFLite model {open_exported.path}=%s does not record its mean '
          'pixel: give the model variant it was trained with', path)
    self._padding = np.asarray(tflite.padding_value(mean_pixel), np.uint8)
    resize_options = self._resize(path, resize_options, resize_given)
    self._resizer = None
    if resize_options is not None and (resize_options.min_resize_value or
                                       resize_options.max_resize_value):
      self._resizer = _Resizer(resize_options)

  def _resize(self, path, given, given_fields):
    """The resize of the model's input: the one the file records (the
    export's), else `given` (PreprocessOptions or None: also for a file
    exported without one, whose input a caller may shrink to fit). A value
    of `given_fields` that differs from a recorded resize is refused:
    without the record, such an evaluation skipped the export's resize and
    scored another model (exit 0)."""
    recorded = self._runner.resize
    if not recorded or not any(recorded.values()):
      return given
    given_values = {name: getattr(given, name, None)
                    for name in config.RESIZE_FIELDS if name in given_fields}
    # Only the values given count (a resize factor left out agrees).
    if any(value is not None and value != recorded.get(name)
           for name, value in given_values.items()):
      show = lambda values: ', '.join('%s=%s' % (name, values[name])
                                      for name in config.RESIZE_FIELDS
                                      if name in values)
      raise ExportedModelError(
          'the TFLite model {open_exported.path}=%s was exported with the '
          'resize %s, and the resize given contradicts it (%s): drop those '
          'flags; the recorded values are used', path, show(recorded),
          show(given_values))
    return config.PreprocessOptions(crop_size=None, **recorded)

  def _predict_batch(self, images, names):
    size = images.shape[1:3]
    if self._resizer is not None:
      images = np.stack([self._resizer.image(image) for image in images])
    h, w = images.shape[1:3]
    if h > self.input_size[0] or w > self.input_size[1]:
      raise config.ImageTooLargeError(
          'image %s is %dx%d (height x width%s), larger than the input '
          '%dx%d of the TFLite model %s: re-export with a larger crop size',
          ', '.join(names), h, w,
          ', after the resize' if self._resizer is not None else '',
          self.input_size[0], self.input_size[1], self.path)
    padded = np.empty((len(images),) + self.input_size + (3,), np.uint8)
    padded[...] = self._padding
    padded[:, :h, :w] = images
    labels = np.asarray(self._runner.predict(padded))[:, :h, :w]
    if self._resizer is not None:
      labels = self._resizer.labels(labels.astype(np.int32), size)
    return labels

  def close(self):
    if self._resizer is not None:
      self._resizer.close()
