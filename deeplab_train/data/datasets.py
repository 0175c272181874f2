"""Dataset descriptors: class count, ignore label, split sizes, names, palette.

The three datasets of the original DeepLab are built in. Any other dataset is
described by a `dataset.json` beside its TFRecords (written by
`deeplab-build-data`), so a new dataset needs no code edit:

    {"name": "shapes", "num_classes": 5, "ignore_label": 255,
     "splits_to_sizes": {"train": 100, "val": 30},
     "class_names": ["background", "disk", ...],
     "palette": "pascal",          # or [[r, g, b], ...] one per class
     "statistics": {"train": {"num_images": 100, "class_pixels": [...],
                              "ignore_pixels": 900, ...}, ...}}

"statistics" (per split: image count, size range, pixels per class and of
the ignore label; see data/stats.py) is written by deeplab-build-data and
deeplab-stats --write_dataset_json; files without it (older builds, written
by hand) are read as before.

`load_dataset_info(name, dataset_dir)` prefers that file over the built-in
table, so a converted copy of PASCAL with a different split list is described
by what was actually converted.
"""
import dataclasses
import logging
import os
from typing import Dict, Optional, Tuple, Union

from deeplab_train import atomic
from deeplab_train.config import ConfigError
from deeplab_train.config import errors
from deeplab_train.config.serialize import read_json_file
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import stats as stats_lib

DATASET_JSON = 'dataset.json'
# Labels are 8-bit PNGs (decoded as uint8): class ids 0..255.
MAX_CLASSES = 256

_log = logging.getLogger(__name__)

PASCAL_VOC_CLASSES = (
    'background', 'aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus',
    'car', 'cat', 'chair', 'cow', 'diningtable', 'dog', 'horse', 'motorbike',
    'person', 'pottedplant', 'sheep', 'sofa', 'train', 'tvmonitor')

CITYSCAPES_CLASSES = (
    'road', 'sidewalk', 'building', 'wall', 'fence', 'pole', 'traffic light',
    'traffic sign', 'vegetation', 'terrain', 'sky', 'person', 'rider', 'car',
    'truck', 'bus', 'train', 'motorcycle', 'bicycle')

# Cityscapes' label ids (its gtFine *_labelIds.png files, and what its
# evaluation server reads) of the 19 train ids above, in train id order.
CITYSCAPES_TRAIN_ID_TO_LABEL_ID = (7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23,
                                   24, 25, 26, 27, 28, 31, 32, 33)
# The other way, for every 8-bit label id: the label ids that are not
# trained on (unlabeled, parking, guard rail, ...) go to the ignore label.
CITYSCAPES_LABEL_ID_TO_TRAIN_ID = tuple(
    CITYSCAPES_TRAIN_ID_TO_LABEL_ID.index(i)
    if i in CITYSCAPES_TRAIN_ID_TO_LABEL_ID else 255 for i in range(256))

