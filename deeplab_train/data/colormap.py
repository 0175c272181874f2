"""Label colormaps: class id -> RGB colour, for label PNGs and visualisation.

Three named colormaps match the datasets the original DeepLab ships with:

* 'pascal': the PASCAL VOC palette, where the bits of the class id are spread
  over the high bits of R, G and B (class 1 -> (128, 0, 0), 255 -> (224, 224,
  192), the colour of VOC's "ignore" border). All 256 entries are distinct.
* 'cityscapes': the 19 train-id colours, zero padded to 256 entries.
* 'ade20k': 151 colours (0 is "other"), zero padded to 256 entries.

`get_colormap` always returns 256 entries so any uint8 label can be indexed;
`label_to_color_image` given a name still refuses ids the named dataset does
not define (e.g. 151 for ADE20K).
"""
import numpy as np

NUM_ENTRIES = 256

_CITYSCAPES = (
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156),
    (190, 153, 153), (153, 153, 153), (250, 170, 30), (220, 220, 0),
    (107, 142, 35), (152, 251, 152), (70, 130, 180), (220, 20, 60),
    (255, 0, 0), (0, 0, 142), (0, 0, 70), (0, 60, 100), (0, 80, 100),
    (0, 0, 230), (119, 11, 32))

# ADE20K benchmark colours, entry 0 first, as flat RGB triples.
_ADE20K_FLAT = (
    0, 0, 0, 120, 120, 120, 180, 120, 120, 6, 230, 230, 80, 50, 50,
    4, 200, 3, 120, 120, 80, 140, 140, 140, 204, 5, 255, 230, 230, 230,
    4, 250, 7, 224, 5, 255, 235, 255, 7, 150, 5, 61, 120, 120, 70,
    8, 255, 51, 255, 6, 82, 143, 255, 140, 204, 255, 4, 255, 51, 7,
    204, 70, 3, 0, 102, 200, 61, 230, 250, 255, 6, 51, 11, 102, 255,
    255, 7, 71, 255, 9, 224, 9, 7, 230, 220, 220, 220, 255, 9, 92,
    112, 9, 255, 8, 255, 214, 7, 255, 224, 255, 184, 6, 10, 255, 71,
    255, 41, 10, 7, 255, 255, 224, 255, 8, 102, 8, 255, 255, 61, 6,
    255, 194, 7, 255, 122, 8, 0, 255, 20, 255, 8, 41, 255, 5, 153,
    6, 51, 255, 235, 12, 255, 160, 150, 20, 0, 163, 255, 140, 140, 140,
    250, 10, 15, 20, 255, 0, 31, 255, 0, 255, 31, 0, 255, 224, 0,
    153, 255, 0, 0, 0, 255, 255, 71, 0, 0, 235, 255, 0, 173, 255,
    31, 0, 255, 11, 200, 200, 255, 82, 0, 0, 255, 245, 0, 61, 255,
    0, 255, 112, 0, 255, 133, 255, 0, 0, 255, 163, 0, 255, 102, 0,
    194, 255, 0, 0, 143, 255, 51, 255, 0, 0, 82, 255, 0, 255, 41,
    0, 255, 173, 10, 0, 255, 173, 255, 0, 0, 255, 153, 255, 92, 0,
    255, 0, 255, 255, 0, 245, 255, 0, 102, 255, 173, 0, 255, 0, 20,
    255, 184, 184, 0, 31, 255, 0, 255, 61, 0, 71, 255, 255, 0, 204,
    0, 255, 194, 0, 255, 82, 0, 10, 255, 0, 112, 255, 51, 0, 255,
    0, 194, 255, 0, 122, 255, 0, 255, 163, 255, 153, 0, 0, 255, 10,
    255, 112, 0, 143, 255, 0, 82, 0, 255, 163, 255, 0, 255, 235, 0,
    8, 184, 170, 133, 0, 255, 0, 255, 92, 184, 0, 255, 255, 0, 31,
    0, 184, 255, 0, 214, 255, 255, 0, 112, 92, 255, 0, 0, 224, 255,
    112, 224, 255, 70, 184, 160, 163, 0, 255, 153, 0, 255, 71, 255, 0,
    255, 0, 163, 255, 204, 0, 255, 0, 143, 0, 255, 235, 133, 255, 0,
    255, 0, 235, 245, 0, 255, 255, 0, 122, 255, 245, 0, 10, 190, 212,
    214, 255, 0, 0, 204, 255, 20, 0, 255, 255, 255, 0, 0, 153, 255,
    0, 41, 255, 0, 255, 204, 41, 0, 255, 41, 255, 0, 173, 0, 255,
    0, 245, 255, 71, 0, 255, 122, 0, 255, 0, 255, 184, 0, 92, 255,
    184, 255, 0, 0, 133, 255, 255, 214, 0, 25, 194, 194, 102, 255, 0,
    92, 0, 255)

