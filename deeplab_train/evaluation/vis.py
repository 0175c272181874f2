"""deeplab-vis's library side: prediction PNGs for a split or an image folder.

For each image (named after the image, at the input image's size):

  segmentation_results/NAME_image.png       the input image
  segmentation_results/NAME_prediction.png  predictions in the palette's colours
  raw_segmentation_results/NAME.png         class ids (optional; Cityscapes
                                            train ids mapped to eval ids)
  overlay_results/NAME_overlay.png          image | prediction | blend
                                            (optional)
  legend.png                                every class: swatch, id, name
                                            (legend 'file' only)

With legend 'on_image' the prediction and overlay PNGs get a strip on their
right naming the classes present, largest pixel share first (legend.py);
the image and raw PNGs never do. Every file is written under a temp name and
renamed.
"""
import io
import logging
import os
import re

import numpy as np
from PIL import Image
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.config import errors
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import pil_images
from deeplab_train.data import build_examples
from deeplab_train.data import build_options
from deeplab_train.data import pipeline
from deeplab_train.data import preprocess
from deeplab_train.data import tfrecord
from deeplab_train.evaluation import eval_loop
from deeplab_train.evaluation import legend as legend_lib
from deeplab_train import atomic

SEMANTIC_FOLDER = 'segmentation_results'
RAW_FOLDER = 'raw_segmentation_results'
OVERLAY_FOLDER = 'overlay_results'
LEGEND_FILENAME = 'legend.png'
# The files of an image folder drawn (what Pillow reads and cameras,
# scanners and editors write).
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')

_log = logging.getLogger(__name__)


def png_bytes(array):
  """PNG encoding of uint8 [H, W] / [H, W, 3] (or uint16 [H, W]) pixels."""
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format='PNG')
  return buffer.getvalue()


def save_png(path, array):
  """Atomically writes an array as PNG."""
  return atomic.write_bytes(path, png_bytes(array))


def labels_as_png_array(labels):
  """Class ids as uint8 (uint16 when an id is above 255)."""
  dtype = np.uint8 if labels.max(initial=0) < 256 else np.uint16
  return labels.astype(dtype)


def mapped_ids(labels, table):
  """`labels` with each id below len(table) replaced by its entry; the
  others as they are (as the original's conversion of Cityscapes' train
  ids: a dataset named so with more classes raised an IndexError)."""
  table = np.asarray(table)
  inside = labels < len(table)
  return np.where(inside, table[np.where(inside, labels, 0)], labels)


def resize_nearest(labels, height, width):
  """Nearest-neighbour resize of [h, w] labels with aligned corners."""
  h, w = labels.shape
  if (h, w) == (height, width):
    return labels
  rows = _aligned_indices(h, height)
  cols = _aligned_indices(w, width)
  return labels[rows[:, None], cols[None, :]]


def _aligned_indices(size_in, size_out):
  if size_out == 1:
    return np.zeros(1, np.int64)
  scale = (size_in - 1) / (size_out - 1)
  # Halves round up, as TensorFlow's aligned nearest-neighbour resize.
  index = np.floor(np.arange(size_out) * scale + 0.5).astype(np.int64)
  return np.minimum(index, size_in - 1)


def resize_image(image, height, width):
  """uint8 RGB image resized (bilinear) to height x width."""
  if image.shape[:2] == (height, width):
    return image
  return np.asarray(Image.fromarray(image).resize((width, height),
                                                  Image.BILINEAR))


def overlay(image, colored, alpha=0.5):
  """image | colored prediction | blend, side by side (uint8 RGB)."""
  blend = ((1.0 - alpha) * image.astype(np.float32) +
           alpha * colored.astype(np.float32))
  blend = np.clip(np.round(blend), 0, 255).astype(np.uint8)
  return np.concatenate([image, colored, blend], axis=1)


# Bytes of a stem at most: its longest output name ('_prediction.png', a
# '_N' of a repeat) and that name's hidden temp ('.NAME.tmp-PID@HOST', a
# host name of up to 64 bytes) stay within the 255 bytes of a file name.
_MAX_STEM_BYTES = 150


