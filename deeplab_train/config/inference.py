"""How eval, vis and export run a trained network (owned by evaluation/ and
export/)."""
import dataclasses
from typing import ClassVar, Optional, Tuple

from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_finite
from deeplab_train.config.errors import check_one_of
from deeplab_train.config.errors import ConfigError
from deeplab_train.config.errors import is_crop
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.config.serialize import set_field
from deeplab_train.config.serialize import tuple_or_none

# deeplab-export --tflite_quantize (export/tflite.py): none (float32),
# float16 weights, dynamic (int8 weights), int8 (weights and activations).
TFLITE_QUANTIZE_MODES = ('none', 'float16', 'dynamic', 'int8')


def _show(values):
  return ','.join(map(str, values))


class ImageTooLargeError(ConfigError):
  """An image does not fit in the fixed crop size."""


def fitting_size(height, width, output_stride):
  """Smallest (k * output_stride + 1) sizes holding height x width."""
  fit = lambda n: -(-(int(n) - 1) // output_stride) * output_stride + 1
  return fit(height), fit(width)


@dataclasses.dataclass(frozen=True)
class InferenceOptions(JsonMixin):
  """How eval, vis and export run the network on an image.

  Attributes:
    crop_size: (height, width) every image is padded to (the network is then
      built for that size); None pads each batch only to the next size
      k * output_stride + 1 that holds it (eval and vis only).
    scales: input scales; (1.0,) is single-scale inference.
    add_flipped_images: also run the left-right flipped image.
    image_pyramid: input scales merged inside the network in single-scale
      inference; None for (1.0,).
  """
  crop_size: Optional[Tuple[int, int]] = None
  scales: Tuple[float, ...] = (1.0,)
  add_flipped_images: bool = False
  image_pyramid: Optional[Tuple[float, ...]] = None

  def __post_init__(self):
    set_field(self, 'crop_size', tuple_or_none(self.crop_size))
    set_field(self, 'scales', tuple_or_none(self.scales, float) or (1.0,))
    set_field(self, 'image_pyramid',
              tuple_or_none(self.image_pyramid, float) or None)

  @property
  def multi_scale(self):
    return self.scales != (1.0,) or self.add_flipped_images

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(is_crop(self.crop_size), '{InferenceOptions.crop_size} must be '
          'HEIGHT,WIDTH with positive values, got %s'
          % _show(self.crop_size or ()))
    check(min(self.scales) > 0, '{InferenceOptions.scales} must be positive, '
          'got %s' % _show(self.scales))
    # The multi-scale network runs each scale (and its flip) alone, without
    # the pyramid: the pyramid was dropped without a word, as the
    # original's predict_labels_multi_scale drops it.
    check(not (self.multi_scale and self.image_pyramid not in (None, (1.0,))),
          '{InferenceOptions.image_pyramid}=%s works in single-scale '
          'inference only; multi-scale inference ({InferenceOptions.scales}=%s'
          '%s) would ignore it: leave out one or the other'
          % (_show(self.image_pyramid or ()), _show(self.scales),
             ', {InferenceOptions.add_flipped_images}'
             if self.add_flipped_images else ''))
    return self

  def check_holds(self, height, width, output_stride, what):
    """Raises ImageTooLargeError when a fixed crop_size is smaller than
    height x width, naming `what` ("image NAME", ...) and the crop size
    that holds it."""
    crop = self.crop_size
    if crop is None or (height <= crop[0] and width <= crop[1]):
      return
    need = fitting_size(max(height, crop[0]), max(width, crop[1]),
                        output_stride)
    raise ImageTooLargeError(
        '%s is %dx%d (height x width), larger than '
        '{InferenceOptions.crop_size}=%d,%d; pass '
        '{InferenceOptions.crop_size}=%d,%d (or larger), or leave '
        '{InferenceOptions.crop_size} unset to pad each image only as much '
        'as the output stride needs'
        % (what, height, width, crop[0], crop[1], need[0], need[1]))


@dataclasses.dataclass(frozen=True)
class EvalOptions(JsonMixin):
  """deeplab-eval: which split, how often, where the results go.

  Attributes:
    split: the split to score.
    batch_size: images per session run.
    follow: keep watching the checkpoint dir for new checkpoints; otherwise
      evaluate the latest (or given) checkpoint once.
    eval_interval_secs: follow mode: minimum seconds between evaluations.
    max_number_of_evaluations: follow mode: stop after this many; <= 0 means
      no limit.
    timeout_secs: follow mode: stop after waiting this long for a new
      checkpoint; None waits for ever.
    result_json: where the JSON result goes (None: eval_logdir/eval_result.json).
  """
  split: str = 'val'
  batch_size: int = 1
  follow: bool = False
  eval_interval_secs: float = 300.0
  max_number_of_evaluations: int = 0
  timeout_secs: Optional[float] = None
  result_json: Optional[str] = None

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(self.batch_size >= 1, '{EvalOptions.batch_size} must be >= 1, got '
          '%d' % self.batch_size)
    check(self.eval_interval_secs >= 0,
          '{EvalOptions.eval_interval_secs} must be >= 0')
    check(self.timeout_secs is None or self.timeout_secs >= 0,
          '{EvalOptions.timeout_secs} must be >= 0')
    return self


@dataclasses.dataclass(frozen=True)
class VisOptions(JsonMixin):
  """deeplab-vis: what to write for each image.

  Attributes:
    colormap: 'pascal', 'cityscapes', 'ade20k', or None for the dataset's
      palette.
    also_save_raw_predictions: also write single-channel PNGs of class ids.
    save_overlay: also write image | prediction | blend side by side.
    max_number_of_images: stop after this many images; <= 0 means all.
    overlay_alpha: weight of the prediction colours in the blend.
    legend: 'none' (the PNGs as they always were), 'on_image' (a strip
      beside the colour prediction and the overlay naming the classes
      present, largest share first) or 'file' (one legend.png of every
      class; the per-image PNGs unchanged). Raw PNGs never get one.
  """
  LEGEND_MODES: ClassVar[Tuple[str, ...]] = ('none', 'on_image', 'file')

  colormap: Optional[str] = None
  also_save_raw_predictions: bool = False
  save_overlay: bool = False
  max_number_of_images: int = 0
  overlay_alpha: float = 0.5
  legend: str = 'none'

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(0.0 <= self.overlay_alpha <= 1.0, '{VisOptions.overlay_alpha} must '
          'be in [0, 1], got %g' % self.overlay_alpha)
    check_one_of('{VisOptions.legend}', self.legend, self.LEGEND_MODES)
    return self


@dataclasses.dataclass(frozen=True)
class ExportOptions(JsonMixin):
  """deeplab-export: the exported graph's preprocessing and outputs.

  Attributes:
    inference: crop size (required here: images are padded to it, as the
      original export does), scales and flips.
    min_resize_value / max_resize_value / resize_factor: resize applied to
      the input before padding (the training run's values by default).
    with_probabilities: also export the softmax probabilities.
  """
  inference: InferenceOptions = InferenceOptions(crop_size=(513, 513))
  min_resize_value: Optional[int] = None
  max_resize_value: Optional[int] = None
  resize_factor: Optional[int] = None
  with_probabilities: bool = True

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(self.inference.crop_size is not None,
          '{InferenceOptions.crop_size} is required for export')
    self.inference.validate()
    return self
