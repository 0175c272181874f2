"""Class statistics of a dataset split, and class weights derived from them.

A split's statistics (`SplitStats`): its image count, the range of image
heights and widths, the pixels of each class id, of the ignore label and of
any other value. deeplab-build-data counts them from the label arrays it
decodes anyway and records them per split in dataset.json ("statistics");
deeplab-stats counts them from existing TFRecords (the original DeepLab
converter's too), decoding labels as the trainer does (`count_records`).

`split_warnings` says what deserves a look before training: a class with no
pixel in a training split (the model never sees it), a class under
RARE_CLASS_SHARE of the labelled pixels, ignore over MAX_IGNORE_SHARE of all
pixels, and ids that are neither a class nor the ignore label.

Class weights for the loss (deeplab-train --label_weights=SCHEME) from a
split's counts, with freq_c = pixels of class c / labelled pixels (the
ignore label excluded):

  auto_median        weight_c = median(freq) / freq_c: median-frequency
                     balancing (Eigen & Fergus, 2015), the median taken over
                     the classes present; the median class weighs 1, a class
                     10x rarer 10.
  auto_inverse_sqrt  weight_c = 1 / sqrt(freq_c), scaled so that the weights
                     of the classes present have mean 1: milder, a class
                     100x rarer weighs 10x more.
  auto               the same as auto_median.

A class with no pixel in the split gets the largest weight of the classes
present: it changes nothing on that split (no pixel to weigh), and should the
class appear in data the counts missed, it is treated as the rarest class
rather than switched off (weight 0). `class_weights` returns these classes so
that callers warn about them.

Nothing here imports TensorFlow except `count_records`.
"""
import dataclasses
from typing import Tuple

import numpy as np

from deeplab_train.config import ConfigError
from deeplab_train.config import errors

# A class under this share of the labelled pixels is reported as rare.
RARE_CLASS_SHARE = 0.001
# Ignore over this share of all pixels is reported.
MAX_IGNORE_SHARE = 0.30
# Splits whose name starts with this are training splits (train, train_aug,
# trainval): a class missing there is never learnt.
TRAINING_SPLIT_PREFIX = 'train'
# Classes listed by name in one warning, at most.
MAX_LISTED = 10

AUTO = 'auto'
AUTO_MEDIAN = 'auto_median'
AUTO_INVERSE_SQRT = 'auto_inverse_sqrt'
WEIGHT_SCHEMES = (AUTO, AUTO_MEDIAN, AUTO_INVERSE_SQRT)
WEIGHT_FORMULAS = {
    AUTO: 'median(freq) / freq_c (median-frequency balancing)',
    AUTO_MEDIAN: 'median(freq) / freq_c (median-frequency balancing)',
    AUTO_INVERSE_SQRT: '1 / sqrt(freq_c), normalised to mean 1',
}

_SIZE_FIELDS = ('min_height', 'max_height', 'min_width', 'max_width')


