"""The options of a dataset conversion and the errors it raises.

Errors of the conversion name the options they are about as `{owner.field}`
references (config/errors.py): a `BuildOptions` field
('{BuildOptions.num_classes}') or an argument of the function that takes it
('{build_voc.label_folder}'). The library shows a reference by its field
name; deeplab-build-data shows it by the flag that sets it. Paths and names
read from the user's files are passed as the error's values, apart from its
template, so they are never taken for references.
"""
import dataclasses
from typing import Optional, Tuple

from deeplab_train.config import ConfigError
from deeplab_train.config import errors
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import datasets

# Long lists in messages are cut to this many items.
MAX_LISTED = 8


class DataError(ConfigError):
  """An input file is unusable; the message names it and says why."""


def few(items):
  """The first MAX_LISTED items, comma-separated, and the count if cut."""
  return errors.shortened(items, MAX_LISTED)


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  """How to convert and validate a dataset.

  Attributes:
    num_classes: label ids must be < num_classes (or the ignore label).
    ignore_label: the id of "don't care" pixels (VOC's 255 border).
    dataset_name: stored in dataset.json (the dataset name to train with).
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
    """Raises ConfigError naming the field at fault; returns self."""
    if not 1 <= self.num_classes <= datasets.MAX_CLASSES:
      raise ConfigError('{BuildOptions.num_classes} must be in 1..%d '
                        '(labels are 8-bit PNGs), got %d',
                        datasets.MAX_CLASSES, self.num_classes)
    if not 0 <= self.ignore_label <= 255:
      raise ConfigError('{BuildOptions.ignore_label} must be in 0..255, '
                        'got %d', self.ignore_label)
    if self.num_shards < 1:
      raise ConfigError('{BuildOptions.num_shards} must be >= 1, got %d',
                        self.num_shards)
    if self.num_workers is not None and self.num_workers < 1:
      raise ConfigError('{BuildOptions.num_workers} must be >= 1')
    if self.class_names is not None and (
        len(self.class_names) != self.num_classes):
      raise ConfigError('{BuildOptions.class_names} has %d names but '
                        '{BuildOptions.num_classes}=%d',
                        len(self.class_names), self.num_classes)
    repeated = datasets.repeated_names(self.class_names)
    if repeated:
      # The results by class name (eval_result.json) kept one of each.
      raise ConfigError('{BuildOptions.class_names} names %s more than once: '
                        'give every class its own name', ', '.join(repeated))
    if self.colormap is not None and (
        self.colormap not in colormap_lib.known_colormaps()):
      raise ConfigError('{BuildOptions.colormap}=%s is unknown; use one of '
                        '%s', self.colormap,
                        ', '.join(colormap_lib.known_colormaps()))
    if not self.dataset_name:
      raise ConfigError('{BuildOptions.dataset_name} must not be empty')
    return self

  def palette(self):
    """The colormap name used for RGB labels and written to dataset.json."""
    if self.colormap:
      return self.colormap
    builtin = datasets.BUILTIN_DATASETS.get(self.dataset_name)
    return builtin.palette if builtin else 'pascal'
