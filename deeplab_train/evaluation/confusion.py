"""The confusion matrix as files and words: CSV, heatmap PNG, confused pairs.

deeplab-eval writes the matrix of its latest evaluation beside the result
JSON, as raw pixel counts (`confusion_matrix.csv`: rows = ground truth,
columns = prediction) and as a row-normalised heatmap
(`confusion_matrix.png`: each row divided by its ground-truth pixel count,
so a cell is the share of that class's pixels predicted as the column's
class), and lists the most confused pairs of classes.

Pure numpy and pillow: the heatmap is built as one array (no per-pixel
Python loop), then only the text is drawn, so 151 classes (ADE20K) take a
fraction of a second.
"""
import csv
import io
from typing import NamedTuple, Optional, Sequence

import numpy as np
from PIL import Image
from PIL import ImageDraw

from deeplab_train import atomic
from deeplab_train.evaluation import fonts

# Heatmap colours: share 0 -> white, share 1 -> dark blue.
_WHITE = np.array([255, 255, 255], np.float64)
_DARK_BLUE = np.array([8, 48, 107], np.float64)
# Rows without ground-truth pixels, and the lines between cells.
NO_GROUND_TRUTH_COLOUR = (224, 224, 224)
GRID_COLOUR = (200, 200, 200)
_TEXT = (0, 0, 0)
# Cells are large enough to read; with few classes they hold the percentage.
_SMALL_CELL = 16
_LARGE_CELL = 32
_MAX_CLASSES_WITH_TEXT = 25
_MAX_LABEL_CHARS = 24
_MARGIN = 8
_PAD = 4
_SCALE_WIDTH = 16


class ConfusedPair(NamedTuple):
  """Pixels of one ground-truth class predicted as another class.

  Attributes:
    ground_truth: id of the ground-truth class.
    predicted: id of the class its pixels were predicted as.
    ground_truth_name / predicted_name: their names.
    share: pixels / all ground-truth pixels of `ground_truth`.
    pixels: the pixel count.
  """
  ground_truth: int
  predicted: int
  ground_truth_name: str
  predicted_name: str
  share: float
  pixels: int

  def to_dict(self):
    return {'ground_truth': self.ground_truth_name,
            'predicted': self.predicted_name,
            'ground_truth_id': self.ground_truth,
            'predicted_id': self.predicted,
            'share': self.share, 'pixels': self.pixels}


def class_labels(num_classes, class_names: Optional[Sequence[str]] = None):
  """The class names, or index strings when there are none.

  Raises:
    ValueError: as many names as classes are not given.
  """
  if not class_names:
    return [str(c) for c in range(num_classes)]
  names = [str(n) for n in class_names]
  if len(names) != num_classes:
    raise ValueError('%d class names for %d classes'
                     % (len(names), num_classes))
  return names


def row_normalised(counts):
  """counts / ground-truth pixels of each row (float64; rows of 0 stay 0)."""
  counts = _square(counts).astype(np.float64)
  totals = counts.sum(axis=1, keepdims=True)
  return counts / np.maximum(totals, 1)


def most_confused_pairs(counts, class_names=None, top_k=5):
  """The off-diagonal cells with the largest share of their row.

  Args:
    counts: square confusion matrix counts[true, predicted].
    class_names: optional names, one per class.
    top_k: how many pairs at most.

  Returns:
    Up to top_k ConfusedPair, largest share first (ties: more pixels first,
    then by class ids). Classes with no ground-truth pixel and empty cells
    are skipped.
  """
  counts = _square(counts)
  n = counts.shape[0]
  names = class_labels(n, class_names)
  shares = row_normalised(counts)
  true_ids, predicted_ids = np.nonzero(counts)
  off_diagonal = true_ids != predicted_ids
  true_ids, predicted_ids = true_ids[off_diagonal], predicted_ids[off_diagonal]
  pixels = counts[true_ids, predicted_ids]
  share = shares[true_ids, predicted_ids]
  # lexsort sorts by its last key first.
  order = np.lexsort((predicted_ids, true_ids, -pixels, -share))[:top_k]
  return [ConfusedPair(int(true_ids[i]), int(predicted_ids[i]),
                       names[true_ids[i]], names[predicted_ids[i]],
                       float(share[i]), int(pixels[i])) for i in order]