def output_stem(name):
  """A file-name-safe stem for an image name ('dir/a.jpg' -> 'a'), cut to
  _MAX_STEM_BYTES (a long name's outputs were 'File name too long')."""
  stem = os.path.basename(str(name))
  root, ext = os.path.splitext(stem)
  if ext.lower() in IMAGE_EXTENSIONS:
    stem = root
  stem = re.sub(r'[^\w.\-]+', '_', stem).strip('.')
  stem = stem.encode('utf-8', 'surrogateescape')[:_MAX_STEM_BYTES].decode(
      'utf-8', 'ignore')
  return stem or 'image'


class _UniqueStems:
  """Gives every image a stem no other image of the run has (a, a_2,
  a_3, ...): a.png drawn as a_2 was overwritten by a_2.png's outputs. A
  stem other than the image's own is logged."""

  def __init__(self):
    self._used = set()

  def __call__(self, name):
    stem = wanted = output_stem(name)
    count = 1
    while stem in self._used:
      count += 1
      stem = '%s_%d' % (wanted, count)
    self._used.add(stem)
    if count > 1:
      _log.info('%s is drawn as %s_*.png: another image has that name',
                name, stem)
    return stem


def iterate_image_dir(image_dir, preprocess_options, mean_pixel,
                      unreadable=None):
  """Yields the image files of a folder (IMAGE_EXTENSIONS, sorted) as
  samples.

  Args:
    image_dir: folder of images.
    preprocess_options: PreprocessOptions (resize values are applied as in
      training, so the network sees what it was trained on).
    mean_pixel: unused (the predictor pads); kept so both sample sources
      take the same arguments.
    unreadable: a list to append 'PATH (REASON)' to for each file that
      cannot be read, which is then skipped with a warning; None: such a
      file raises ConfigError.

  Yields:
    {'image': float32 [h, w, 3], 'label': None, 'name': file name,
     'height', 'width': size of the file's image, 'original_image': uint8}.

  Raises:
    ConfigError: missing folder, no images, or an unreadable file.
  """
  del mean_pixel
  if not image_dir or not os.path.isdir(image_dir):
    raise config.ConfigError('{iterate_image_dir.image_dir}=%s is not a '
                             'folder', image_dir)
  entries = sorted(f for f in os.listdir(image_dir) if not f.startswith('.'))
  files = [f for f in entries if f.lower().endswith(IMAGE_EXTENSIONS)]
  if not files:
    raise config.ConfigError('no %s files in {iterate_image_dir.image_dir}=%s',
                             '/'.join(IMAGE_EXTENSIONS), image_dir)
  others = [f for f in entries if f not in files]
  if others:
    # A folder of phone photos (.heic) drew its few JPEGs without a word.
    _log.warning('%s: %d entries not drawn (only %s files are, not in '
                 'subfolders): %s', image_dir, len(others),
                 '/'.join(IMAGE_EXTENSIONS), errors.shortened(others, 10))
  turned = []
  pil_images.quiet_unnamed_warnings()
  with _Resizer(preprocess_options) as resize, _Decoder() as decode:
    for name in files:
      path = os.path.join(image_dir, name)
      try:
        # What deeplab-build-data would store of it, decoded as training
        # decodes that.
        data, _, _, _, orientation = build_examples.read_image(path)
        if orientation != 1:
          turned.append(name)
        original = decode(data)
      except (*pil_images.READ_ERRORS, tf.errors.InvalidArgumentError) as e:
        if isinstance(e, tf.errors.OpError):
          reason = pipeline.error_reason(e.message)
        elif isinstance(e, build_options.DataError):
          # DataError('%s is not a readable image (%s)', path, reason).
          reason = e.values[-1]
        else:  # the file itself (a folder named x.jpg, an I/O error)
          reason = (getattr(e, 'strerror', None) or
                    pil_images.read_error_reason(e))
        if unreadable is None:
          raise config.ConfigError('cannot read image %s: %s', path,
                                   reason) from None
        _log.warning('skipping %s: cannot read it (%s)', path, reason)
        unreadable.append('%s (%s)' % (path, reason))
        continue
      yield {'image': resize(original), 'label': None, 'name': name,
             'height': original.shape[0], 'width': original.shape[1],
             'original_image': original}
  if turned:
    # As training and deeplab-build-data read them (and warn).
    _log.warning('%s', pil_images.turned_note(
        turned, 'They are drawn as the files store the pixels, as training '
        'reads images, so their outputs are turned against the photo as '
        'viewers show it'))


