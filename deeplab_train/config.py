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

from deeplab_train import atomic


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
    output_stride: ratio of input to backbone output resolution (4/8/16/32).
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
      raise ConfigError('--output_stride must be 4, 8, 16 or 32, got %d'
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
    object.__setattr__(self, 'crop_size', _tuple_or_none(self.crop_size))

  def validate(self):
    if self.crop_size is not None and (
        len(self.crop_size) != 2 or min(self.crop_size) < 1):
      raise ConfigError('crop size must be HEIGHT,WIDTH with positive values, '
                        'got %s' % (self.crop_size,))
    for flag in ('min_resize_value', 'max_resize_value', 'resize_factor'):
      if getattr(self, flag) is not None and getattr(self, flag) < 1:
        raise ConfigError('--%s must be >= 1 (or unset), got %s'
                          % (flag, getattr(self, flag)))
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
  return atomic.write_json(path, payload)


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
LEARNING_POLICIES = ('poly', 'step', 'cosine')
OPTIMIZERS = ('momentum', 'adam')
MIXED_PRECISION_MODES = ('none', 'bf16', 'fp16')


@dataclasses.dataclass(frozen=True)
class TrainOptions(_JsonMixin):
  """What the training graph is built from (towers, loss, optimiser, init).

  Field names are the original train.py flag names; defaults are its
  defaults, except `weight_decay=None`, which means the backbone registry
  entry's default (4e-5 for every built-in backbone, as the original).
  """
  train_batch_size: int = 8
  num_clones: int = 1
  clone_on_cpu: bool = False
  weight_decay: Optional[float] = None
  momentum: float = 0.9
  fine_tune_batch_norm: bool = True
  image_pyramid: Optional[Tuple[float, ...]] = None
  # Loss.
  upsample_logits: bool = True
  label_weights: Optional[Tuple[float, ...]] = None
  top_k_percent_pixels: float = 1.0
  hard_example_mining_step: int = 0
  # Learning rate.
  learning_policy: str = 'poly'
  base_learning_rate: float = 1e-4
  learning_rate_decay_factor: float = 0.1
  learning_rate_decay_step: int = 2000
  learning_power: float = 0.9
  training_number_of_steps: int = 30000
  slow_start_step: int = 0
  slow_start_learning_rate: float = 1e-4
  decay_steps: float = 0.0
  end_learning_rate: float = 0.0
  optimizer: str = 'momentum'
  adam_learning_rate: float = 0.001
  adam_epsilon: float = 1e-8
  # Graph-level random seed (initialisation); None: random.
  seed: Optional[int] = None
  last_layer_gradient_multiplier: float = 1.0
  last_layers_contain_logits_only: bool = False
  # Initialisation from a checkpoint.
  tf_initial_checkpoint: Optional[str] = None
  initialize_last_layer: bool = True
  # Summaries built into the graph.
  save_summaries_images: bool = False
  # Speed (see runtime/session_config.py): 'none', 'bf16' (CPU) or 'fp16'
  # (GPU, with dynamic loss scaling); XLA compilation of the network (see
  # train/graph.py); thread pools (None: every usable core, 0: TensorFlow's
  # choice).
  mixed_precision: str = 'none'
  use_xla: bool = False
  intra_op_parallelism_threads: Optional[int] = None
  inter_op_parallelism_threads: Optional[int] = None

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    set_('image_pyramid', _tuple_or_none(self.image_pyramid, float) or None)
    set_('label_weights', _tuple_or_none(self.label_weights, float) or None)

  @property
  def clone_batch_size(self):
    return self.train_batch_size // self.num_clones

  def validate(self):
    """Raises ConfigError naming the offending flag; returns self."""
    def need(ok, message):
      if not ok:
        raise ConfigError(message)
    need(self.train_batch_size >= 1,
         '--train_batch_size must be >= 1, got %d' % self.train_batch_size)
    need(self.num_clones >= 1,
         '--num_clones must be >= 1, got %d' % self.num_clones)
    need(self.train_batch_size % self.num_clones == 0,
         '--train_batch_size=%d is not divisible by --num_clones=%d: each '
         'tower takes an equal share of the batch; use a batch size that is '
         'a multiple of %d' % (self.train_batch_size, self.num_clones,
                               self.num_clones))
    need(self.weight_decay is None or self.weight_decay >= 0,
         '--weight_decay must be >= 0')
    need(0 <= self.momentum < 1, '--momentum must be in [0, 1)')
    need(0 < self.top_k_percent_pixels <= 1,
         '--top_k_percent_pixels must be in (0, 1], got %g'
         % self.top_k_percent_pixels)
    need(self.hard_example_mining_step >= 0,
         '--hard_example_mining_step must be >= 0')
    need(self.learning_policy in LEARNING_POLICIES,
         '--learning_policy must be one of %s, got %r'
         % ('/'.join(LEARNING_POLICIES), self.learning_policy))
    need(self.base_learning_rate >= 0, '--base_learning_rate must be >= 0')
    need(self.training_number_of_steps >= 1,
         '--training_number_of_steps must be >= 1')
    need(0 <= self.slow_start_step < self.training_number_of_steps,
         '--slow_start_step=%d must be >= 0 and smaller than '
         '--training_number_of_steps=%d'
         % (self.slow_start_step, self.training_number_of_steps))
    need(self.learning_rate_decay_step >= 1,
         '--learning_rate_decay_step must be >= 1')
    need(self.decay_steps >= 0, '--decay_steps must be >= 0 (0: the '
         'steps after the slow start)')
    need(self.end_learning_rate >= 0, '--end_learning_rate must be >= 0')
    need(self.optimizer in OPTIMIZERS, '--optimizer must be one of %s, got '
         '%r' % ('/'.join(OPTIMIZERS), self.optimizer))
    need(self.adam_learning_rate >= 0, '--adam_learning_rate must be >= 0')
    need(self.adam_epsilon > 0, '--adam_epsilon must be > 0')
    need(self.mixed_precision in MIXED_PRECISION_MODES,
         '--mixed_precision must be one of %s, got %r'
         % ('/'.join(MIXED_PRECISION_MODES), self.mixed_precision))
    for name in ('intra_op_parallelism_threads',
                 'inter_op_parallelism_threads'):
      need((getattr(self, name) or 0) >= 0,
           '--%s must be >= 0 (0: TensorFlow decides; unset: every core)'
           % name)
    need(self.last_layer_gradient_multiplier >= 0,
         '--last_layer_gradient_multiplier must be >= 0')
    if self.label_weights is not None:
      need(all(w >= 0 for w in self.label_weights),
           '--label_weights must be >= 0')
    if self.image_pyramid is not None:
      need(all(s > 0 for s in self.image_pyramid),
           '--image_pyramid scales must be > 0')
    return self


@dataclasses.dataclass(frozen=True)
class RunOptions(_JsonMixin):
  """How a training run is driven: logdir, checkpoints, stopping, logging.

  Attributes:
    train_logdir: checkpoints, summaries, deeplab_config.json and the lock.
    log_steps: a progress line every this many steps.
    save_interval_secs / save_interval_steps: a checkpoint when either is
      due (0 or None switches one off); a final one is always written when
      the run stops normally.
    save_summaries_secs: TensorBoard summaries interval (0: none).
    keep_checkpoint_max: checkpoints kept in train_logdir.
    max_run_seconds: stop (with a checkpoint) after this wall time.
    num_steps_more: stop after this many more steps than the logdir's
      checkpoint holds (never past training_number_of_steps).
    profile_logdir: write Chrome traces of a step every PROFILE_STEPS there.
    result_json: also write the result as JSON to this file.
  """
  train_logdir: str
  log_steps: int = 10
  save_interval_secs: Optional[float] = 1200
  save_interval_steps: Optional[int] = None
  save_summaries_secs: Optional[float] = 600
  keep_checkpoint_max: int = 5
  max_run_seconds: Optional[float] = None
  num_steps_more: Optional[int] = None
  profile_logdir: Optional[str] = None
  result_json: Optional[str] = None

  def validate(self):
    """Raises ConfigError naming the offending flag; returns self."""
    if not self.train_logdir:
      raise ConfigError('--train_logdir is required: the folder for '
                        'checkpoints and summaries')
    if self.log_steps < 1:
      raise ConfigError('--log_steps must be >= 1')
    for name in ('save_interval_secs', 'save_interval_steps',
                 'save_summaries_secs'):
      if (getattr(self, name) or 0) < 0:
        raise ConfigError('--%s must be >= 0 (0 switches it off)' % name)
    if self.keep_checkpoint_max < 1:
      raise ConfigError('--keep_checkpoint_max must be >= 1')
    if self.max_run_seconds is not None and self.max_run_seconds <= 0:
      raise ConfigError('--max_run_seconds must be > 0')
    if self.num_steps_more is not None and self.num_steps_more < 1:
      raise ConfigError('--num_steps_more must be >= 1')
    return self


def valid_crop_sizes_near(size, output_stride):
  """The two crop sizes around `size` of the form k * output_stride + 1."""
  below = (size - 1) // output_stride * output_stride + 1
  return below, below + output_stride


def check_training_setup(model_options, train_options):
  """Cross-checks of model and training options done before any graph.

  Args:
    model_options: ModelOptions (its crop_size is the training crop).
    train_options: TrainOptions.

  Returns:
    A list of warnings (strings) for the log.

  Raises:
    ConfigError: crop sizes that do not fit the output stride, or label
      weights that do not match the class count.
  """
  warnings = []
  stride = model_options.output_stride
  for size in model_options.crop_size or ():
    if (size - 1) % stride:
      lo, hi = valid_crop_sizes_near(size, stride)
      sizes = ','.join(str(s) for s in model_options.crop_size)
      raise ConfigError(
          '--train_crop_size=%s does not fit --output_stride=%d: each size '
          'must be a multiple of %d plus 1 so that features stay aligned with '
          'the labels; nearest valid size for %d: %s or %d'
          % (sizes, stride, stride, size,
             lo if lo > 1 else '(none below)', hi))
  weights = train_options.label_weights
  if weights is not None and len(weights) != model_options.num_classes:
    raise ConfigError('--label_weights has %d values but the dataset has %d '
                      'classes: give one weight per class'
                      % (len(weights), model_options.num_classes))
  if (train_options.fine_tune_batch_norm
      and train_options.clone_batch_size < 12):
    warnings.append(
        '--fine_tune_batch_norm=true with %d images per tower: batch-norm '
        'statistics from fewer than 12 images are noisy; use a larger '
        '--train_batch_size or --fine_tune_batch_norm=false'
        % train_options.clone_batch_size)
  return warnings


@dataclasses.dataclass(frozen=True)
class ClusterOptions(_JsonMixin):
  """Training across machines (see `deeplab_train.runtime.cluster_spec`).

  Attributes:
    ps_hosts / worker_hosts: 'host:port' of each ps / worker task (the
      chief first); empty for a single-machine run (or TF_CONFIG).
    job_name: 'ps' or 'worker' (None without a cluster).
    task: this process's index in its job (the original's --task).
    sync_replicas: synchronous updates (SyncReplicasOptimizer); False:
      asynchronous.
    num_replicas / num_ps_tasks: the original's flags; None follows the
      cluster, a value must match it.
    startup_delay_steps: asynchronous mode: worker i starts at global step
      i * startup_delay_steps (the original's flag).
  """
  ps_hosts: Tuple[str, ...] = ()
  worker_hosts: Tuple[str, ...] = ()
  job_name: Optional[str] = None
  task: int = 0
  sync_replicas: bool = True
  num_replicas: Optional[int] = None
  num_ps_tasks: Optional[int] = None
  startup_delay_steps: int = 15

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    set_('ps_hosts', _tuple_or_none(self.ps_hosts, str) or ())
    set_('worker_hosts', _tuple_or_none(self.worker_hosts, str) or ())

  def validate(self):
    """Raises ConfigError naming the offending flag; returns self."""
    if self.task < 0:
      raise ConfigError('--task must be >= 0, got %d' % self.task)
    if self.num_replicas is not None and self.num_replicas < 1:
      raise ConfigError('--num_replicas must be >= 1, got %d'
                        % self.num_replicas)
    if self.num_ps_tasks is not None and self.num_ps_tasks < 0:
      raise ConfigError('--num_ps_tasks must be >= 0, got %d'
                        % self.num_ps_tasks)
    if self.startup_delay_steps < 0:
      raise ConfigError('--startup_delay_steps must be >= 0, got %d'
                        % self.startup_delay_steps)
    return self


# ---------------------------------------------------------------------------
# Evaluation / visualisation / export (owner: evaluation/, export/).
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class InferenceOptions(_JsonMixin):
  """How eval, vis and export run the network on an image.

  Attributes:
    crop_size: (height, width) every image is padded to (the network is then
      built for that size); None pads each batch only to the next size
      k * output_stride + 1 that holds it (eval and vis only).
    scales: input scales (--eval_scales / --inference_scales); (1.0,) is
      single-scale inference.
    add_flipped_images: also run the left-right flipped image.
    image_pyramid: input scales merged inside the network (--image_pyramid)
      in single-scale inference; None for (1.0,).
  """
  crop_size: Optional[Tuple[int, int]] = None
  scales: Tuple[float, ...] = (1.0,)
  add_flipped_images: bool = False
  image_pyramid: Optional[Tuple[float, ...]] = None

  def __post_init__(self):
    object.__setattr__(self, 'crop_size', _tuple_or_none(self.crop_size))
    object.__setattr__(self, 'scales',
                       _tuple_or_none(self.scales, float) or (1.0,))
    object.__setattr__(self, 'image_pyramid',
                       _tuple_or_none(self.image_pyramid, float) or None)

  @property
  def multi_scale(self):
    return self.scales != (1.0,) or self.add_flipped_images

  def validate(self, crop_flag='eval_crop_size', scales_flag='eval_scales'):
    """Raises ConfigError naming the flag."""
    if self.crop_size is not None and (len(self.crop_size) != 2 or
                                       min(self.crop_size) < 1):
      raise ConfigError('--%s must be HEIGHT,WIDTH with positive values, '
                        'got %s' % (crop_flag, ','.join(map(str, self.crop_size))))
    if min(self.scales) <= 0:
      raise ConfigError('--%s must be positive, got %s'
                        % (scales_flag, ','.join(map(str, self.scales))))
    return self


@dataclasses.dataclass(frozen=True)
class EvalOptions(_JsonMixin):
  """deeplab-eval: which split, how often, where the results go.

  Attributes:
    split: the split to score (--eval_split).
    batch_size: images per session run (--eval_batch_size).
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
    """Raises ConfigError naming the flag."""
    if self.batch_size < 1:
      raise ConfigError('--eval_batch_size must be >= 1, got %d'
                        % self.batch_size)
    if self.eval_interval_secs < 0:
      raise ConfigError('--eval_interval_secs must be >= 0')
    if self.timeout_secs is not None and self.timeout_secs < 0:
      raise ConfigError('--eval_timeout_secs must be >= 0')
    return self


@dataclasses.dataclass(frozen=True)
class VisOptions(_JsonMixin):
  """deeplab-vis: what to write for each image.

  Attributes:
    colormap: 'pascal', 'cityscapes', 'ade20k', or None for the dataset's
      palette.
    also_save_raw_predictions: also write single-channel PNGs of class ids.
    save_overlay: also write image | prediction | blend side by side.
    max_number_of_images: stop after this many images; <= 0 means all.
    overlay_alpha: weight of the prediction colours in the blend.
  """
  colormap: Optional[str] = None
  also_save_raw_predictions: bool = False
  save_overlay: bool = False
  max_number_of_images: int = 0
  overlay_alpha: float = 0.5

  def validate(self):
    """Raises ConfigError naming the flag."""
    if not 0.0 <= self.overlay_alpha <= 1.0:
      raise ConfigError('--overlay_alpha must be in [0, 1], got %g'
                        % self.overlay_alpha)
    return self


@dataclasses.dataclass(frozen=True)
class ExportOptions(_JsonMixin):
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
    """Raises ConfigError naming the flag."""
    if self.inference.crop_size is None:
      raise ConfigError('--crop_size is required for export')
    self.inference.validate('crop_size', 'inference_scales')
    return self