@dataclasses.dataclass(frozen=True)
class SplitStats:
  """What one split holds.

  Attributes:
    num_images: records of the split.
    min_height / max_height / min_width / max_width: image size range in
      pixels (0 for an empty split).
    class_pixels: pixels of each class id 0..num_classes-1; 0 for the
      ignore label where it is a class id (ADE20K's 0), see `ignoring`.
    ignore_pixels: pixels of the ignore label.
    invalid_pixels: pixels of any other value (the trainer refuses them).
    invalid_values: those other values, sorted.
    unlabelled_images: records without a label (a test split).
  """
  num_images: int
  min_height: int
  max_height: int
  min_width: int
  max_width: int
  class_pixels: Tuple[int, ...]
  ignore_pixels: int = 0
  invalid_pixels: int = 0
  invalid_values: Tuple[int, ...] = ()
  unlabelled_images: int = 0

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name in ('class_pixels', 'invalid_values'):
        value = tuple(int(v) for v in value)
        if any(v < 0 for v in value):
          raise ValueError('%s must be >= 0' % f.name)
      else:
        value = int(value)
        if value < 0:
          raise ValueError('%s must be >= 0, got %d' % (f.name, value))
      object.__setattr__(self, f.name, value)

  @property
  def num_classes(self):
    return len(self.class_pixels)

  @property
  def labelled_pixels(self):
    """Pixels of a class (ignore and invalid ids excluded)."""
    return sum(self.class_pixels)

  @property
  def total_pixels(self):
    return self.labelled_pixels + self.ignore_pixels + self.invalid_pixels

  @property
  def ignore_share(self):
    """Ignore pixels / all pixels of the labels (0 without labels)."""
    return self.ignore_pixels / self.total_pixels if self.total_pixels else 0.

  def class_shares(self):
    """Each class's share of the labelled pixels (zeros without any)."""
    labelled = self.labelled_pixels
    return tuple(p / labelled if labelled else 0. for p in self.class_pixels)

  def ignoring(self, ignore_label):
    """These statistics with no class pixels for `ignore_label` where it
    is a class id (ADE20K ignores its class 0): its pixels are counted in
    ignore_pixels only. dataset.json files of builds before 2026-12-07
    counted them twice; read through this, they give the right shares."""
    if not 0 <= ignore_label < self.num_classes:
      return self
    if not self.class_pixels[ignore_label]:
      return self
    pixels = list(self.class_pixels)
    pixels[ignore_label] = 0
    return dataclasses.replace(self, class_pixels=tuple(pixels))

  def to_dict(self):
    d = dataclasses.asdict(self)
    d['class_pixels'] = list(self.class_pixels)
    d['invalid_values'] = list(self.invalid_values)
    return d

  @classmethod
  def from_dict(cls, d):
    """The inverse of to_dict.

    Raises:
      ValueError: not a dict, unknown or missing keys, negative counts.
    """
    if not isinstance(d, dict):
      raise ValueError('split statistics must be a JSON object, got %r'
                       % (d,))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError('unknown split statistics key(s) %s' % unknown)
    missing = sorted(k for k in ('num_images', 'class_pixels') + _SIZE_FIELDS
                     if k not in d)
    if missing:
      raise ValueError('split statistics lack key(s) %s' % missing)
    return cls(**d)


class SplitCounter:
  """Accumulates SplitStats one image at a time (one counter per thread;
  `merge` joins them)."""

  def __init__(self, num_classes, ignore_label):
    self.num_classes = num_classes
    self.ignore_label = ignore_label
    self.num_images = 0
    self._pixels = np.zeros(max(num_classes, ignore_label + 1, 256),
                            np.int64)
    self._unlabelled = 0
    self._heights = (None, None)  # (min, max)
    self._widths = (None, None)

  def add(self, height, width, ids=None):
    """Counts one image of `height` x `width` with label `ids` (an array of
    non-negative integers; None without a label)."""
    counts = None
    if ids is not None:
      counts = np.bincount(np.asarray(ids).ravel())
    self.add_counts(height, width, counts)

  def add_counts(self, height, width, counts=None):
    """Counts one image whose label has counts[v] pixels of value v (None
    without a label)."""
    self.num_images += 1
    self._heights = _widen(self._heights, int(height), int(height))
    self._widths = _widen(self._widths, int(width), int(width))
    if counts is None:
      self._unlabelled += 1
    else:
      self._add_pixels(counts)

  def _add_pixels(self, counts):
    counts = np.asarray(counts, np.int64)
    if len(counts) > len(self._pixels):
      self._pixels = np.concatenate(
          [self._pixels, np.zeros(len(counts) - len(self._pixels), np.int64)])
    self._pixels[:len(counts)] += counts

  def merge(self, other):
    """Adds `other`'s counts to this counter; returns self."""
    # pylint: disable=protected-access
    self.num_images += other.num_images
    self._unlabelled += other._unlabelled
    self._heights = _widen(self._heights, *other._heights)
    self._widths = _widen(self._widths, *other._widths)
    self._add_pixels(other._pixels)
    return self

  def result(self):
    """The SplitStats counted so far."""
    pixels = self._pixels
    other = np.ones(len(pixels), bool)
    other[:self.num_classes] = False
    ignore = 0
    if self.ignore_label < len(pixels):
      ignore = int(pixels[self.ignore_label])
      other[self.ignore_label] = False
    return SplitStats(
        num_images=self.num_images,
        min_height=self._heights[0] or 0, max_height=self._heights[1] or 0,
        min_width=self._widths[0] or 0, max_width=self._widths[1] or 0,
        class_pixels=tuple(int(p) for p in pixels[:self.num_classes]),
        ignore_pixels=ignore, invalid_pixels=int(pixels[other].sum()),
        invalid_values=tuple(int(v)
                             for v in np.flatnonzero(other & (pixels > 0))),
        unlabelled_images=self._unlabelled).ignoring(self.ignore_label)