# Id 0 is "other" (also the ignore label); 1..150 are the benchmark classes.
ADE20K_CLASSES = ('other',) + (
    'wall', 'building', 'sky', 'floor', 'tree', 'ceiling', 'road', 'bed',
    'windowpane', 'grass', 'cabinet', 'sidewalk', 'person', 'earth', 'door',
    'table', 'mountain', 'plant', 'curtain', 'chair', 'car', 'water',
    'painting', 'sofa', 'shelf', 'house', 'sea', 'mirror', 'rug', 'field',
    'armchair', 'seat', 'fence', 'desk', 'rock', 'wardrobe', 'lamp',
    'bathtub', 'railing', 'cushion', 'base', 'box', 'column', 'signboard',
    'chest of drawers', 'counter', 'sand', 'sink', 'skyscraper', 'fireplace',
    'refrigerator', 'grandstand', 'path', 'stairs', 'runway', 'case',
    'pool table', 'pillow', 'screen door', 'stairway', 'river', 'bridge',
    'bookcase', 'blind', 'coffee table', 'toilet', 'flower', 'book', 'hill',
    'bench', 'countertop', 'stove', 'palm', 'kitchen island', 'computer',
    'swivel chair', 'boat', 'bar', 'arcade machine', 'hovel', 'bus', 'towel',
    'light', 'truck', 'tower', 'chandelier', 'awning', 'streetlight', 'booth',
    'television receiver', 'airplane', 'dirt track', 'apparel', 'pole',
    'land', 'bannister', 'escalator', 'ottoman', 'bottle', 'buffet',
    'poster', 'stage', 'van', 'ship', 'fountain', 'conveyer belt', 'canopy',
    'washer', 'plaything', 'swimming pool', 'stool', 'barrel', 'basket',
    'waterfall', 'tent', 'bag', 'minibike', 'cradle', 'oven', 'ball', 'food',
    'step', 'tank', 'trade name', 'microwave', 'pot', 'animal', 'bicycle',
    'lake', 'dishwasher', 'screen', 'blanket', 'sculpture', 'hood', 'sconce',
    'vase', 'traffic light', 'tray', 'ashcan', 'fan', 'pier', 'crt screen',
    'plate', 'monitor', 'bulletin board', 'shower', 'radiator', 'glass',
    'clock', 'flag')

