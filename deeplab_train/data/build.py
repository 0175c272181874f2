"""Converts image + label folders into sharded TFRecords and a dataset.json.

Two layouts are read:

* VOC: `image_folder/<id>.<image_format>`, `label_folder/<id>.png` and one
  `list_folder/<split>.txt` of ids per split (the original converter's
  layout and flag names).
* generic: an images folder and a masks folder matched by file stem, written
  as one named split.

Every record is validated before it is written: the image decodes, image and
label have the same size, and label ids lie in `[0, num_classes)` or equal
`ignore_label`. Label PNGs in palette ('P') or grey ('L') form are read as
ids; RGB colour labels are mapped back to ids through the colormap, or
refused. Labels are always re-encoded as single-channel PNGs of ids (readers
decode them with `decode_png(channels=1)`). Shards are written under hidden
temp names and renamed only when complete.
"""
import concurrent.futures
import dataclasses
import io
import logging
import math
import os
import threading
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from deeplab_train import atomic
from deeplab_train.config import ConfigError
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import datasets
from deeplab_train.data import tfrecord

_log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
# PIL modes whose pixel values are the class ids themselves.
_ID_MODES = ('P', 'L', '1', 'I', 'I;16', 'I;16B', 'I;16L')
_MAX_LISTED = 8


