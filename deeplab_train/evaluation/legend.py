"""Legends for deeplab-vis: a colour swatch and a name per class.

Pure numpy / Pillow, no TensorFlow:

  entries = legend_entries(labels, class_names, colormap)  # classes present
  entries = all_class_entries(num_classes, class_names, colormap)
  strip = legend_image(entries)             # PIL RGB image
  framed = with_legend(colored, entries)    # the array, legend to its right

A row reads 'ID NAME' and, for the classes of one prediction, the share of
its pixels ('15 person 23.4%'). Rows run top to bottom and wrap into further
columns when a height is given, so a legend beside an image keeps the image's
height whenever one row fits. Text uses Pillow's default font, or a
system font for names it cannot draw (fonts.py). `layout` gives the swatch
boxes, so tests (and callers) need not depend on how the font renders.
"""
import functools
from typing import NamedTuple, Optional, Tuple

import numpy as np
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFont

from deeplab_train.data import colormap as colormap_lib
from deeplab_train.evaluation import fonts

PAD = 4  # margin around the legend, and between columns (twice)
SWATCH = 14  # swatch side in pixels, its border included
BORDER = 1  # swatch border width
GAP = 4  # between a swatch and its text
ROW_GAP = 3  # between rows
BACKGROUND = (255, 255, 255)
BORDER_COLOUR = (64, 64, 64)
TEXT_COLOUR = (0, 0, 0)


class LegendEntry(NamedTuple):
  """One row of a legend.

  Attributes:
    class_id: the label id.
    name: the class name ('class N' when the dataset names none).
    colour: (r, g, b) of the class in the colormap.
    share: fraction of the prediction's pixels in [0, 1], or None (a legend
      of classes, not of one image).
  """
  class_id: int
  name: str
  colour: Tuple[int, int, int]
  share: Optional[float] = None


class Layout(NamedTuple):
  """Where legend_image puts things.

  Attributes:
    size: (width, height) of the legend image.
    swatches: per entry, the swatch box (left, top, right, bottom), right
      and bottom exclusive; the border is inside the box.
    texts: per entry, (x, y, text): the text's top-left corner.
  """
  size: Tuple[int, int]
  swatches: Tuple[Tuple[int, int, int, int], ...]
  texts: Tuple[Tuple[int, int, str], ...]


def class_name(class_names, class_id):
  """The name of `class_id`, or 'class N' when `class_names` has none."""
  if class_names is not None and 0 <= class_id < len(class_names):
    return str(class_names[class_id])
  return 'class %d' % class_id


def _colours(colormap, ids):
  cmap = colormap_lib.as_colormap(colormap)
  if len(ids) and max(ids) >= len(cmap):
    raise ValueError('label value %d is outside the colormap, which defines '
                     'ids 0..%d' % (max(ids), len(cmap) - 1))
  return [tuple(int(v) for v in cmap[i]) for i in ids]


def legend_entries(labels, class_names, colormap):
  """The classes present in a label map, largest pixel share first.

  Args:
    labels: integer array of class ids (e.g. a prediction [H, W]).
    class_names: one name per class id, or None.
    colormap: a colormap name or an array [N, 3].

  Returns:
    [LegendEntry] of every id present, by decreasing pixel count (ties: by
    id), each with its share of labels.size; [] for empty labels.

  Raises:
    ValueError: non-integer labels, or ids below 0 or beyond the colormap.
  """
  labels = np.asarray(labels)
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError('labels must be integers, got dtype %s' % labels.dtype)
  if labels.size == 0:
    return []
  low, high = int(labels.min()), int(labels.max())
  if low < 0:
    raise ValueError('label value %d is below 0' % low)
  _colours(colormap, [high])  # before bincount sizes an array by `high`
  counts = np.bincount(labels.ravel().astype(np.int64))
  present = np.flatnonzero(counts)
  order = present[np.lexsort((present, -counts[present]))]
  colours = _colours(colormap, [int(i) for i in order])
  return [LegendEntry(int(i), class_name(class_names, int(i)), colour,
                      float(counts[i]) / labels.size)
          for i, colour in zip(order, colours)]


def all_class_entries(num_classes, class_names, colormap):
  """Every class 0..num_classes-1 in id order, without shares.

  Args:
    num_classes: the number of class ids.
    class_names: one name per class id, or None.
    colormap: a colormap name or an array [N, 3].

  Returns:
    [LegendEntry] with share None.

  Raises:
    ValueError: num_classes below 1 or beyond the colormap.
  """
  if num_classes < 1:
    raise ValueError('a legend needs num_classes >= 1, got %d' % num_classes)
  ids = list(range(num_classes))
  return [LegendEntry(i, class_name(class_names, i), colour)
          for i, colour in zip(ids, _colours(colormap, ids))]