def _widen(bounds, low, high):
  """(min, max) `bounds` widened to hold low..high (None: empty)."""
  if low is None:
    return bounds
  if bounds[0] is None:
    return (low, high)
  return (min(bounds[0], low), max(bounds[1], high))


def merge_counters(counters, num_classes, ignore_label):
  """One SplitStats of several counters (e.g. one per shard)."""
  total = SplitCounter(num_classes, ignore_label)
  for counter in counters:
    total.merge(counter)
  return total.result()


# ---------------------------------------------------------------------------
# Reading TFRecords.
# ---------------------------------------------------------------------------
def _record_counts(serialized):
  """([height, width], has label, counts of label values [256]) of one
  record, its label decoded as the trainer decodes it (graph op)."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from deeplab_train.data import tfrecord  # pylint: disable=g-import-not-at-top
  features = tfrecord.parse_example(serialized)
  encoded = features[tfrecord.LABEL_ENCODED]
  has_label = tf.strings.length(encoded) > 0
  # uint8 labels: 256 bins hold every value.
  counts = tf.cond(
      has_label,
      lambda: tf.math.bincount(
          tf.cast(tfrecord.decode_image(encoded, 1), tf.int32),
          minlength=256, maxlength=256, dtype=tf.int64),
      lambda: tf.zeros([256], tf.int64))
  height = features[tfrecord.IMAGE_HEIGHT]
  width = features[tfrecord.IMAGE_WIDTH]
  # Records without image/height and image/width: the decoded image's.
  size = tf.cond(
      tf.logical_and(height > 0, width > 0),
      lambda: tf.stack([height, width]),
      lambda: tf.cast(tf.shape(tfrecord.decode_image(
          features[tfrecord.IMAGE_ENCODED], 3))[:2], tf.int64))
  return size, has_label, counts


def count_records(files, num_classes, ignore_label, split='split'):
  """The SplitStats of TFRecord `files`, labels decoded as by the trainer
  (`decode_png(channels=1)`: a palette label stored as-is counts as grey
  levels, i.e. invalid values).

  Args:
    files: TFRecord files in the original DeepLab schema.
    num_classes: class ids are 0..num_classes-1.
    ignore_label: the ignore id.
    split: the split's name, for messages.

  Returns:
    SplitStats.

  Raises:
    ConfigError: a record whose image or label cannot be decoded.
    tf.errors.DataLossError: a damaged or cut-short file.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf
  from deeplab_train.data import pipeline
  # pylint: enable=g-import-not-at-top
  counter = SplitCounter(num_classes, ignore_label)
  with tf.Graph().as_default():
    # Graph code already: no AutoGraph rewrite (see make_dataset).
    dataset = tf.data.TFRecordDataset(list(files)).map(
        tf.autograph.experimental.do_not_convert(_record_counts),
        num_parallel_calls=tf.data.experimental.AUTOTUNE)
    next_record = tf.data.make_one_shot_iterator(
        dataset.prefetch(64)).get_next()
    with tf.Session() as sess:
      while True:
        try:
          size, has_label, counts = sess.run(next_record)
        except tf.errors.OutOfRangeError:
          break
        except tf.errors.InvalidArgumentError as e:
          raise ConfigError(
              'split %r: record %d (counting from 0, files in name order: '
              '%s) cannot be decoded: %s', split, counter.num_images,
              ', '.join(files), pipeline.error_reason(e.message)) from None
        counter.add_counts(size[0], size[1], counts if has_label else None)
  return counter.result()