class _WithSession:
  """A context manager closing its `_session` (a tf.Session, or None)."""
  _session = None

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    if self._session is not None:
      self._session.close()


class _Decoder(_WithSession):
  """Callable: the bytes deeplab-build-data stores of an image
  (data/build_examples.read_image) -> uint8 [H, W, 3], decoded by
  TensorFlow as training decodes them. Pillow's decoder gave a JPEG's
  pixels up to 12 levels apart (another DCT), and predictions that
  differed from those of the same image in a split."""

  def __call__(self, data):
    if self._session is None:
      graph = tf.Graph()
      with graph.as_default():
        self._bytes = tf.placeholder(tf.string, [])
        self._decoded = tfrecord.decode_image(self._bytes, 3)
      self._session = tf.Session(graph=graph)
    return self._session.run(self._decoded, {self._bytes: data})


class _Resizer(_WithSession):
  """Callable: uint8 image -> float32 image resized like the training input."""

  def __init__(self, preprocess_options):
    self._session = None
    if not (preprocess_options.min_resize_value or
            preprocess_options.max_resize_value):
      return
    graph = tf.Graph()
    with graph.as_default():
      self._input = tf.placeholder(tf.uint8, [None, None, 3])
      self._resized, _ = preprocess.resize_to_range(
          tf.cast(self._input, tf.float32), None,
          preprocess_options.min_resize_value,
          preprocess_options.max_resize_value,
          preprocess_options.resize_factor)
    self._session = tf.Session(graph=graph)

  def __call__(self, image):
    if self._session is None:
      return image.astype(np.float32)
    return self._session.run(self._resized, {self._input: image})


def visualize(predictor, samples, vis_logdir, colormap, vis_options,
              batch_size=1, train_id_to_eval_id=None, class_names=None,
              num_classes=None, too_large=None):
  """Predicts each sample and writes its PNGs (and legend.png, first).

  Args:
    predictor: a restored Predictor, or an open exported model
      (export/loaded.py): predict(list of images, names=...) -> labels.
    samples: iterable of sample dicts with 'image', 'name', 'height',
      'width', 'original_image'.
    vis_logdir: output folder.
    colormap: colormap name or array [N, 3].
    vis_options: VisOptions.
    batch_size: images per session run.
    train_id_to_eval_id: optional id mapping for the raw PNGs.
    class_names: one name per class id for the legend, or None ('class N').
    num_classes: the classes legend.png lists (legend 'file'); None: one
      per class name.
    too_large: a list to append 'NAME (REASON)' to (an errors.Message:
      REASON names option fields) for each image too large
      for the model's fixed input, which is then skipped with a warning;
      None: such an image raises ImageTooLargeError.

  Returns:
    The number of images written.

  Raises:
    ValueError: legend 'file' with neither num_classes nor class_names.
  """
  vis_options.validate()
  earlier = _outputs_in(vis_logdir)
  written = set()
  if vis_options.legend == 'file':
    written.add(write_legend_file(vis_logdir, colormap, class_names,
                                  num_classes))
  unique = _UniqueStems()
  limit = vis_options.max_number_of_images
  count = 0
  for batch in eval_loop.batched(samples, batch_size):
    if limit > 0:
      batch = batch[:limit - count]
    batch, labels = _predicted(predictor, batch, too_large)
    for sample, prediction in zip(batch, labels):
      written.update(_write_one(
          sample, prediction, unique(sample['name']), vis_logdir, colormap,
          vis_options, train_id_to_eval_id, class_names))
    count += len(batch)
    _log.info('visualised %d images', count)
    if 0 < limit <= count:
      break
  left = sorted(earlier - written)
  if left:
    _log.warning(
        '%d file(s) in %s were left there by an earlier run and not replaced '
        'by this one, e.g. %s: they stay beside this run\'s (of another '
        'checkpoint or other options, maybe); draw into an empty folder to '
        'keep runs apart', len(left), vis_logdir,
        ', '.join(os.path.relpath(p, vis_logdir) for p in left[:3]))
  return count


