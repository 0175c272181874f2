"""Reads, validates and encodes one image/label pair as a tf.Example.

Every pair is validated before it is written: the image decodes, image and
label have the same size, and label ids lie in `[0, num_classes)` or equal
`ignore_label`. Label PNGs in palette ('P') or grey ('L') form are read as
ids (a palette holding the dataset palette's colours at other indices is
refused: an editor renumbered it); RGB colour labels are mapped back to ids
through the colormap, or refused; JPEG labels are refused. Labels are
always re-encoded as single-channel PNGs of ids (readers decode them with
`decode_png(channels=1)`). `encode_pair` also returns the decoded ids, for
the split's statistics.
"""
import dataclasses
import io
import logging
import re
from typing import Optional

import numpy as np
from PIL import Image

from deeplab_train.data import build_options
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import pil_images
from deeplab_train.data import tfrecord

_log = logging.getLogger(__name__)

# PIL modes whose pixel values are the class ids themselves.
_ID_MODES = ('P', 'L', '1', 'I', 'I;16', 'I;16B', 'I;16L')


# EXIF orientations that swap width and height.
_SWAPPING_ORIENTATIONS = (5, 6, 7, 8)


def read_image(path):
  """Reads an image file as it will be stored.

  JPEG (grey or RGB) and PNG bytes of 8-bit modes are kept as they are;
  of a phone's multi-picture JPEG (MPO), the first picture's bytes, which
  are a JPEG of their own (its other pictures are previews or the other
  eye); anything else (16-bit grey PNGs included, scaled to 8 bits) is
  re-encoded as an RGB PNG so the reader can decode it. The pixels are
  stored as the file holds them, whatever its EXIF orientation
  (TensorFlow's decoders, and so the original DeepLab, ignore it too).

  Returns:
    (encoded bytes, format 'jpeg' or 'png', height, width, EXIF orientation
    (1 when it has none)).

  Raises:
    DataError: the file is not a readable image.
  """
  with open(path, 'rb') as f:
    data = f.read()
  try:
    with Image.open(io.BytesIO(data)) as im:
      im.load()
      fmt, mode, (width, height) = im.format, im.mode, im.size
      note = pil_images.large_image_note(path, width, height)
      if note:
        _log.warning('%s', note)
      orientation = pil_images.orientation(im)
      if fmt == 'JPEG' and mode in ('L', 'RGB'):
        return data, 'jpeg', height, width, orientation
      first = _first_picture(im, data) if fmt == 'MPO' else None
      if first is not None and mode in ('L', 'RGB'):
        return first, 'jpeg', height, width, orientation
      if fmt == 'PNG' and mode in ('L', 'LA', 'RGB', 'RGBA', 'P'):
        return data, 'png', height, width, orientation
      buf = io.BytesIO()
      pil_images.to_rgb(im).save(buf, format='PNG')
      return buf.getvalue(), 'png', height, width, orientation
  except pil_images.READ_ERRORS as e:
    # Pillow names the buffer it read ("cannot identify image file
    # <_io.BytesIO object at 0x...>"); the path is named instead.
    reason = (_BUFFER_NAME.sub('', pil_images.read_error_reason(e))
              or type(e).__name__)
    raise build_options.DataError('%s is not a readable image (%s)', path,
                                  reason) from None


def _first_picture(im, data):
  """The bytes of an MPO file's first picture, a JPEG from the file's
  start (Pillow's MP index gives its size), or None when they do not read
  as a picture of the same size."""
  try:
    size = int(im.mpinfo[_MP_ENTRY][0]['Size'])
    with Image.open(io.BytesIO(data[:size])) as first:
      first.load()
      return data[:size] if first.size == im.size else None
  except (*pil_images.READ_ERRORS, AttributeError, KeyError, IndexError,
          TypeError, ValueError):
    return None


# The MP index's list of pictures (Pillow's mpinfo key).
_MP_ENTRY = 0xB002

_BUFFER_NAME = re.compile(r'\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>')


def _packed(rgb):
  """Colours [..., 3] as one uint32 each (0xRRGGBB), to compare or look
  up: 4 bytes a pixel (a 100-megapixel label is read in pieces of this
  size, not in int64 copies and sorts of it)."""
  rgb = np.asarray(rgb)
  packed = rgb[..., 0].astype(np.uint32) << 16
  packed |= rgb[..., 1].astype(np.uint32) << 8
  packed |= rgb[..., 2].astype(np.uint32)
  return packed


def values_present(ids):
  """The distinct values of the array `ids`, sorted: counted in 256 bins
  for uint8 (no sorted copy of a large label), else np.unique."""
  ids = np.asarray(ids)
  if ids.dtype == np.uint8:
    return np.flatnonzero(np.bincount(ids.ravel(), minlength=256))
  return np.unique(ids)