def entry_text(entry):
  """'ID NAME' ('class N' alone when unnamed), with ' SHARE%' when the
  entry has a share."""
  text = entry.name
  if text != class_name(None, entry.class_id):
    text = '%d %s' % (entry.class_id, text)
  if entry.share is None:
    return text
  if 0 < entry.share < 0.0005:
    return text + ' <0.1%'
  return text + ' %.1f%%' % (100.0 * entry.share)


def _drawable(text, font):
  # Pillow's bitmap fallback font (no FreeType) only has Latin-1 glyphs.
  if isinstance(font, ImageFont.FreeTypeFont):
    return text
  return text.encode('latin-1', 'replace').decode('latin-1')


def _text_width(text, font):
  return int(np.ceil(font.getbbox(text)[2])) if text else 0


@functools.lru_cache(maxsize=None)
def _text_height(font):
  return int(np.ceil(font.getbbox('Agjpqy|%')[3]))


def layout(entries, max_height=None):
  """Places each entry's swatch and text.

  Args:
    entries: LegendEntry sequence.
    max_height: wrap into a new column before the legend gets taller than
      this (a column holds at least one row); None: one column.

  Returns:
    A Layout.
  """
  font = fonts.font_for(entry_text(e) for e in entries)
  text_height = _text_height(font)
  row_height = max(SWATCH, text_height)
  pitch = row_height + ROW_GAP
  texts = [_drawable(entry_text(e), font) for e in entries]
  if max_height is None:
    rows = max(1, len(entries))
  else:
    rows = max(1, (max_height - 2 * PAD + ROW_GAP) // pitch)
  swatches, origins = [], []
  left = PAD
  for start in range(0, len(entries), rows):
    column = texts[start:start + rows]
    for row, text in enumerate(column):
      top = PAD + row * pitch
      swatch_top = top + (row_height - SWATCH) // 2
      swatches.append((left, swatch_top, left + SWATCH, swatch_top + SWATCH))
      origins.append((left + SWATCH + GAP,
                      top + (row_height - text_height) // 2, text))
    width = SWATCH + GAP + max(_text_width(t, font) for t in column)
    left += width + 2 * PAD
  used_rows = min(rows, len(entries))
  height = 2 * PAD + max(0, used_rows * pitch - ROW_GAP)
  width = max(2 * PAD, left - PAD)
  return Layout((width, height), tuple(swatches), tuple(origins))


def legend_image(entries, max_height=None):
  """Draws a legend: per entry a bordered colour swatch and its text.

  Args:
    entries: LegendEntry sequence (e.g. from legend_entries).
    max_height: wrap into columns to stay within this height (see layout).

  Returns:
    A PIL RGB image on a white background (2 * PAD square when empty).
  """
  placed = layout(entries, max_height)
  image = Image.new('RGB', placed.size, BACKGROUND)
  draw = ImageDraw.Draw(image)
  font = fonts.font_for(entry_text(e) for e in entries)
  for entry, box, (x, y, text) in zip(entries, placed.swatches, placed.texts):
    left, top, right, bottom = box
    draw.rectangle((left, top, right - 1, bottom - 1),
                   fill=tuple(entry.colour), outline=BORDER_COLOUR,
                   width=BORDER)
    draw.text((x, y), text, fill=TEXT_COLOUR, font=font)
  return image


def with_legend(image, entries):
  """The image with a legend of `entries` to its right.

  Args:
    image: uint8 RGB array [H, W, 3].
    entries: LegendEntry sequence.

  Returns:
    uint8 array [max(H, legend height), W + legend width, 3]: `image`
    unchanged at the top left, the legend (wrapped into columns to fit H
    where one row fits) at the top right, white elsewhere. With no entries,
    a copy of `image`.

  Raises:
    ValueError: image is not [H, W, 3].
  """
  image = np.asarray(image)
  if image.ndim != 3 or image.shape[2] != 3:
    raise ValueError('with_legend needs an RGB image [H, W, 3], got shape %s'
                     % (image.shape,))
  if not entries:
    return image.copy()
  height, width = image.shape[:2]
  strip = np.asarray(legend_image(entries, max_height=height))
  out = np.empty((max(height, strip.shape[0]), width + strip.shape[1], 3),
                 np.uint8)
  out[...] = BACKGROUND
  out[:height, :width] = image
  out[:strip.shape[0], width:] = strip
  return out