# ---------------------------------------------------------------------------
# Showing them.
# ---------------------------------------------------------------------------
def class_label(class_id, class_names=None):
  """"'cow' (9)" where the names are known, else 'class 9'."""
  if class_names is not None and class_id < len(class_names):
    return '%r (%d)' % (class_names[class_id], class_id)
  return 'class %d' % class_id


def _listed(items):
  return errors.shortened(items, MAX_LISTED)


def format_table(split, counted, class_names=None, ignore_label=None):
  """The split's statistics as text: a summary line, then one line per
  class (id, name, pixels, share of the labelled pixels)."""
  lines = ['split %r: %d images%s, height %d..%d, width %d..%d; %s label '
           'pixels, %.2f %% of them ignore%s' % (
               split, counted.num_images,
               (' (%d without label)' % counted.unlabelled_images
                if counted.unlabelled_images else ''),
               counted.min_height, counted.max_height, counted.min_width,
               counted.max_width, '{:,}'.format(counted.total_pixels),
               100 * counted.ignore_share,
               '' if ignore_label is None else ' (id %d)' % ignore_label)]
  if not counted.total_pixels:
    return '\n'.join(lines + ['  no labelled pixels'])
  names = class_names or ('',) * counted.num_classes
  width = max([5] + [len(n) for n in names])
  lines.append('  %4s  %-*s  %15s  %8s' % ('id', width, 'class', 'pixels',
                                           'share'))
  for i, (pixels, share) in enumerate(zip(counted.class_pixels,
                                          counted.class_shares())):
    note = ('  ignored (the ignore label)' if i == ignore_label else
            '  none' if not pixels else
            '  rare' if share < RARE_CLASS_SHARE else '')
    lines.append('  %4d  %-*s  %15s  %7.3f%%%s' % (
        i, width, names[i], '{:,}'.format(pixels), 100 * share, note))
  if counted.invalid_pixels:
    lines.append('  other ids: %s pixels (values %s)' % (
        '{:,}'.format(counted.invalid_pixels),
        ', '.join(str(v) for v in counted.invalid_values)))
  return '\n'.join(lines)


def is_training_split(split):
  return split.startswith(TRAINING_SPLIT_PREFIX)


def _binary_mask_hint(counted, missing, ignore_label):
  """What to do when two classes' labels hold class 0 and the ignore label
  only: masks of 0 and 255 read with the ignore label 255 (the default)."""
  if (counted.num_classes != 2 or missing != [1] or
      not counted.ignore_pixels or ignore_label is None):
    return ''
  return ('; its labels hold 0 and the ignore label %d only: if %d marks the '
          'foreground (binary masks of 0 and %d), save the masks with 1 for '
          'the foreground' % (ignore_label, ignore_label, ignore_label))