# The id of every packed colour (2**24 entries, 32 MiB), per palette,
# class count and ignore id; _UNKNOWN where the palette has no such colour.
_UNKNOWN = 0xFFFF
_lookup_tables = {}


def _lookup_table(palette, num_classes, ignore_label):
  key = (palette if isinstance(palette, str) else
         tuple(map(tuple, palette)), num_classes, ignore_label)
  table = _lookup_tables.get(key)
  if table is None:
    table = np.full(1 << 24, _UNKNOWN, np.uint16)
    for colour, i in _colour_table(palette, num_classes,
                                   ignore_label).items():
      table[colour] = i
    _lookup_tables[key] = table   # (threads may build it twice: the same)
  return table


def _rgb_text(packed):
  """'(r,g,b)' of a `_packed` colour."""
  return '(%d,%d,%d)' % (packed >> 16, (packed >> 8) & 255, packed & 255)


def _colour_table(palette, num_classes, ignore_label):
  """{packed rgb: id} for the class ids (first wins) plus the ignore id."""
  packed = _packed(colormap_lib.as_colormap(palette))
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
  packed = _packed(rgb)
  ids = _lookup_table(palette, options.num_classes,
                      options.ignore_label)[packed]
  missed = ids == _UNKNOWN
  if missed.any():
    colours, counts = np.unique(packed[missed], return_counts=True)
    raise _unknown_colours_error(
        rgb, path, palette, options,
        [(int(c), int(n)) for c, n in zip(colours, counts)])
  return ids.astype(np.uint8)


def _unknown_colours_error(rgb, path, palette, options, unknown):
  """The DataError listing `unknown` [(packed rgb, pixel count)]."""
  shown = ', '.join('%s x%d' % (_rgb_text(c), n)
                    for c, n in unknown[:build_options.MAX_LISTED])
  hint = ''
  if np.all(rgb[..., 0] == rgb[..., 1]) and np.all(rgb[..., 1] == rgb[..., 2]):
    hint = ('; it looks like grey ids saved as RGB: save it as a '
            'single-channel PNG')
  return build_options.DataError(
      '%s: RGB label has %d colour(s) not in the %s palette for classes '
      '0..%d and ignore %d: %s%s', path, len(unknown),
      palette if isinstance(palette, str) else 'given',
      options.num_classes - 1, options.ignore_label, shown, hint)


def read_label(path, options, label_map=None):
  """Reads a label file as uint8 ids [H, W] and checks the id range.

  `label_map` (256 class ids), if given, maps the values of a palette or
  grey label to class ids first.

  Raises:
    DataError: unreadable file, RGB label with conversion off or unknown
      colours, or ids outside [0, num_classes) and not the ignore label.
  """
  try:
    with Image.open(path) as im:
      im.load()
      mode, fmt = im.mode, im.format
      palette = im.getpalette() if mode == 'P' else None
      if mode in ('RGB', 'RGBA'):
        pixels = np.asarray(im.convert('RGB'))
      else:
        pixels = np.asarray(im)
  except pil_images.READ_ERRORS as e:
    raise build_options.DataError('%s is not a readable label image (%s)',
                                  path, pil_images.read_error_reason(e)
                                  ) from None
  if fmt in ('JPEG', 'MPO'):
    raise build_options.DataError(
        '%s is a JPEG file: its compression blurs the class ids into other '
        'ids along every edge; save the labels as PNG', path)
  if palette and label_map is None and options.convert_rgb_labels:
    _check_palette_order(pixels, palette, path, options)
  if mode in _ID_MODES:
    # 8-bit ids stay 1 byte a pixel; 16- and 32-bit ones are checked wide.
    ids = np.asarray(pixels, np.uint8 if pixels.dtype in (np.uint8, np.bool_)
                     else np.int64)
    if label_map is not None:
      if ids.size and not 0 <= ids.min() <= ids.max() < len(label_map):
        raise build_options.DataError(
            '%s: label values %d..%d, expected 8-bit label ids', path,
            ids.min(), ids.max())
      label_map = np.asarray(label_map, dtype=np.int64)
      ids = label_map.astype(np.uint8 if label_map.max() < 256
                             else np.int64)[ids]
  elif mode in ('RGB', 'RGBA'):
    if not options.convert_rgb_labels:
      raise build_options.DataError(
          '%s is an RGB colour label, not a label of class ids; save it as '
          'a palette or grey PNG of ids, or let deeplab-build-data convert '
          'it ({BuildOptions.convert_rgb_labels} '
          '{BuildOptions.colormap}=NAME)', path)
    ids = rgb_label_to_ids(pixels, path, options)
  else:
    raise build_options.DataError(
        '%s: unsupported label image mode %r; use a palette (P) or grey (L) '
        'PNG of class ids', path, mode)
  check_label_values(ids, path, options.num_classes, options.ignore_label)
  return np.asarray(ids, np.uint8)