class DataError(ConfigError):
  """An input file is unusable; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  """How to convert and validate a dataset.

  Attributes:
    num_classes: label ids must be < num_classes (or the ignore label).
    ignore_label: the id of "don't care" pixels (VOC's 255 border).
    dataset_name: stored in dataset.json (the --dataset value to train with).
    class_names: one name per class, or None (built-in names are used when
      dataset_name is built in and the class count matches).
    colormap: name of the palette RGB labels are converted through, and
      written to dataset.json; None picks the dataset's own or 'pascal'.
    convert_rgb_labels: map RGB colour labels to ids (else refuse them).
    num_shards: shards per split.
    num_workers: threads converting shards in parallel (None: one per core,
      at most num_shards).
  """
  num_classes: int = 21
  ignore_label: int = 255
  dataset_name: str = 'pascal_voc_seg'
  class_names: Optional[Tuple[str, ...]] = None
  colormap: Optional[str] = None
  convert_rgb_labels: bool = True
  num_shards: int = 4
  num_workers: Optional[int] = None

  def __post_init__(self):
    if self.class_names is not None:
      object.__setattr__(self, 'class_names', tuple(self.class_names))

  def validate(self):
    """Raises ConfigError naming the flag at fault."""
    if not 1 <= self.num_classes <= 256:
      raise ConfigError('--num_classes must be in 1..256 (labels are 8-bit '
                        'PNGs), got %d' % self.num_classes)
    if not 0 <= self.ignore_label <= 255:
      raise ConfigError('--ignore_label must be in 0..255, got %d'
                        % self.ignore_label)
    if self.num_shards < 1:
      raise ConfigError('--num_shards must be >= 1, got %d' % self.num_shards)
    if self.num_workers is not None and self.num_workers < 1:
      raise ConfigError('--num_workers must be >= 1')
    if self.class_names is not None and (
        len(self.class_names) != self.num_classes):
      raise ConfigError('--class_names has %d names but --num_classes=%d'
                        % (len(self.class_names), self.num_classes))
    if self.colormap is not None and (
        self.colormap not in colormap_lib.known_colormaps()):
      raise ConfigError('--colormap=%s is unknown; use one of %s'
                        % (self.colormap,
                           ', '.join(colormap_lib.known_colormaps())))
    if not self.dataset_name:
      raise ConfigError('--dataset_name must not be empty')
    return self

  def palette(self):
    """The colormap name used for RGB labels and written to dataset.json."""
    if self.colormap:
      return self.colormap
    builtin = datasets.BUILTIN_DATASETS.get(self.dataset_name)
    return builtin.palette if builtin else 'pascal'


@dataclasses.dataclass(frozen=True)
class Entry:
  """One image/label pair to convert."""
  name: str
  image_path: str
  label_path: Optional[str]


# ---------------------------------------------------------------------------
# Listing the inputs.
# ---------------------------------------------------------------------------
def _require_dir(path, flag):
  if not path or not os.path.isdir(path):
    raise ConfigError('%s=%s is not a folder' % (flag, path))


def _few(items):
  items = list(items)
  shown = ', '.join(items[:_MAX_LISTED])
  if len(items) > _MAX_LISTED:
    shown += ', ... (%d in all)' % len(items)
  return shown


def voc_split_files(list_folder, split_name=None):
  """{split: list file} for the `<split>.txt` files of a VOC list folder.

  Args:
    list_folder: folder of `<split>.txt` id lists.
    split_name: convert only this split (None: every list).

  Raises:
    ConfigError: no lists, or the named split has no list.
  """
  _require_dir(list_folder, '--list_folder')
  found = {os.path.splitext(f)[0]: os.path.join(list_folder, f)
           for f in sorted(os.listdir(list_folder)) if f.endswith('.txt')}
  if split_name:
    if split_name not in found:
      raise ConfigError('--split_name=%s: no %s.txt in --list_folder=%s '
                        '(found: %s)' % (split_name, split_name, list_folder,
                                         _few(sorted(found)) or 'none'))
    return {split_name: found[split_name]}
  if not found:
    raise ConfigError('--list_folder=%s holds no <split>.txt id lists'
                      % list_folder)
  return found


def voc_entries(list_file, image_folder, label_folder, image_format='jpg',
                label_format='png'):
  """The entries named by one VOC id list.

  Raises:
    ConfigError: empty list, or ids whose image or label file is missing.
  """
  with open(list_file) as f:
    ids = [line.strip() for line in f if line.strip()]
  if not ids:
    raise ConfigError('%s lists no images' % list_file)
  entries, missing = [], []
  for name in ids:
    image = os.path.join(image_folder, '%s.%s' % (name, image_format))
    label = os.path.join(label_folder, '%s.%s' % (name, label_format))
    missing.extend(p for p in (image, label) if not os.path.isfile(p))
    entries.append(Entry(name, image, label))
  if missing:
    raise DataError('%s: %d listed file(s) missing: %s (check '
                    '--image_folder, --semantic_segmentation_folder and '
                    '--image_format)' % (list_file, len(missing),
                                         _few(missing)))
  return entries


def generic_entries(image_folder, masks_folder, label_format='png'):
  """Images paired with `<stem>.<label_format>` masks, sorted by stem.

  Raises:
    ConfigError: no images, an ambiguous stem, or images without a mask.
  """
  _require_dir(image_folder, '--image_folder')
  _require_dir(masks_folder, '--masks_folder')
  images = {}
  for f in sorted(os.listdir(image_folder)):
    stem, ext = os.path.splitext(f)
    if ext.lower() not in IMAGE_EXTENSIONS or f.startswith('.'):
      continue
    if stem in images:
      raise DataError('%s: two images named %r (%s and %s); keep one'
                      % (image_folder, stem, os.path.basename(images[stem]),
                         f))
    images[stem] = os.path.join(image_folder, f)
  if not images:
    raise DataError('--image_folder=%s holds no .jpg/.jpeg/.png images'
                    % image_folder)
  entries, unmatched = [], []
  for stem in sorted(images):
    mask = os.path.join(masks_folder, '%s.%s' % (stem, label_format))
    if os.path.isfile(mask):
      entries.append(Entry(stem, images[stem], mask))
    else:
      unmatched.append(os.path.basename(images[stem]))
  if unmatched:
    raise DataError('%d image(s) in %s have no <stem>.%s mask in %s: %s'
                    % (len(unmatched), image_folder, label_format,
                       masks_folder, _few(unmatched)))
  return entries


# ---------------------------------------------------------------------------
# Reading and validating one pair.
# ---------------------------------------------------------------------------
def read_image(path):
  """Reads an image file as it will be stored.

  JPEG (grey or RGB) and PNG bytes are kept as they are; anything else is
  re-encoded as an RGB PNG so the reader can decode it.

  Returns:
    (encoded bytes, format 'jpeg' or 'png', height, width).

  Raises:
    DataError: the file is not a readable image.
  """
  with open(path, 'rb') as f:
    data = f.read()
  try:
    with Image.open(io.BytesIO(data)) as im:
      im.load()
      fmt, mode, (width, height) = im.format, im.mode, im.size
      if fmt == 'JPEG' and mode in ('L', 'RGB'):
        return data, 'jpeg', height, width
      if fmt == 'PNG' and mode in ('L', 'LA', 'RGB', 'RGBA', 'P'):
        return data, 'png', height, width
      buf = io.BytesIO()
      im.convert('RGB').save(buf, format='PNG')
      return buf.getvalue(), 'png', height, width
  except (OSError, ValueError, Image.DecompressionBombError) as e:
    raise DataError('%s is not a readable image (%s)' % (path, e)) from None


def _colour_table(palette, num_classes, ignore_label):
  """{packed rgb: id} for the class ids (first wins) plus the ignore id."""
  cmap = colormap_lib.as_colormap(palette).astype(np.int64)
  packed = (cmap[:, 0] << 16) | (cmap[:, 1] << 8) | cmap[:, 2]
  table = {}
  for i in list(range(num_classes)) + [ignore_label]:
    if i < len(packed):
      table.setdefault(int(packed[i]), i)
  return table


def rgb_label_to_ids(rgb, path, options):
  """Maps an RGB colour label to ids through the options' palette.

  Args:
    rgb: uint8 [H, W, 3].
    path: the file (for messages).
    options: BuildOptions.

  Returns:
    uint8 [H, W] ids.

  Raises:
    DataError: colours that are not in the palette, listed with counts.
  """
  palette = options.palette()
  table = _colour_table(palette, options.num_classes, options.ignore_label)
  packed = ((rgb[..., 0].astype(np.int64) << 16) |
            (rgb[..., 1].astype(np.int64) << 8) | rgb[..., 2])
  colours, inverse, counts = np.unique(packed, return_inverse=True,
                                       return_counts=True)
  unknown = [(int(c), int(n)) for c, n in zip(colours, counts)
             if int(c) not in table]
  if unknown:
    shown = ', '.join('(%d,%d,%d) x%d' % (c >> 16, (c >> 8) & 255, c & 255, n)
                      for c, n in unknown[:_MAX_LISTED])
    hint = ''
    if np.all(rgb[..., 0] == rgb[..., 1]) and np.all(rgb[..., 1] == rgb[..., 2]):
      hint = ('; it looks like grey ids saved as RGB: save it as a '
              'single-channel PNG')
    raise DataError('%s: RGB label has %d colour(s) not in the %s palette '
                    'for classes 0..%d and ignore %d: %s%s'
                    % (path, len(unknown), palette if isinstance(palette, str)
                       else 'given', options.num_classes - 1,
                       options.ignore_label, shown, hint))
  ids = np.array([table[int(c)] for c in colours], dtype=np.uint8)
  return ids[inverse.reshape(-1)].reshape(packed.shape)


def read_label(path, options):
  """Reads a label file as uint8 ids [H, W] and checks the id range.

  Raises:
    DataError: unreadable file, RGB label with conversion off or unknown
      colours, or ids outside [0, num_classes) and not the ignore label.
  """
  try:
    with Image.open(path) as im:
      im.load()
      mode = im.mode
      if mode in ('RGB', 'RGBA'):
        pixels = np.asarray(im.convert('RGB'))
      else:
        pixels = np.asarray(im)
  except (OSError, ValueError, Image.DecompressionBombError) as e:
    raise DataError('%s is not a readable label image (%s)'
                    % (path, e)) from None
  if mode in _ID_MODES:
    ids = pixels.astype(np.int64)
  elif mode in ('RGB', 'RGBA'):
    if not options.convert_rgb_labels:
      raise DataError(
          '%s is an RGB colour label, not a label of class ids; save it as '
          'a palette or grey PNG of ids, or let deeplab-build-data convert '
          'it (--convert_rgb_labels --colormap=NAME)' % path)
    ids = rgb_label_to_ids(pixels, path, options)
  else:
    raise DataError('%s: unsupported label image mode %r; use a palette (P) '
                    'or grey (L) PNG of class ids' % (path, mode))
  check_label_values(ids, path, options.num_classes, options.ignore_label)
  return ids.astype(np.uint8)


def check_label_values(ids, path, num_classes, ignore_label):
  """Raises DataError naming `path` and the ids outside the valid set."""
  values = np.unique(ids)
  bad = [int(v) for v in values
         if not (0 <= v < num_classes or v == ignore_label)]
  if bad:
    raise DataError('%s: label values %s are outside [0, %d) and not the '
                    'ignore label %d; fix the labels or set --num_classes / '
                    '--ignore_label' % (path, _few(map(str, bad)),
                                        num_classes, ignore_label))


def encode_label_png(ids):
  """uint8 ids [H, W] as single-channel ('L') PNG bytes."""
  buf = io.BytesIO()
  Image.fromarray(np.asarray(ids, dtype=np.uint8), mode='L').save(
      buf, format='PNG')
  return buf.getvalue()


def make_example(entry, options):
  """Reads, validates and encodes one pair.

  Returns:
    The serialized tf.train.Example.

  Raises:
    DataError: any problem with the files, naming them.
  """
  image_data, image_format, height, width = read_image(entry.image_path)
  label_data = None
  if entry.label_path is not None:
    ids = read_label(entry.label_path, options)
    if ids.shape != (height, width):
      raise DataError('size mismatch: image %s is %dx%d (WxH) but label %s '
                      'is %dx%d' % (entry.image_path, width, height,
                                    entry.label_path, ids.shape[1],
                                    ids.shape[0]))
    label_data = encode_label_png(ids)
  example = tfrecord.encode_example(image_data, entry.name, image_format,
                                    height, width, label_data)
  return example.SerializeToString()


# ---------------------------------------------------------------------------
# Writing shards.
# ---------------------------------------------------------------------------
def _write_shard(entries, temp_path, options, stop):
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  with tf.io.TFRecordWriter(temp_path) as writer:
    for entry in entries:
      if stop.is_set():
        return
      writer.write(make_example(entry, options))


def _shard_ranges(num_items, num_shards):
  per_shard = int(math.ceil(num_items / float(num_shards)))
  return [(i * per_shard, min((i + 1) * per_shard, num_items))
          for i in range(num_shards)]


def write_split(entries, split, output_dir, options):
  """Converts `entries` into `options.num_shards` shards of `split`.

  Shards are contiguous slices of `entries` (as the original converter),
  converted in parallel threads, written under temp names and renamed once
  all are complete. Old shards of the split with another shard count are
  removed afterwards.

  Returns:
    The number of records written.

  Raises:
    DataError: the first invalid pair (nothing is renamed into place).
  """
  os.makedirs(output_dir, exist_ok=True)
  n = options.num_shards
  finals = [os.path.join(output_dir, tfrecord.shard_filename(split, i, n))
            for i in range(n)]
  # Hidden temp names: never matched by the `{split}-*` reader glob.
  temps = [atomic.temp_name(p) for p in finals]
  workers = options.num_workers or min(n, os.cpu_count() or 1)
  stop = threading.Event()
  try:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
      futures = [pool.submit(_write_shard, entries[a:b], temp, options, stop)
                 for (a, b), temp in zip(_shard_ranges(len(entries), n),
                                         temps)]
      try:
        for future in concurrent.futures.as_completed(futures):
          future.result()
      except BaseException:
        stop.set()
        raise
    for temp, final in zip(temps, finals):
      os.replace(temp, final)
  finally:
    for temp in temps:
      if os.path.exists(temp):
        os.remove(temp)
  _remove_stale_shards(output_dir, split, set(finals))
  return len(entries)


def _remove_stale_shards(output_dir, split, keep):
  for path in tfrecord.list_split_files(output_dir, split):
    parsed = tfrecord.parse_shard_filename(path)
    if parsed and parsed[0] == split and path not in keep:
      _log.info('removing stale shard %s', path)
      os.remove(path)


# ---------------------------------------------------------------------------
# dataset.json
# ---------------------------------------------------------------------------
def _check_existing(existing, options, path):
  if existing is None:
    return
  if (existing.num_classes, existing.ignore_label) != (
      options.num_classes, options.ignore_label):
    raise ConfigError(
        '%s says num_classes=%d, ignore_label=%d but this run uses '
        '--num_classes=%d --ignore_label=%d; use another --output_dir or '
        'delete the folder\'s TFRecords and dataset.json'
        % (path, existing.num_classes, existing.ignore_label,
           options.num_classes, options.ignore_label))


def dataset_info_for(options, split_sizes, existing=None):
  """The DatasetInfo to write: `existing` splits merged with `split_sizes`."""
  splits = dict(existing.splits_to_sizes) if existing else {}
  splits.update(split_sizes)
  class_names = options.class_names
  builtin = datasets.BUILTIN_DATASETS.get(options.dataset_name)
  if class_names is None and existing is not None:
    class_names = existing.class_names
  if (class_names is None and builtin is not None and
      builtin.num_classes == options.num_classes):
    class_names = builtin.class_names
  return datasets.DatasetInfo(
      name=options.dataset_name, num_classes=options.num_classes,
      ignore_label=options.ignore_label, splits_to_sizes=splits,
      class_names=class_names, palette=options.palette())


def convert(splits_to_entries, output_dir, options):
  """Writes every split's shards, then merges them into dataset.json.

  Args:
    splits_to_entries: {split: [Entry, ...]}.
    output_dir: folder of the TFRecords (created if needed).
    options: BuildOptions.

  Returns:
    The DatasetInfo written to `output_dir/dataset.json`.

  Raises:
    ConfigError / DataError: bad options or input files.
  """
  options.validate()
  json_path = os.path.join(output_dir, datasets.DATASET_JSON)
  existing = (datasets.read_dataset_json(output_dir)
              if os.path.isdir(output_dir) else None)
  _check_existing(existing, options, json_path)
  sizes = {}
  for split, entries in splits_to_entries.items():
    if not entries:
      raise ConfigError('split %r has no images' % split)
    _log.info('converting %d images of split %r into %d shards',
              len(entries), split, options.num_shards)
    sizes[split] = write_split(entries, split, output_dir, options)
  info = dataset_info_for(options, sizes, existing)
  datasets.write_dataset_json(output_dir, info)
  return info


def build_voc(image_folder, label_folder, list_folder, output_dir, options,
              split_name=None, image_format='jpg', label_format='png'):
  """Converts a VOC-layout dataset (every list, or `split_name` only).

  Returns:
    The DatasetInfo written.
  """
  _require_dir(image_folder, '--image_folder')
  _require_dir(label_folder, '--semantic_segmentation_folder')
  lists = voc_split_files(list_folder, split_name)
  splits = {split: voc_entries(path, image_folder, label_folder,
                               image_format, label_format)
            for split, path in lists.items()}
  return convert(splits, output_dir, options)


def build_generic(image_folder, masks_folder, split_name, output_dir,
                  options, label_format='png'):
  """Converts an images folder + masks folder into one split.

  Returns:
    The DatasetInfo written.
  """
  if not split_name:
    raise ConfigError('--split_name is required with --masks_folder '
                      '(e.g. --split_name=train)')
  entries = generic_entries(image_folder, masks_folder, label_format)
  return convert({split_name: entries}, output_dir, options)

