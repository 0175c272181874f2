"""Frozen option dataclasses passed from the command line into the library.

Flags are parsed in `deeplab_train/cli/` only; each command turns them into
the dataclasses below and hands the library the slice it needs. Every class
has `validate()` (raises `ValueError` with a message naming the flag) and
round-trips through JSON so the model options can be saved beside the
checkpoints and read back by eval, vis and export.

Each area owns one section of this file; keep edits inside your section.
"""
import dataclasses
import json
import os
from typing import Optional, Tuple


class ConfigError(ValueError):
  """Bad user input: the message names the flag or file and what to do."""


def _tuple_or_none(value, cast=int):
  if value is None:
    return None
  if isinstance(value, (str, bytes)):
    value = [value]
  return tuple(cast(v) for v in value)


class _JsonMixin:
  """to_dict / from_dict / to_json / from_json for flat frozen dataclasses."""

  def to_dict(self):
    out = {}
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      out[f.name] = list(v) if isinstance(v, tuple) else v
    return out

  @classmethod
  def from_dict(cls, d):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ConfigError('%s: unknown field(s) %s' % (cls.__name__, unknown))
    return cls(**d)

  def to_json(self):
    return json.dumps(self.to_dict(), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text):
    return cls.from_dict(json.loads(text))

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------
# Model (owner: model/). Mirrors the original's common.ModelOptions with the
# flag defaults of the original common.py / train.py.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelOptions(_JsonMixin):
  """What defines the network (and so the checkpoint's variables).

  Attributes:
    num_classes: classes of the 'semantic' output.
    model_variant: backbone name (see `deeplab_train.model.known_variants`).
    crop_size: (height, width) the network is built for, or None for
      dynamic shapes (image pooling then uses the tensor's own size).
    atrous_rates: rates of the atrous ASPP branches; None for none.
    output_stride: ratio of input to backbone output resolution (8/16/32).
    decoder_output_stride: strides of the decoder stages, e.g. (4,); None
      for no decoder.
    multi_grid: unit rates of the last backbone block (resnet variants).
    image_pooling_crop_size / image_pooling_stride: the original's options
      for image-level pooling at a size other than the crop.
    depth_multiplier: channel multiplier (mobilenet_v2).
    divisible_by: channel rounding for mobilenet_v2 (None: the net's default).
    merge_method: 'max' or 'avg' over the scales of an image pyramid.
    prediction_with_upsampled_logits: upsample logits before argmax.
    use_bounded_activation: relu6 in place of relu in ASPP/decoder.
    batch_norm_decay: decay of the BN moving averages in ASPP/decoder.
  """
  num_classes: int = 21
  model_variant: str = 'mobilenet_v2'
  crop_size: Optional[Tuple[int, int]] = None
  atrous_rates: Optional[Tuple[int, ...]] = None
  output_stride: int = 16
  decoder_output_stride: Optional[Tuple[int, ...]] = None
  decoder_use_separable_conv: bool = True
  aspp_with_batch_norm: bool = True
  aspp_with_separable_conv: bool = True
  add_image_level_feature: bool = True
  image_pooling_crop_size: Optional[Tuple[int, int]] = None
  image_pooling_stride: Tuple[int, int] = (1, 1)
  multi_grid: Optional[Tuple[int, ...]] = None
  depth_multiplier: float = 1.0
  divisible_by: Optional[int] = None
  logits_kernel_size: int = 1
  merge_method: str = 'max'
  prediction_with_upsampled_logits: bool = True
  use_bounded_activation: bool = False
  aspp_convs_filters: int = 256
  decoder_filters: int = 256
  batch_norm_decay: float = 0.9997

  def __post_init__(self):
    # Normalise sequences (lists from JSON, strings from flags) to tuples so
    # the options stay hashable and compare equal after a JSON round trip.
    set_ = lambda k, v: object.__setattr__(self, k, v)
    set_('crop_size', _tuple_or_none(self.crop_size))
    set_('atrous_rates', _tuple_or_none(self.atrous_rates) or None)
    set_('decoder_output_stride',
         _tuple_or_none(self.decoder_output_stride) or None)
    set_('image_pooling_crop_size',
         _tuple_or_none(self.image_pooling_crop_size))
    set_('image_pooling_stride', _tuple_or_none(self.image_pooling_stride))
    set_('multi_grid', _tuple_or_none(self.multi_grid) or None)
    set_('depth_multiplier', float(self.depth_multiplier))

  def validate(self):
    """Raises ConfigError naming the offending flag."""
    if self.num_classes < 1:
      raise ConfigError('num_classes must be >= 1, got %d' % self.num_classes)
    if self.output_stride not in (4, 8, 16, 32):
      raise ConfigError('--output_stride must be 8, 16 or 32, got %d'
                        % self.output_stride)
    if self.decoder_output_stride:
      for s in self.decoder_output_stride:
        if s >= self.output_stride or self.output_stride % s:
          raise ConfigError(
              '--decoder_output_stride=%s must divide and be smaller than '
              '--output_stride=%d' % (','.join(map(str, self.decoder_output_stride)),
                                      self.output_stride))
      if list(self.decoder_output_stride) != sorted(
          self.decoder_output_stride, reverse=True):
        raise ConfigError('--decoder_output_stride must be in decreasing '
                          'order, e.g. 8,4; got %s' % (self.decoder_output_stride,))
    if self.crop_size is not None and len(self.crop_size) != 2:
      raise ConfigError('crop size must be HEIGHT,WIDTH, got %s'
                        % (self.crop_size,))
    if self.merge_method not in ('max', 'avg'):
      raise ConfigError("--merge_method must be 'max' or 'avg', got %r"
                        % self.merge_method)
    if self.depth_multiplier <= 0:
      raise ConfigError('--depth_multiplier must be > 0')
    if self.logits_kernel_size < 1:
      raise ConfigError('--logits_kernel_size must be >= 1')
    return self