Palette = Union[str, Tuple[Tuple[int, int, int], ...], None]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the trainer and evaluator need to know about a dataset.

  Attributes:
    name: dataset name (the `dataset` a command is given).
    num_classes: classes including background, i.e. label ids 0..n-1.
    ignore_label: label id excluded from loss and metrics.
    splits_to_sizes: {split name: number of images}.
    class_names: one name per class id, or None when unknown.
    palette: a colormap name ('pascal', 'cityscapes', 'ade20k'), a tuple of
      (r, g, b) per class, or None (then 'pascal' is used for display).
    statistics: {split name: stats.SplitStats} of the splits counted, or
      None when unknown (built-in table, older dataset.json).
  """
  name: str
  num_classes: int
  ignore_label: int
  splits_to_sizes: Dict[str, int]
  class_names: Optional[Tuple[str, ...]] = None
  palette: Palette = None
  statistics: Optional[Dict[str, stats_lib.SplitStats]] = None

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    set_('splits_to_sizes', {str(k): int(v)
                             for k, v in dict(self.splits_to_sizes).items()})
    if self.class_names is not None:
      set_('class_names', tuple(str(c) for c in self.class_names))
    if self.palette is not None and not isinstance(self.palette, str):
      set_('palette', tuple(tuple(int(v) for v in c) for c in self.palette))
    if self.statistics is not None:
      set_('statistics', {
          str(k): (v if isinstance(v, stats_lib.SplitStats)
                   else stats_lib.SplitStats.from_dict(v)).ignoring(
                       self.ignore_label)
          for k, v in dict(self.statistics).items()})

  __hash__ = None  # splits_to_sizes and statistics are dicts

  def validate(self, source='dataset info'):
    """Checks the fields are consistent.

    Args:
      source: what to name in the error (e.g. the dataset.json path).

    Returns:
      self.

    Raises:
      ConfigError: naming `source` and the bad field.
    """
    if not isinstance(self.num_classes, int) or self.num_classes < 1:
      raise ConfigError('%s: num_classes must be a positive integer, got %r'
                        % (source, self.num_classes))
    if self.num_classes > MAX_CLASSES:
      # Counted, drawn and scored per class: a typo (1000000000) took all
      # the memory there is.
      raise ConfigError('%s: num_classes must be at most %d (labels are '
                        '8-bit PNGs: ids 0..255), got %d'
                        % (source, MAX_CLASSES, self.num_classes))
    if not isinstance(self.ignore_label, int) or self.ignore_label < 0:
      raise ConfigError('%s: ignore_label must be a non-negative integer, '
                        'got %r' % (source, self.ignore_label))
    for split, size in self.splits_to_sizes.items():
      if size < 0:
        raise ConfigError('%s: split %r has negative size %d'
                          % (source, split, size))
    if (self.class_names is not None and
        len(self.class_names) != self.num_classes):
      raise ConfigError('%s: %d class_names for num_classes=%d'
                        % (source, len(self.class_names), self.num_classes))
    repeated = repeated_names(self.class_names)
    if repeated:
      raise ConfigError('%s: class_names names %s more than once (results '
                        'are kept by class name): give every class its own '
                        'name' % (source, ', '.join(repeated)))
    try:
      colormap_lib.as_colormap(self.display_palette())
    except ValueError as e:
      raise ConfigError('%s: bad palette: %s' % (source, e)) from None
    for split, counted in (self.statistics or {}).items():
      if counted.num_classes != self.num_classes:
        raise ConfigError('%s: the statistics of split %r count %d classes '
                          'for num_classes=%d' % (source, split,
                                                  counted.num_classes,
                                                  self.num_classes))
    return self

  def split_statistics(self, split):
    """The SplitStats of `split`, or None when it was not counted."""
    return (self.statistics or {}).get(split)

  def with_statistics(self, split, counted):
    """A copy with `split` counted as `counted` (a SplitStats), its size in
    splits_to_sizes set to the count of images."""
    return dataclasses.replace(
        self, splits_to_sizes=dict(self.splits_to_sizes,
                                   **{split: counted.num_images}),
        statistics=dict(self.statistics or {}, **{split: counted}))

  def display_palette(self):
    return 'pascal' if self.palette is None else self.palette

  def colormap(self):
    """uint8 [>=256, 3] colours for this dataset's class ids."""
    return colormap_lib.as_colormap(self.display_palette())

  def to_dict(self):
    palette = self.palette
    if palette is not None and not isinstance(palette, str):
      palette = [list(c) for c in palette]
    d = {'name': self.name, 'num_classes': self.num_classes,
         'ignore_label': self.ignore_label,
         'splits_to_sizes': dict(self.splits_to_sizes),
         'class_names': (list(self.class_names)
                         if self.class_names is not None else None),
         'palette': palette}
    if self.statistics is not None:
      d['statistics'] = {split: counted.to_dict()
                         for split, counted in self.statistics.items()}
    return d

  @classmethod
  def from_dict(cls, d, source='dataset info'):
    """Builds a DatasetInfo from a dict (e.g. a parsed dataset.json).

    Raises:
      ConfigError: missing or unknown keys, or inconsistent values.
    """
    if not isinstance(d, dict):
      raise ConfigError('%s: expected a JSON object' % source)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ConfigError('%s: unknown key(s) %s; known keys: %s'
                        % (source, unknown, sorted(known)))
    missing = [k for k in ('num_classes', 'ignore_label') if k not in d]
    if missing:
      raise ConfigError('%s: missing key(s) %s' % (source, missing))
    d = dict(d)
    d.setdefault('name', 'custom')
    d.setdefault('splits_to_sizes', {})
    try:
      d['statistics'] = _current_statistics(d, source)
      info = cls(**d)
    except (TypeError, ValueError) as e:
      raise ConfigError('%s: %s' % (source, e)) from None
    return info.validate(source)


def _current_statistics(d, source):
  """d['statistics'] without the splits counted for another class count (a
  hand-edited num_classes): they are dropped with a warning, not refused,
  since they only inform.

  Raises:
    ValueError / TypeError: malformed statistics.
  """
  statistics = d.get('statistics')
  if statistics is None:
    return None
  if not isinstance(statistics, dict):
    raise ValueError('statistics must be a JSON object of splits')
  kept = {}
  for split, counted in statistics.items():
    counted = stats_lib.SplitStats.from_dict(counted)
    if counted.num_classes != d['num_classes']:
      _log.warning('%s: ignoring the statistics of split %r (%d classes, '
                   'num_classes=%s): rebuild the split or run deeplab-stats '
                   '--write_dataset_json', source, split, counted.num_classes,
                   d['num_classes'])
      continue
    kept[split] = counted
  return kept