# How many leading entries of each named colormap are defined colours.
DEFINED_ENTRIES = {'pascal': 256, 'cityscapes': 19, 'ade20k': 151}


def _pascal():
  """Spreads the 8 bits of each id over R, G, B, most significant first."""
  ids = np.arange(NUM_ENTRIES)
  cmap = np.zeros((NUM_ENTRIES, 3), dtype=np.int64)
  for shift in range(7, -1, -1):
    for channel in range(3):
      cmap[:, channel] |= ((ids >> channel) & 1) << shift
    ids = ids >> 3
  return cmap


def _padded(colours):
  cmap = np.zeros((NUM_ENTRIES, 3), dtype=np.int64)
  colours = np.asarray(colours, dtype=np.int64).reshape(-1, 3)
  cmap[:len(colours)] = colours
  return cmap


_BUILDERS = {
    'pascal': _pascal,
    'cityscapes': lambda: _padded(_CITYSCAPES),
    'ade20k': lambda: _padded(_ADE20K_FLAT),
}


def known_colormaps():
  return sorted(_BUILDERS)


def get_colormap(name):
  """Returns the named colormap.

  Args:
    name: 'pascal', 'cityscapes' or 'ade20k'.

  Returns:
    uint8 array [256, 3]; entry i is the RGB colour of class i (entries past
    the dataset's classes are black).

  Raises:
    ValueError: unknown name.
  """
  try:
    builder = _BUILDERS[name]
  except (KeyError, TypeError):
    raise ValueError('unknown colormap %r; known: %s'
                     % (name, ', '.join(known_colormaps()))) from None
  cmap = builder().astype(np.uint8)
  cmap.setflags(write=False)
  return cmap


def as_colormap(palette):
  """A colormap from a name or an explicit list of colours.

  Args:
    palette: a colormap name, or a sequence of [r, g, b] (one per class, as
      stored in a dataset.json), or an array [N, 3].

  Returns:
    uint8 array [max(256, N), 3]; missing entries are black.

  Raises:
    ValueError: unknown name, or colours that are not RGB triples in 0..255.
  """
  if isinstance(palette, str):
    return get_colormap(palette)
  colours = np.asarray(palette)
  if (colours.ndim != 2 or colours.shape[1] != 3 or len(colours) == 0 or
      colours.min() < 0 or colours.max() > 255):
    raise ValueError('a palette must be a list of [r, g, b] triples in '
                     '0..255, got shape %s' % (colours.shape,))
  cmap = np.zeros((max(NUM_ENTRIES, len(colours)), 3), dtype=np.uint8)
  cmap[:len(colours)] = colours
  return cmap


def label_to_color_image(labels, colormap):
  """Colours a label map.

  Args:
    labels: integer array [H, W] (or any shape) of class ids.
    colormap: a colormap name (ids past the dataset's defined colours are
      refused) or an array [N, 3] (ids must be < N).

  Returns:
    uint8 array labels.shape + (3,).

  Raises:
    ValueError: non-integer labels, or ids below 0 or beyond the colormap.
  """
  labels = np.asarray(labels)
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError('labels must be integers, got dtype %s' % labels.dtype)
  if isinstance(colormap, str):
    limit = DEFINED_ENTRIES.get(colormap, NUM_ENTRIES)
    name = colormap
    colormap = get_colormap(colormap)
  else:
    colormap = np.asarray(colormap)
    limit = len(colormap)
    name = 'the given colormap'
  if labels.size:
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= limit:
      raise ValueError('label value %d is outside %s, which defines ids '
                       '0..%d' % (low if low < 0 else high, name, limit - 1))
  return colormap[labels].astype(np.uint8)


def palette_for_png(colormap):
  """The flat [r0, g0, b0, r1, ...] list PIL's Image.putpalette expects.

  Args:
    colormap: a name or an array [N, 3]; only the first 256 entries are used.

  Returns:
    A list of 768 ints.
  """
  cmap = as_colormap(colormap)[:NUM_ENTRIES]
  return [int(v) for v in cmap.reshape(-1)]