def format_confused_pairs(pairs: Sequence[ConfusedPair]):
  """Lines for the terminal, e.g. '  8 cat -> 12 dog: 12.5% (340 px)';
  a class without a name shows its id once ('  1 -> 0: ...')."""
  if not pairs:
    return 'most confused classes: none (no pixel was misclassified)'
  lines = ['most confused classes (ground truth -> predicted, share of the '
           'ground-truth class):']
  for pair in pairs:
    lines.append('  %s -> %s: %.1f%% (%d px)' % (
        _id_and_name(pair.ground_truth, pair.ground_truth_name),
        _id_and_name(pair.predicted, pair.predicted_name),
        100 * pair.share, pair.pixels))
  return '\n'.join(lines)


def _id_and_name(class_id, name):
  """'8 cat', or '8' for a class named by its id alone (no class names)."""
  return str(class_id) if name == str(class_id) else '%d %s' % (class_id,
                                                                name)


def to_csv_text(counts, class_names=None):
  """The matrix as CSV: a header row and a first column of class names,
  rows = ground truth, columns = prediction, raw pixel counts."""
  counts = _square(counts)
  names = class_labels(counts.shape[0], class_names)
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator='\n')
  writer.writerow(['ground_truth\\prediction'] + names)
  for name, row in zip(names, counts.tolist()):
    writer.writerow([name] + [int(v) for v in row])
  return buffer.getvalue()


def write_csv(path, counts, class_names=None):
  """Atomically writes `to_csv_text` to path; returns path."""
  return atomic.write_bytes(path,
                            to_csv_text(counts, class_names).encode('utf-8'))


