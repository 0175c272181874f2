"""Confusion-matrix metrics against plain numpy and against tf.metrics."""
import numpy as np
import pytest

from deeplab_train.evaluation import metrics

IGNORE = 255


def _numpy_scores(labels, preds, num_classes, ignore=IGNORE):
  """Reference: IoU per class from pixel sets, written independently."""
  keep = labels != ignore
  labels, preds = labels[keep], preds[keep]
  ious = []
  for c in range(num_classes):
    inter = np.sum((labels == c) & (preds == c))
    union = np.sum((labels == c) | (preds == c))
    ious.append(inter / union if union else None)
  present = [v for v in ious if v is not None]
  return ious, float(np.mean(present)), float(np.mean(labels == preds))


def _random_case(seed, num_classes=5, shape=(3, 17, 23)):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, shape)
  labels[rng.random(shape) < 0.2] = IGNORE
  # Predictions mostly right so the IoUs are not all near zero.
  right = np.where(labels == IGNORE, 0, labels)
  preds = np.where(rng.random(shape) < 0.6, right,
                   rng.integers(0, num_classes, shape))
  return labels, preds


def test_hand_made_case():
  labels = np.array([[0, 0, 1, 1],
                     [2, 2, IGNORE, IGNORE]])
  preds = np.array([[0, 1, 1, 1],
                     [2, 0, 3, 2]])
  cm = metrics.ConfusionMatrix(4, IGNORE)
  cm.update(labels, preds)
  m = cm.result()
  # class 0: tp 1, fp 1 (from a 2), fn 1 -> 1/3; class 1: tp 2, fp 1 -> 2/3;
  # class 2: tp 1, fn 1 -> 1/2; class 3: only predicted on ignored pixels.
  assert m.per_class_iou[:3] == pytest.approx([1 / 3, 2 / 3, 1 / 2])
  assert m.per_class_iou[3] is None
  assert m.miou == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3)
  assert m.pixel_accuracy == pytest.approx(4 / 6)
  assert m.absent_from_ground_truth == [3]
  assert m.never_predicted == [3]
  assert m.num_pixels == 6


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_matches_numpy_over_batches(seed):
  labels, preds = _random_case(seed)
  cm = metrics.ConfusionMatrix(5, IGNORE)
  for i in range(labels.shape[0]):  # accumulate image by image
    cm.update(labels[i], preds[i])
  m = cm.result()
  ious, miou, acc = _numpy_scores(labels, preds, 5)
  for got, want in zip(m.per_class_iou, ious):
    assert (got is None) == (want is None)
    if want is not None:
      assert got == pytest.approx(want)
  assert m.miou == pytest.approx(miou)
  assert m.pixel_accuracy == pytest.approx(acc)


def test_predicted_but_absent_class_counts_as_zero():
  labels = np.array([0, 0, 0, 0])
  preds = np.array([0, 0, 0, 2])
  m = metrics.compute_metrics(_counts(labels, preds, 3))
  assert m.per_class_iou == [pytest.approx(0.75), None, 0.0]
  assert m.miou == pytest.approx(0.375)
  assert m.absent_from_ground_truth == [1, 2]
  assert m.never_predicted == [1]


def test_valid_mask_excludes_padding():
  labels = np.array([[1, 1, 0], [1, 1, 0]])
  preds = np.array([[1, 1, 1], [1, 1, 1]])
  valid = np.array([[True, True, False], [True, True, False]])
  cm = metrics.ConfusionMatrix(2, IGNORE)
  cm.update(labels, preds, valid=valid)
  assert cm.result().miou == 1.0
  assert cm.counts.sum() == 4


def test_same_as_tf_metrics_mean_iou():
  """The original DeepLab's metric (tf.metrics.mean_iou with weights)."""
  import tensorflow.compat.v1 as tf
  labels, preds = _random_case(7, num_classes=6)
  preds[preds == 4] = 5  # class 4 never predicted
  with tf.Graph().as_default():
    lab = tf.constant(labels.reshape(-1))
    weights = tf.cast(tf.not_equal(lab, IGNORE), tf.float32)
    lab = tf.where(tf.equal(lab, IGNORE), tf.zeros_like(lab), lab)
    miou, update = tf.metrics.mean_iou(lab, tf.constant(preds.reshape(-1)), 6,
                                       weights=weights)
    with tf.Session() as sess:
      sess.run(tf.local_variables_initializer())
      sess.run(update)
      want = sess.run(miou)
  cm = metrics.ConfusionMatrix(6, IGNORE)
  cm.update(labels, preds)
  assert cm.result().miou == pytest.approx(want, rel=1e-6)
  assert cm.result().never_predicted == [4]


def test_label_out_of_range_names_image():
  cm = metrics.ConfusionMatrix(3, IGNORE)
  with pytest.raises(metrics.LabelRangeError, match=r'value 7 in image a\.png'):
    cm.update(np.array([0, 7]), np.array([0, 1]), name=b'a.png')


def test_empty_and_table():
  m = metrics.ConfusionMatrix(2).result()
  assert np.isnan(m.miou) and m.to_dict()['miou'] is None
  cm = metrics.ConfusionMatrix(3)
  cm.update(np.array([0, 1, 1]), np.array([0, 1, 0]))
  table = metrics.format_table(cm.result(['bg', 'cat', 'dog']))
  assert 'dog' in table and 'absent from ground truth, never predicted' in table
  assert 'mIoU 0.5000 over 2 classes' in table


def _counts(labels, preds, n):
  cm = metrics.ConfusionMatrix(n)
  cm.update(labels, preds)
  return cm.counts