# ---------------------------------------------------------------------------
# Data and preprocessing (owner: data/).
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PreprocessOptions(_JsonMixin):
  """The original's input_preprocess settings.

  Resize options also apply at export time (they are saved with the model).
  """
  crop_size: Tuple[int, int] = (513, 513)
  min_resize_value: Optional[int] = None
  max_resize_value: Optional[int] = None
  resize_factor: Optional[int] = None
  min_scale_factor: float = 1.0
  max_scale_factor: float = 1.0
  scale_factor_step_size: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, 'crop_size', _tuple_or_none(self.crop_size))

  def validate(self):
    if len(self.crop_size) != 2 or min(self.crop_size) < 1:
      raise ConfigError('crop size must be HEIGHT,WIDTH with positive values, '
                        'got %s' % (self.crop_size,))
    if self.min_scale_factor <= 0 or self.max_scale_factor < self.min_scale_factor:
      raise ConfigError('--min_scale_factor must be > 0 and <= '
                        '--max_scale_factor (got %g, %g)'
                        % (self.min_scale_factor, self.max_scale_factor))
    if self.scale_factor_step_size < 0:
      raise ConfigError('--scale_factor_step_size must be >= 0')
    return self


# ---------------------------------------------------------------------------
# The model config saved beside the checkpoints (written by deeplab-train,
# read by deeplab-eval, deeplab-vis and deeplab-export).
# ---------------------------------------------------------------------------
RUN_CONFIG_FILENAME = 'deeplab_config.json'


def save_run_config(logdir, model_options, preprocess_options, dataset):
  """Atomically writes `deeplab_config.json` into `logdir`.

  Args:
    logdir: the training directory.
    model_options: ModelOptions.
    preprocess_options: PreprocessOptions (resize settings matter at export).
    dataset: dict with at least 'name', 'num_classes', 'ignore_label'.

  Returns:
    The path written.
  """
  path = os.path.join(logdir, RUN_CONFIG_FILENAME)
  payload = {'model_options': model_options.to_dict(),
             'preprocess_options': preprocess_options.to_dict(),
             'dataset': dict(dataset)}
  tmp = '%s.tmp-%d' % (path, os.getpid())
  with open(tmp, 'w') as f:
    json.dump(payload, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return path


def load_run_config(logdir_or_file):
  """Reads what `save_run_config` wrote.

  Args:
    logdir_or_file: the training directory, or the JSON file itself.

  Returns:
    (ModelOptions, PreprocessOptions, dataset dict), or None when there is no
    saved config (e.g. a model-zoo checkpoint directory).

  Raises:
    ConfigError: the file exists but cannot be read.
  """
  path = logdir_or_file
  if os.path.isdir(path):
    path = os.path.join(path, RUN_CONFIG_FILENAME)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      payload = json.load(f)
    return (ModelOptions.from_dict(payload['model_options']),
            PreprocessOptions.from_dict(payload['preprocess_options']),
            payload['dataset'])
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError('%s is not a valid deeplab config (%s); delete it and '
                      'pass the model flags instead' % (path, e)) from None


# ---------------------------------------------------------------------------
# Training (owner: train/). Added by the trainer.
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Evaluation / visualisation / export (owner: evaluation/, export/).
# ---------------------------------------------------------------------------