def heatmap_image(counts, class_names=None, title=None):
  """A row-normalised heatmap of the matrix, with class names on both axes.

  Rows are ground truth, columns predictions; a cell's colour goes from white
  (0% of the row's pixels) to dark blue (100%). Rows without ground-truth
  pixels are grey. With at most 25 classes the cells show the percentage.

  Args:
    counts: square confusion matrix counts[true, predicted].
    class_names: optional names, one per class.
    title: first line of the caption (e.g. the checkpoint step and mIoU).

  Returns:
    An RGB PIL image.
  """
  counts = _square(counts)
  n = counts.shape[0]
  names = class_labels(n, class_names)
  cell = _LARGE_CELL if n <= _MAX_CLASSES_WITH_TEXT else _SMALL_CELL
  shares = row_normalised(counts)
  no_ground_truth = counts.sum(axis=1) == 0
  labels = [_abbreviate('%d %s' % (c, name)) for c, name in enumerate(names)]
  caption = [title or 'confusion matrix',
             "cell: % of the row's ground-truth pixels predicted as the "
             'column' +
             ('; grey: no ground truth' if no_ground_truth.any() else '')]
  font = fonts.font_for(labels + caption)
  line = _text_height(font) + 4
  label_width = max(_text_width(font, text) for text in labels) + 2 * _PAD
  matrix = _matrix_pixels(shares, no_ground_truth, cell)
  side = matrix.shape[0]
  # Top to bottom: caption, 'prediction', column labels, matrix; left to
  # right: 'ground truth', row labels, matrix, colour scale.
  left = _MARGIN + line + label_width
  top = _MARGIN + (len(caption) + 1) * line + label_width
  scale_left = left + side + _MARGIN
  width = _MARGIN + max(
      scale_left + _SCALE_WIDTH + _PAD + _text_width(font, '100%'),
      _MARGIN + max(_text_width(font, text) for text in caption))
  height = top + max(side, _text_width(font, 'ground truth')) + _MARGIN

  canvas = np.full((height, width, 3), 255, np.uint8)
  canvas[top:top + side, left:left + side] = matrix
  canvas[top:top + side, scale_left:scale_left + _SCALE_WIDTH] = (
      _scale_pixels(side))
  image = Image.fromarray(canvas)
  draw = ImageDraw.Draw(image)
  for i, text in enumerate(caption):
    _draw_text(draw, font, text, (_MARGIN, _MARGIN + i * line), line)
  _draw_text(draw, font, 'prediction', (left, top - label_width - line),
             line, right=left + side, align='centre')
  image.paste(_rotated_text(font, 'ground truth', line),
              (_MARGIN, top + max(0, (side - _text_width(
                  font, 'ground truth')) // 2)))
  for c, text in enumerate(labels):
    _draw_text(draw, font, text, (_MARGIN + line, top + c * cell), cell,
               right=left - _PAD, align='right')
  image.paste(_column_labels(font, labels, label_width, cell),
              (left, top - label_width))
  for fraction, text in zip((0.0, 0.5, 1.0), ('0%', '50%', '100%')):
    y = top + int(round(fraction * (side - line)))
    _draw_text(draw, font, text, (scale_left + _SCALE_WIDTH + _PAD, y), line)
  if cell >= _LARGE_CELL:
    _draw_percentages(draw, font, counts, shares, (left, top), cell)
  return image


def write_heatmap(path, counts, class_names=None, title=None):
  """Atomically writes `heatmap_image` as a PNG to path; returns path."""
  image = heatmap_image(counts, class_names, title)
  return atomic.write_with(path, lambda f: image.save(f, format='PNG'))


def colour_of(share):
  """RGB uint8 of a share in [0, 1] (array or scalar) on the heatmap scale."""
  share = np.clip(np.asarray(share, np.float64), 0, 1)[..., None]
  return np.round(_WHITE + share * (_DARK_BLUE - _WHITE)).astype(np.uint8)


def _matrix_pixels(shares, no_ground_truth, cell):
  """[n*cell+1, n*cell+1, 3] cells with 1-pixel grid lines."""
  colours = colour_of(shares)
  colours[no_ground_truth] = NO_GROUND_TRUTH_COLOUR
  pixels = np.repeat(np.repeat(colours, cell, axis=0), cell, axis=1)
  side = pixels.shape[0] + 1
  out = np.empty((side, side, 3), np.uint8)
  out[:-1, :-1] = pixels
  out[::cell, :] = GRID_COLOUR
  out[:, ::cell] = GRID_COLOUR
  return out


def _scale_pixels(height):
  """A vertical colour bar, 0% at the top to 100% at the bottom."""
  shares = np.linspace(0, 1, height)
  return np.repeat(colour_of(shares)[:, None, :], _SCALE_WIDTH, axis=1)


def _column_labels(font, labels, label_width, cell):
  """Column labels as one image, read bottom to top, starting at the matrix.

  They are drawn as the rows of a strip which is then turned a quarter left:
  row c of the strip becomes column c, its left end the bottom.
  """
  strip = Image.new('RGB', (label_width, len(labels) * cell + 1),
                    (255, 255, 255))
  draw = ImageDraw.Draw(strip)
  for c, text in enumerate(labels):
    _draw_text(draw, font, text, (_PAD, c * cell), cell)
  return strip.transpose(Image.Transpose.ROTATE_90)


def _rotated_text(font, text, line):
  """One line of text turned a quarter left (read bottom to top)."""
  strip = Image.new('RGB', (_text_width(font, text) + _PAD, line),
                    (255, 255, 255))
  _draw_text(ImageDraw.Draw(strip), font, text, (0, 0), line)
  return strip.transpose(Image.Transpose.ROTATE_90)


def _draw_percentages(draw, font, counts, shares, origin, cell):
  """The rounded percentage in each non-empty cell of the matrix."""
  left, top = origin
  for true_id, predicted_id in zip(*np.nonzero(counts)):
    percent = 100 * shares[true_id, predicted_id]
    text = '<1' if percent < 0.5 else '%d' % round(percent)
    x = left + predicted_id * cell
    _draw_text(draw, font, text, (x, top + true_id * cell), cell,
               right=x + cell, align='centre',
               fill=(255, 255, 255) if percent > 50 else _TEXT)


def _draw_text(draw, font, text, corner, height, right=None, align='left',
               fill=_TEXT):
  """Draws text vertically centred in a box of `height` from `corner`.

  align 'right' or 'centre' place it against / between corner[0] and right.
  """
  x0, y0, x1, y1 = font.getbbox(text)
  x, y = corner
  if align == 'right':
    x = right - (x1 - x0)
  elif align == 'centre':
    x += (right - x - (x1 - x0)) // 2
  draw.text((x - x0, y + (height - (y1 - y0)) // 2 - y0), text, fill=fill,
            font=font)


def _abbreviate(text):
  if len(text) <= _MAX_LABEL_CHARS:
    return text
  return text[:_MAX_LABEL_CHARS - 2] + '..'


def _text_width(font, text):
  x0, _, x1, _ = font.getbbox(text)
  return x1 - x0


def _text_height(font):
  _, y0, _, y1 = font.getbbox('Ag%1')
  return y1 - y0


def _square(counts):
  counts = np.asarray(counts)
  if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
    raise ValueError('a confusion matrix is square, got shape %s'
                     % (counts.shape,))
  return counts