def _check_palette_order(indices, palette, path, options):
  """Refuses a palette label whose used colours are the dataset palette's
  at other indices: an image editor (indexed mode, quantisation) renumbered
  its palette, and its indices are no longer the class ids the colours
  show. A palette of its own colours, or one that repeats a used colour,
  says nothing about the ids and is read as it is."""
  colours = np.asarray(palette).reshape(-1, 3)
  used = values_present(indices)
  if used.size == 0 or used.max() >= len(colours):
    return
  packed = _packed(colours[used])
  if len(np.unique(packed)) < len(used):
    return
  palette_name = options.palette()
  table = _colour_table(palette_name, options.num_classes,
                        options.ignore_label)
  if not all(int(c) in table for c in packed):
    return
  moved = [(int(i), int(c), table[int(c)]) for i, c in zip(used, packed)
           if table[int(c)] != i]
  if moved:
    raise build_options.DataError(
        '%s: its palette holds the %s palette\'s colours at other indices '
        '(%s), so its indices are not the class ids its colours show: save '
        'it with the dataset\'s palette, or as an RGB PNG, which is '
        'converted by colour; if its indices are the class ids, pass '
        '{BuildOptions.convert_rgb_labels}=false', path,
        palette_name if isinstance(palette_name, str) else 'given',
        build_options.few(
            'index %d has the colour %s of id %d' % (i, _rgb_text(c),
                                                     class_id)
            for i, c, class_id in moved))


def check_label_values(ids, path, num_classes, ignore_label):
  """Raises DataError naming `path` and the ids outside the valid set."""
  values = values_present(ids)
  bad = [int(v) for v in values
         if not (0 <= v < num_classes or v == ignore_label)]
  if bad:
    raise build_options.DataError(
        '%s: label values %s are outside [0, %d) and not the ignore label %d; '
        'fix the labels or set {BuildOptions.num_classes} / '
        '{BuildOptions.ignore_label}', path, build_options.few(map(str, bad)),
        num_classes, ignore_label)


def encode_label_png(ids):
  """uint8 ids [H, W] as single-channel ('L') PNG bytes."""
  buf = io.BytesIO()
  Image.fromarray(np.asarray(ids, dtype=np.uint8), mode='L').save(
      buf, format='PNG')
  return buf.getvalue()


@dataclasses.dataclass(frozen=True)
class EncodedPair:
  """One pair, encoded: the serialized tf.train.Example, the image size and
  the label ids it holds (None for an unlabelled image), which the
  converter counts (data/stats.py) without decoding the label again."""
  serialized: bytes
  height: int
  width: int
  label_ids: Optional[np.ndarray]
  orientation: int = 1  # the image's EXIF orientation (1: none)


def encode_pair(entry, options):
  """Reads, validates and encodes one pair.

  Returns:
    EncodedPair.

  Raises:
    DataError: any problem with the files, naming them.
  """
  image_data, image_format, height, width, orientation = read_image(
      entry.image_path)
  ids = label_data = None
  if entry.label_path is not None:
    ids = read_label(entry.label_path, options, entry.label_map)
    if ids.shape != (height, width):
      rotated = ''
      if (orientation in _SWAPPING_ORIENTATIONS and
          ids.shape == (width, height)):
        rotated = (
            '; the image carries EXIF orientation %d, which viewers apply: '
            'its label was drawn on the image as shown, turned. Apply the '
            'orientation to the image file first (e.g. `exiftran -ai` or '
            '`mogrify -auto-orient`): TensorFlow reads the pixels as the '
            'file stores them' % orientation)
      raise build_options.DataError(
          'size mismatch: image %s is %dx%d (height x width) but label %s '
          'is %dx%d%s', entry.image_path, height, width, entry.label_path,
          ids.shape[0], ids.shape[1], rotated)
    label_data = encode_label_png(ids)
  example = tfrecord.encode_example(image_data, entry.name, image_format,
                                    height, width, label_data)
  return EncodedPair(example.SerializeToString(), height, width, ids,
                     orientation)


def make_example(entry, options):
  """Reads, validates and encodes one pair.

  Returns:
    The serialized tf.train.Example.

  Raises:
    DataError: any problem with the files, naming them.
  """
  return encode_pair(entry, options).serialized