def split_warnings(split, counted, class_names=None, ignore_label=None):
  """What deserves a look in a split's statistics, one line each.

  Args:
    split: the split's name (classes missing are reported for training
      splits only: a small val split often lacks some).
    counted: its SplitStats.
    class_names: names of the class ids, or None (ids are shown).
    ignore_label: the ignore id, for messages.

  Returns:
    A list of messages (empty: nothing to report).
  """
  out = []
  if counted.labelled_pixels:
    name = lambda i: class_label(i, class_names)
    missing = [i for i, p in enumerate(counted.class_pixels)
               if not p and i != ignore_label]
    if missing and is_training_split(split):
      out.append('split %r has no pixel of %s: the model cannot learn '
                 'them%s' % (split, _listed(name(i) for i in missing),
                             _binary_mask_hint(counted, missing,
                                               ignore_label)))
    rare = [(i, s) for i, s in enumerate(counted.class_shares())
            if 0 < s < RARE_CLASS_SHARE]
    if rare:
      out.append('split %r: %s under %g %% of the labelled pixels: %s' % (
          split, 'class is' if len(rare) == 1 else 'classes are',
          100 * RARE_CLASS_SHARE,
          _listed('%s %.4f %%' % (name(i), 100 * s) for i, s in rare)))
  if counted.ignore_share > MAX_IGNORE_SHARE:
    out.append('split %r: %.1f %% of all label pixels are ignore%s (over '
               '%g %%): check the ignore label' % (
                   split, 100 * counted.ignore_share,
                   '' if ignore_label is None else ' (id %d)' % ignore_label,
                   100 * MAX_IGNORE_SHARE))
  if counted.invalid_pixels:
    out.append('split %r: %s pixels have ids that are neither a class nor '
               'the ignore label (values %s): training stops at the first '
               'such record; a palette label stored as-is decodes to grey '
               'levels' % (split, '{:,}'.format(counted.invalid_pixels),
                           _listed(str(v) for v in counted.invalid_values)))
  return out


# ---------------------------------------------------------------------------
# Class weights.
# ---------------------------------------------------------------------------
def class_weights(class_pixels, scheme, ignore_label=None):
  """One loss weight per class from its pixel count (module docstring).

  Args:
    class_pixels: pixels of each class id.
    scheme: one of WEIGHT_SCHEMES.
    ignore_label: the ignore id; where it is a class id (ADE20K's 0), it
      gets weight 0 (its pixels carry no loss whatever it weighs) and is
      neither counted nor reported absent.

  Returns:
    (weights: tuple of floats, one per class; absent: tuple of the ids with
    no pixel, which got the largest weight).

  Raises:
    ConfigError: unknown scheme, or no labelled pixel at all.
  """
  if scheme not in WEIGHT_SCHEMES:
    raise ConfigError('unknown class weight scheme %r; known: %s'
                      % (scheme, ', '.join(WEIGHT_SCHEMES)))
  pixels = np.asarray(class_pixels, np.float64)
  ignored = np.zeros(len(pixels), bool)
  if ignore_label is not None and 0 <= ignore_label < len(pixels):
    ignored[ignore_label] = True
    pixels[ignore_label] = 0.
  if not len(pixels) or pixels.sum() <= 0:
    raise ConfigError('no labelled pixel to derive class weights from')
  freq = pixels / pixels.sum()
  present = freq > 0
  safe = np.where(present, freq, 1.)
  if scheme == AUTO_INVERSE_SQRT:
    weights = 1. / np.sqrt(safe)
    weights /= weights[present].mean()
  else:
    weights = np.median(freq[present]) / safe
  absent = ~present & ~ignored
  weights[absent] = weights[present].max()
  weights[ignored] = 0.
  return (tuple(float(w) for w in weights),
          tuple(int(i) for i in np.flatnonzero(absent)))


def format_weights(weights, class_pixels, class_names=None,
                   ignore_label=None):
  """A table of the weights: id, name, share of the labelled pixels,
  weight (the ignore id's row marked)."""
  total = float(sum(class_pixels)) or 1.
  names = class_names or ('',) * len(weights)
  width = max([5] + [len(n) for n in names])
  lines = ['  %4s  %-*s  %8s  %9s' % ('id', width, 'class', 'share',
                                      'weight')]
  for i, (w, p) in enumerate(zip(weights, class_pixels)):
    lines.append('  %4d  %-*s  %7.3f%%  %9.4g%s' % (
        i, width, names[i], 100 * p / total, w,
        '  (the ignore label)' if i == ignore_label else ''))
  return '\n'.join(lines)
