"""Segmentation metrics from a confusion matrix: mIoU, per-class IoU,
precision and recall, accuracy, the most confused pairs of classes.

The confusion matrix is accumulated in numpy over the predictions fetched
from the session, so the same code scores in-graph inference, an exported
graph or any labels on disk. The mean IoU follows the original DeepLab's
(`tf.metrics.mean_iou`): it averages over the classes that occur in the
ground truth or in the predictions; a class predicted but absent from the
ground truth therefore counts with IoU 0. A class's precision is its
correctly labelled pixels over the pixels predicted as it, its recall the
same over its ground-truth pixels.
"""
import dataclasses
from typing import List, Optional, Sequence

import numpy as np

from deeplab_train import config
from deeplab_train.evaluation import confusion as confusion_lib

# How many confused pairs of classes the result lists.
NUM_CONFUSED_PAIRS = 5


class LabelRangeError(config.ConfigError):
  """A ground-truth value is neither a class id nor the ignore label."""


class ConfusionMatrix:
  """Accumulates counts[true_class, predicted_class] over batches.

  Args:
    num_classes: number of classes; labels and predictions are in
      [0, num_classes).
    ignore_label: ground-truth value whose pixels are not scored.
  """

  def __init__(self, num_classes, ignore_label=255):
    if num_classes < 1:
      raise ValueError('num_classes must be >= 1, got %d' % num_classes)
    self.num_classes = int(num_classes)
    self.ignore_label = ignore_label
    self.counts = np.zeros((self.num_classes, self.num_classes), np.int64)

  def update(self, labels, predictions, valid=None, name=None):
    """Adds one batch (or image) to the counts.

    Args:
      labels: integer ground truth, any shape.
      predictions: integer predictions of the same shape.
      valid: optional boolean mask of the same shape; False pixels (e.g. the
        padding added to fit the output stride) are not scored.
      name: image name(s) for error messages.

    Raises:
      ValueError: shapes differ.
      LabelRangeError: a label is outside [0, num_classes) and not the
        ignore label, or a prediction is outside [0, num_classes).
    """
    labels = np.asarray(labels)
    predictions = np.asarray(predictions)
    if labels.shape != predictions.shape:
      raise ValueError('labels %s and predictions %s differ in shape%s'
                       % (labels.shape, predictions.shape, _for(name)))
    keep = labels != self.ignore_label
    if valid is not None:
      keep &= np.asarray(valid, bool)
    labels = labels[keep].astype(np.int64)
    predictions = predictions[keep].astype(np.int64)
    n = self.num_classes
    if labels.size and (labels.min() < 0 or labels.max() >= n):
      bad = labels[(labels < 0) | (labels >= n)]
      raise LabelRangeError(
          'ground-truth value %d%s is not a class id in [0, %d) nor the '
          'ignore label %s; check the dataset and its num_classes'
          % (bad[0], _for(name), n, self.ignore_label))
    if predictions.size and (predictions.min() < 0 or predictions.max() >= n):
      raise LabelRangeError('prediction outside [0, %d)%s: the model has '
                            'more classes than the dataset' % (n, _for(name)))
    self.counts += np.bincount(n * labels + predictions,
                               minlength=n * n).reshape(n, n)

  def merge(self, other):
    """Adds the counts of another ConfusionMatrix of the same size."""
    if other.num_classes != self.num_classes:
      raise ValueError('cannot merge confusion matrices of %d and %d classes'
                       % (self.num_classes, other.num_classes))
    self.counts += other.counts

  def result(self, class_names=None):
    """The metrics of the counts so far (see `compute_metrics`)."""
    return compute_metrics(self.counts, class_names)


