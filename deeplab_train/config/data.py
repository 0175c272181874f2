"""Input preprocessing options (owned by data/)."""
import dataclasses
from typing import Optional, Tuple

from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_finite
from deeplab_train.config.errors import field_ref
from deeplab_train.config.errors import is_crop
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.config.serialize import set_field
from deeplab_train.config.serialize import tuple_or_none

# The resize applied before padding; saved with the model because export
# applies it too.
RESIZE_FIELDS = ('min_resize_value', 'max_resize_value', 'resize_factor')


def check_resize(options):
  """Each of RESIZE_FIELDS of `options` is unset or >= 1."""
  for name in RESIZE_FIELDS:
    value = getattr(options, name)
    check(value is None or value >= 1, '%s must be >= 1 (or unset), got %s'
          % (field_ref(options, name), value))


@dataclasses.dataclass(frozen=True)
class PreprocessOptions(JsonMixin):
  """The original's input_preprocess settings.

  Resize options also apply at export time (they are saved with the model).
  `crop_size` None (evaluation only) means images are not padded.
  """
  crop_size: Tuple[int, int] = (513, 513)
  min_resize_value: Optional[int] = None
  max_resize_value: Optional[int] = None
  resize_factor: Optional[int] = None
  min_scale_factor: float = 1.0
  max_scale_factor: float = 1.0
  scale_factor_step_size: float = 0.0

  def __post_init__(self):
    set_field(self, 'crop_size', tuple_or_none(self.crop_size))

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(is_crop(self.crop_size), 'crop size must be HEIGHT,WIDTH with '
          'positive values, got %s' % (self.crop_size,))
    check_resize(self)
    check(0 < self.min_scale_factor <= self.max_scale_factor,
          '{PreprocessOptions.min_scale_factor} must be > 0 and <= '
          '{PreprocessOptions.max_scale_factor} (got %g, %g)'
          % (self.min_scale_factor, self.max_scale_factor))
    check(self.scale_factor_step_size >= 0,
          '{PreprocessOptions.scale_factor_step_size} must be >= 0')
    return self
