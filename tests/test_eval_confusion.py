"""Confusion matrix outputs: precision/recall, confused pairs, CSV, heatmap.

numpy and pillow only (no TensorFlow): fast.
"""
import csv

import numpy as np
from PIL import Image
import pytest

from deeplab_train.evaluation import confusion
from deeplab_train.evaluation import metrics

IGNORE = 255


def _random_counts(seed, n):
  rng = np.random.default_rng(seed)
  counts = rng.integers(0, 40, (n, n)) * (rng.random((n, n)) < 0.5)
  counts += np.diag(rng.integers(50, 500, n))
  counts[n - 1] = 0  # a class with no ground truth
  counts[:, n - 2] = 0  # a class never predicted
  return counts


@pytest.mark.parametrize('seed', [0, 1])
def test_precision_recall_iou_equal_numpy(seed):
  counts = _random_counts(seed, 7)
  m = metrics.compute_metrics(counts)
  tp = np.diag(counts).astype(float)
  with np.errstate(invalid='ignore', divide='ignore'):
    precision = tp / counts.sum(axis=0)
    recall = tp / counts.sum(axis=1)
    iou = tp / (counts.sum(axis=0) + counts.sum(axis=1) - tp)
  for got, want in ((m.per_class_precision, precision),
                    (m.per_class_recall, recall), (m.per_class_iou, iou)):
    assert [v is None for v in got] == list(np.isnan(want))
    assert [v for v in got if v is not None] == pytest.approx(
        want[~np.isnan(want)])
  assert m.per_class_recall[6] is None and m.per_class_precision[5] is None
  as_dict = m.to_dict()
  assert as_dict['per_class_precision']['0'] == pytest.approx(precision[0])
  assert as_dict['per_class_recall']['6'] is None


def test_counts_equal_numpy_bincount():
  rng = np.random.default_rng(3)
  n = 6
  cm = metrics.ConfusionMatrix(n, IGNORE)
  labels_all, preds_all = [], []
  for shape in ((17, 23), (9, 31), (40, 5)):
    labels = rng.integers(0, n, shape)
    labels[rng.random(shape) < 0.15] = IGNORE
    preds = rng.integers(0, n, shape)
    cm.update(labels, preds)
    labels_all.append(labels.ravel())
    preds_all.append(preds.ravel())
  labels, preds = np.concatenate(labels_all), np.concatenate(preds_all)
  keep = labels != IGNORE
  want = np.bincount(labels[keep] * n + preds[keep],
                     minlength=n * n).reshape(n, n)
  np.testing.assert_array_equal(cm.counts, want)
  np.testing.assert_array_equal(cm.result().counts, want)


def test_most_confused_pairs_hand_made():
  counts = np.array([[90, 10, 0, 0],    # 0 -> 1: 10% (10 px)
                     [30, 60, 10, 0],   # 1 -> 0: 30%, 1 -> 2: 10% (10 px)
                     [0, 1, 8, 1],      # 2 -> 1, 2 -> 3: 10% (1 px each)
                     [0, 0, 0, 0]])     # no ground truth: skipped
  pairs = confusion.most_confused_pairs(counts, ['a', 'b', 'c', 'd'])
  # Equal shares: more pixels first, then by class ids.
  assert [(p.ground_truth, p.predicted) for p in pairs] == [
      (1, 0), (0, 1), (1, 2), (2, 1), (2, 3)]
  assert pairs[0] == confusion.ConfusedPair(1, 0, 'b', 'a', 0.3, 30)
  assert pairs[4].share == pytest.approx(0.1) and pairs[4].pixels == 1
  unnamed = confusion.most_confused_pairs(counts, top_k=2)
  assert [(p.ground_truth_name, p.predicted_name) for p in unnamed] == [
      ('1', '0'), ('0', '1')]
  assert confusion.most_confused_pairs(np.diag([3, 4])) == []
  as_dict = metrics.compute_metrics(counts, ['a', 'b', 'c', 'd']).to_dict()
  assert as_dict['most_confused_pairs'][0] == {
      'ground_truth': 'b', 'predicted': 'a', 'ground_truth_id': 1,
      'predicted_id': 0, 'share': 0.3, 'pixels': 30}
  assert len(as_dict['most_confused_pairs']) == 5
  text = confusion.format_confused_pairs(pairs)
  assert '1 b -> 0 a: 30.0% (30 px)' in text


def test_unnamed_classes_show_their_id_once():
  """Without class names, a pair read '1 1 -> 0 0'."""
  counts = np.array([[5, 0], [3, 7]])
  text = confusion.format_confused_pairs(
      confusion.most_confused_pairs(counts))
  assert text.splitlines()[1] == '  1 -> 0: 30.0% (3 px)'