def _outputs_in(vis_logdir):
  """The paths of the PNGs in `vis_logdir`'s output folders and its
  legend.png (what a run writes there)."""
  out = set()
  for folder in (SEMANTIC_FOLDER, RAW_FOLDER, OVERLAY_FOLDER):
    path = os.path.join(vis_logdir, folder)
    if os.path.isdir(path):
      out.update(os.path.join(path, name) for name in os.listdir(path)
                 if name.endswith('.png') and not name.startswith('.'))
  legend = os.path.join(vis_logdir, LEGEND_FILENAME)
  if os.path.isfile(legend):
    out.add(legend)
  return out


def _predicted(predictor, batch, too_large):
  """(the samples of `batch` predicted, their labels): with `too_large`
  a list, a batch holding an image too large for the model is predicted
  one image at a time, skipping those (listed in `too_large`)."""
  predict = lambda samples: predictor.predict(
      [s['image'] for s in samples], names=[s['name'] for s in samples])
  try:
    return batch, predict(batch)
  except config.ImageTooLargeError:
    if too_large is None:
      raise
  kept, labels = [], []
  for sample in batch:
    try:
      labels.extend(predict([sample]))
    except config.ImageTooLargeError as e:
      _log.warning('skipping %s: %s', sample['name'], e)
      # Kept as a message of option fields: the command shows its flags.
      reason = e.template if e.values else e.template.replace('%', '%%')
      too_large.append(errors.Message('%s (' + reason + ')', sample['name'],
                                      *e.values))
      continue
    kept.append(sample)
  return kept, labels


def write_legend_file(vis_logdir, colormap, class_names, num_classes=None):
  """Writes vis_logdir/legend.png: every class's swatch, id and name.

  Args:
    vis_logdir: output folder.
    colormap: colormap name or array [N, 3].
    class_names: one name per class id, or None ('class N').
    num_classes: how many classes to list; None: len(class_names).

  Returns:
    The path written.

  Raises:
    ValueError: neither num_classes nor class_names.
  """
  if num_classes is None:
    if class_names is None:
      raise ValueError('legend.png needs num_classes or class_names')
    num_classes = len(class_names)
  entries = legend_lib.all_class_entries(num_classes, class_names, colormap)
  path = os.path.join(vis_logdir, LEGEND_FILENAME)
  save_png(path, np.asarray(legend_lib.legend_image(entries)))
  return path


def _write_one(sample, prediction, stem, vis_logdir, colormap, vis_options,
               train_id_to_eval_id, class_names=None):
  height, width = sample['height'], sample['width']
  # Back to the input's size when the input was resized for the network.
  prediction = resize_nearest(prediction, height, width)
  image = resize_image(sample['original_image'], height, width)
  colored = colormap_lib.label_to_color_image(prediction, colormap)
  decorate = lambda array: array
  if vis_options.legend == 'on_image':
    entries = legend_lib.legend_entries(prediction, class_names, colormap)
    decorate = lambda array: legend_lib.with_legend(array, entries)
  semantic = os.path.join(vis_logdir, SEMANTIC_FOLDER)
  written = [os.path.join(semantic, stem + '_image.png'),
             os.path.join(semantic, stem + '_prediction.png')]
  # An image's PNGs all or none: a stop (SIGTERM) while writing its
  # overlay left its image, prediction and raw PNGs without it.
  with atomic.together():
    save_png(written[0], image)
    save_png(written[1], decorate(colored))
    if vis_options.also_save_raw_predictions:
      raw = prediction
      if train_id_to_eval_id is not None:
        raw = mapped_ids(raw, train_id_to_eval_id)
      written.append(os.path.join(vis_logdir, RAW_FOLDER, stem + '.png'))
      save_png(written[-1], labels_as_png_array(raw))
    if vis_options.save_overlay:
      written.append(os.path.join(vis_logdir, OVERLAY_FOLDER,
                                  stem + '_overlay.png'))
      save_png(written[-1],
               decorate(overlay(image, colored, vis_options.overlay_alpha)))
  return written