BUILTIN_DATASETS = {
    'pascal_voc_seg': DatasetInfo(
        name='pascal_voc_seg', num_classes=21, ignore_label=255,
        splits_to_sizes={'train': 1464, 'train_aug': 10582,
                         'trainval': 2913, 'val': 1449},
        class_names=PASCAL_VOC_CLASSES, palette='pascal'),
    'cityscapes': DatasetInfo(
        name='cityscapes', num_classes=19, ignore_label=255,
        splits_to_sizes={'train': 2975, 'val': 500},
        class_names=CITYSCAPES_CLASSES, palette='cityscapes'),
    'ade20k': DatasetInfo(
        name='ade20k', num_classes=151, ignore_label=0,
        splits_to_sizes={'train': 20210, 'val': 2000},
        class_names=ADE20K_CLASSES, palette='ade20k'),
}


def repeated_names(names):
  """The names `names` (or None) holds more than once, in order."""
  seen, repeated = set(), []
  for name in names or ():
    if name in seen and name not in repeated:
      repeated.append(name)
    seen.add(name)
  return repeated


def read_dataset_json(dataset_dir):
  """The DatasetInfo in `dataset_dir/dataset.json`, or None if absent.

  Raises:
    ConfigError: the file exists but is not a valid descriptor.
  """
  path = os.path.join(dataset_dir, DATASET_JSON)
  payload = read_json_file(path, '%s is not valid JSON (%s); fix or delete it')
  if payload is None:
    return None
  return DatasetInfo.from_dict(payload, source=path)


def load_dataset_info(name, dataset_dir=None, name_is_default=False,
                      name_from=None):
  """Describes the dataset to train or evaluate on.

  A `dataset.json` in `dataset_dir` wins over the built-in table: it says
  what was actually converted and works for any dataset.

  Args:
    name: the dataset's name (a command's `dataset` option).
    dataset_dir: the folder holding the TFRecords (may be None).
    name_is_default: `name` is the option's default, which the user did not
      choose: a dataset.json naming another dataset is then no warning.
    name_from: where `name` was read, if not from the option (e.g. "the
      training run's deeplab_config.json"), for that warning.

  Returns:
    A DatasetInfo.

  Raises:
    ConfigError: neither a dataset.json nor a built-in dataset of that name.
  """
  if dataset_dir:
    info = read_dataset_json(dataset_dir)
    if info is not None:
      if name and info.name != name and not name_is_default:
        path = os.path.join(dataset_dir, DATASET_JSON)
        if name_from:
          _log.warning('%s names dataset %r but %s describes dataset %r; '
                       'using the file', name_from, name, path, info.name)
        else:
          # In the command's flags: --dataset=NAME (cli/app.py).
          _log.warning(errors.Message(
              '{load_dataset_info.name}=%s but %s describes dataset %r; '
              'using the file', name, path, info.name))
      return info
  if name in BUILTIN_DATASETS:
    return BUILTIN_DATASETS[name]
  where = (os.path.join(dataset_dir, DATASET_JSON) if dataset_dir
           else 'DATASET_DIR/%s' % DATASET_JSON)
  raise ConfigError(
      'unknown dataset %r and no %s: use a built-in dataset (%s) or write '
      'the descriptor with deeplab-build-data (for records made elsewhere: '
      'deeplab-stats --dataset=NAME --num_classes=N --write_dataset_json)'
      % (name, where, ', '.join(sorted(BUILTIN_DATASETS))))


def write_dataset_json(dataset_dir, info):
  """Atomically writes `info` as `dataset_dir/dataset.json`.

  Args:
    dataset_dir: existing folder.
    info: a DatasetInfo (validated before writing).

  Returns:
    The path written.
  """
  path = os.path.join(dataset_dir, DATASET_JSON)
  info.validate(path)
  return atomic.write_json(path, info.to_dict())