def test_table_has_precision_and_recall():
  counts = np.array([[3, 1], [0, 0]])
  table = metrics.format_table(metrics.compute_metrics(counts, ['bg', 'cat']))
  header, bg, cat = table.splitlines()[:3]
  assert header.split()[:5] == ['id', 'class', 'IoU', 'precision', 'recall']
  assert bg.split()[:5] == ['0', 'bg', '0.7500', '1.0000', '0.7500']
  assert cat.split()[:5] == ['1', 'cat', '0.0000', '0.0000', '-']


def test_csv_parses_back_with_names(tmp_path):
  counts = _random_counts(5, 4)
  names = ['bg', 'cat, black', 'dog', 'car']  # a comma is quoted
  path = confusion.write_csv(str(tmp_path / 'cm.csv'), counts, names)
  with open(path, newline='') as f:
    rows = list(csv.reader(f))
  assert rows[0][1:] == names
  assert [r[0] for r in rows[1:]] == names
  np.testing.assert_array_equal(
      np.array([[int(v) for v in r[1:]] for r in rows[1:]]), counts)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['cm.csv']  # no temp
  assert confusion.to_csv_text(np.eye(2, dtype=int)).splitlines()[0] == (
      'ground_truth\\prediction,0,1')


def _cell_colours(image, n):
  """[n, n, 3] colours of the cells, found from the grid lines."""
  pixels = np.asarray(image)
  grid = np.all(pixels == confusion.GRID_COLOUR, axis=-1)
  # Grid lines are the rows / columns with the most grid pixels.
  rows = np.flatnonzero(grid.sum(axis=1) == grid.sum(axis=1).max())
  cols = np.flatnonzero(grid.sum(axis=0) == grid.sum(axis=0).max())
  assert len(rows) == len(cols) == n + 1  # n cells between n + 1 lines
  cell = rows[1] - rows[0]
  assert cell >= 16
  ys, xs = rows[:-1] + cell // 4, cols[:-1] + cell // 4  # clear of the text
  return pixels[ys][:, xs]


def test_heatmap_is_row_normalised(tmp_path):
  names = ['bg', 'cat', 'dog', 'none']
  counts = np.array([[1000, 0, 0, 0],      # all on the diagonal, many pixels
                     [1, 3, 0, 0],         # 75% right, few pixels
                     [0, 5, 5, 0],
                     [0, 0, 0, 0]])        # no ground truth
  path = confusion.write_heatmap(str(tmp_path / 'cm.png'), counts, names,
                                 'step 7, mIoU 0.5')
  with Image.open(path) as image:
    assert image.format == 'PNG' and image.mode == 'RGB'
    assert 150 < image.width < 1000 and 150 < image.height < 1000
    colours = _cell_colours(image.convert('RGB'), len(names))
  darkness = 255 * 3 - colours.astype(int).sum(axis=-1)
  # Row 0: darkest on the diagonal, full scale although other rows are small.
  assert darkness[0, 0] == darkness.max()
  np.testing.assert_array_equal(colours[0, 0], confusion.colour_of(1.0))
  np.testing.assert_array_equal(colours[0, 1], [255, 255, 255])
  # Normalised per row: 5 of 10 px equals half the scale, whatever the row.
  np.testing.assert_array_equal(colours[2, 1], confusion.colour_of(0.5))
  assert darkness[1, 1] > darkness[2, 2] > darkness[1, 0] > 0
  # The row without ground truth is grey, not "0%".
  assert set(map(tuple, colours[3])) == {confusion.NO_GROUND_TRUTH_COLOUR}


def test_heatmap_of_151_classes_is_readable(tmp_path):
  n = 151
  names = ['class with a long name number %d' % c for c in range(n)]
  counts = _random_counts(0, n)
  path = confusion.write_heatmap(str(tmp_path / 'cm.png'), counts, names,
                                 'step 1000, mIoU 0.3')
  with Image.open(path) as image:
    # Cells of at least 16 px, names abbreviated to a bounded width.
    assert n * 16 < image.width < n * 16 + 600
    assert n * 16 < image.height < n * 16 + 600
    colours = _cell_colours(image.convert('RGB'), len(names))
  np.testing.assert_array_equal(
      colours[:n - 1], confusion.colour_of(confusion.row_normalised(
          counts)[:n - 1]))


def test_bad_shapes_and_names_are_errors():
  with pytest.raises(ValueError, match='square'):
    confusion.to_csv_text(np.zeros((2, 3)))
  with pytest.raises(ValueError, match='2 class names for 3 classes'):
    confusion.heatmap_image(np.eye(3), ['a', 'b'])