@dataclasses.dataclass(frozen=True)
class SegmentationMetrics:
  """Scores of a confusion matrix.

  Attributes:
    miou: mean IoU over the classes present in ground truth or predictions
      (NaN when nothing was scored).
    pixel_accuracy: correctly labelled scored pixels / scored pixels.
    per_class_iou: IoU per class; None where the class occurs in neither
      ground truth nor predictions.
    per_class_precision: true positives / pixels predicted as the class;
      None where no pixel was predicted as it.
    per_class_recall: true positives / ground-truth pixels of the class;
      None where it has no ground-truth pixel.
    class_names: names of the classes (index strings when unknown).
    absent_from_ground_truth: class ids with no ground-truth pixel.
    never_predicted: class ids no pixel was predicted as.
    num_pixels: pixels scored.
    most_confused: up to NUM_CONFUSED_PAIRS ConfusedPair, the off-diagonal
      cells with the largest share of their ground-truth class.
    counts: the confusion matrix counts[true, predicted] (int64).
  """
  miou: float
  pixel_accuracy: float
  per_class_iou: List[Optional[float]]
  per_class_precision: List[Optional[float]]
  per_class_recall: List[Optional[float]]
  class_names: List[str]
  absent_from_ground_truth: List[int]
  never_predicted: List[int]
  num_pixels: int
  most_confused: List[confusion_lib.ConfusedPair]
  counts: np.ndarray = dataclasses.field(repr=False, compare=False)

  def to_dict(self):
    return {
        'miou': _json_float(self.miou),
        'pixel_accuracy': _json_float(self.pixel_accuracy),
        'per_class_iou': self._by_name(self.per_class_iou),
        'per_class_precision': self._by_name(self.per_class_precision),
        'per_class_recall': self._by_name(self.per_class_recall),
        'classes_absent_from_ground_truth': [
            self.class_names[c] for c in self.absent_from_ground_truth],
        'classes_never_predicted': [
            self.class_names[c] for c in self.never_predicted],
        'num_pixels': self.num_pixels,
        'most_confused_pairs': [p.to_dict() for p in self.most_confused],
    }

  def _by_name(self, values):
    return dict(zip(self.class_names, values))


def compute_metrics(counts, class_names: Optional[Sequence[str]] = None):
  """Scores a confusion matrix counts[true, predicted].

  Args:
    counts: square integer array.
    class_names: optional names, one per class.

  Returns:
    SegmentationMetrics.
  """
  raw = np.asarray(counts).astype(np.int64)
  counts = raw.astype(np.float64)
  names = confusion_lib.class_labels(counts.shape[0], class_names)
  true_positives = np.diag(counts)
  gt_pixels = counts.sum(axis=1)
  predicted_pixels = counts.sum(axis=0)
  union = gt_pixels + predicted_pixels - true_positives
  present = union > 0
  iou = np.where(present, true_positives / np.maximum(union, 1), np.nan)
  total = counts.sum()
  return SegmentationMetrics(
      miou=float(np.mean(iou[present])) if present.any() else float('nan'),
      pixel_accuracy=(float(true_positives.sum() / total) if total
                      else float('nan')),
      per_class_iou=_optional(iou, present),
      per_class_precision=_ratios(true_positives, predicted_pixels),
      per_class_recall=_ratios(true_positives, gt_pixels),
      class_names=names,
      absent_from_ground_truth=[int(c) for c in np.flatnonzero(gt_pixels == 0)],
      never_predicted=[int(c) for c in np.flatnonzero(predicted_pixels == 0)],
      num_pixels=int(total),
      most_confused=confusion_lib.most_confused_pairs(raw, names,
                                                      NUM_CONFUSED_PAIRS),
      counts=raw)


def _ratios(numerators, denominators):
  """numerators / denominators, None where the denominator is 0."""
  defined = denominators > 0
  return _optional(numerators / np.maximum(denominators, 1), defined)


def _optional(values, defined):
  return [float(v) if d else None for v, d in zip(values, defined)]


def format_table(metrics: SegmentationMetrics):
  """A human-readable per-class table with the flags and the summary lines.

  Columns: id, class, IoU, precision, recall ('-' where undefined), notes.
  """
  width = max([len('class')] + [len(n) for n in metrics.class_names])
  lines = ['%-4s %-*s %8s %9s %8s  %s' % ('id', width, 'class', 'IoU',
                                          'precision', 'recall', 'note')]
  absent = set(metrics.absent_from_ground_truth)
  never = set(metrics.never_predicted)
  for c, (name, iou, precision, recall) in enumerate(zip(
      metrics.class_names, metrics.per_class_iou,
      metrics.per_class_precision, metrics.per_class_recall)):
    notes = []
    if c in absent:
      notes.append('absent from ground truth')
    if c in never:
      notes.append('never predicted')
    lines.append('%-4d %-*s %8s %9s %8s  %s' % (
        c, width, name, _cell(iou), _cell(precision), _cell(recall),
        ', '.join(notes)))
  lines.append('mIoU %.4f over %d classes; pixel accuracy %.4f over %d pixels'
               % (metrics.miou,
                  sum(v is not None for v in metrics.per_class_iou),
                  metrics.pixel_accuracy, metrics.num_pixels))
  return '\n'.join(lines)


def _cell(value):
  return '-' if value is None else '%.4f' % value


def _for(name):
  if name is None:
    return ''
  if isinstance(name, (list, tuple, np.ndarray)):
    name = ', '.join(_text(n) for n in name)
  return ' in image %s' % _text(name)


def _text(name):
  return name.decode() if isinstance(name, bytes) else str(name)


def _json_float(value):
  return None if np.isnan(value) else float(value)
