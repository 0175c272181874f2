"""What the training graph is built from (owned by train/), and the checks
across model and training options done before any graph."""
import dataclasses
from typing import Optional, Tuple

from deeplab_train.config.errors import ConfigError
from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_finite
from deeplab_train.config.errors import check_one_of
from deeplab_train.config.errors import field_ref
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.config.serialize import set_field
from deeplab_train.config.serialize import tuple_or_none

LEARNING_POLICIES = ('poly', 'step', 'cosine')
OPTIMIZERS = ('momentum', 'adam')
MIXED_PRECISION_MODES = ('none', 'bf16', 'fp16')
# Fewer images per tower give noisy batch-norm statistics.
MIN_BATCH_NORM_IMAGES = 12


@dataclasses.dataclass(frozen=True)
class TrainOptions(JsonMixin):
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
  # NAS backbones: the last cell's probability to keep each path at the
  # end of training (see model/nas_cell.py); 1 for no drop path.
  drop_path_keep_prob: float = 1.0
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
  # Accept an initial checkpoint that lacks most of the model's variables
  # (refused otherwise: usually a checkpoint of another network).
  allow_partial_initial_checkpoint: bool = False
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
    for name in ('image_pyramid', 'label_weights'):
      set_field(self, name, tuple_or_none(getattr(self, name), float) or None)

  @property
  def clone_batch_size(self):
    return self.train_batch_size // self.num_clones

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    self._validate_towers()
    self._validate_loss()
    self._validate_schedule()
    self._validate_speed()
    self._validate_last_layers()
    return self

  def _validate_towers(self):
    batch, clones = self.train_batch_size, self.num_clones
    check(batch >= 1,
          '{TrainOptions.train_batch_size} must be >= 1, got %d' % batch)
    check(clones >= 1, '{TrainOptions.num_clones} must be >= 1, got %d' % clones)
    check(batch % clones == 0,
          '{TrainOptions.train_batch_size}=%d is not divisible by '
          '{TrainOptions.num_clones}=%d: each tower takes an equal share of '
          'the batch; use a batch size that is a multiple of %d'
          % (batch, clones, clones))

  def _validate_loss(self):
    check(self.weight_decay is None or self.weight_decay >= 0,
          '{TrainOptions.weight_decay} must be >= 0')
    check(0 <= self.momentum < 1, '{TrainOptions.momentum} must be in [0, 1)')
    check(0 < self.top_k_percent_pixels <= 1,
          '{TrainOptions.top_k_percent_pixels} must be in (0, 1], got %g'
          % self.top_k_percent_pixels)
    check(self.hard_example_mining_step >= 0,
          '{TrainOptions.hard_example_mining_step} must be >= 0')
    keep = self.drop_path_keep_prob
    check(0 < keep <= 1, '{TrainOptions.drop_path_keep_prob} must be in '
          '(0, 1], got %g' % keep)
    # The original's NAS backbones drop paths only while batch norm trains.
    check(keep == 1 or self.fine_tune_batch_norm,
          '{TrainOptions.drop_path_keep_prob}=%g needs '
          '{TrainOptions.fine_tune_batch_norm}=true: as in the original, the '
          'NAS cells drop paths only while batch norm is trained' % keep)

  def _validate_last_layers(self):
    check(self.last_layer_gradient_multiplier >= 0,
          '{TrainOptions.last_layer_gradient_multiplier} must be >= 0')
    check(all(w >= 0 for w in self.label_weights or ()),
          '{TrainOptions.label_weights} must be >= 0')
    check(all(s > 0 for s in self.image_pyramid or ()),
          '{TrainOptions.image_pyramid} scales must be > 0')

  def _validate_schedule(self):
    check_one_of(field_ref(self, 'learning_policy'), self.learning_policy,
                 LEARNING_POLICIES)
    check(self.base_learning_rate >= 0,
          '{TrainOptions.base_learning_rate} must be >= 0')
    check(self.training_number_of_steps >= 1,
          '{TrainOptions.training_number_of_steps} must be >= 1')
    # slow_start_step >= training_number_of_steps is allowed (the original
    # allowed it: the whole run at the slow-start rate); the schedule warns.
    check(self.slow_start_step >= 0,
          '{TrainOptions.slow_start_step} must be >= 0, got %d'
          % self.slow_start_step)
    check(self.learning_rate_decay_step >= 1,
          '{TrainOptions.learning_rate_decay_step} must be >= 1')
    check(self.decay_steps >= 0, '{TrainOptions.decay_steps} must be >= 0 '
          '(0: the steps after the slow start)')
    check(self.end_learning_rate >= 0,
          '{TrainOptions.end_learning_rate} must be >= 0')
    # A negative rate, factor or power trained uphill or let the rate grow
    # without bound, without a word.
    check(self.slow_start_learning_rate >= 0,
          '{TrainOptions.slow_start_learning_rate} must be >= 0, got %g'
          % self.slow_start_learning_rate)
    check(self.learning_rate_decay_factor >= 0,
          '{TrainOptions.learning_rate_decay_factor} must be >= 0, got %g'
          % self.learning_rate_decay_factor)
    check(self.learning_power >= 0,
          '{TrainOptions.learning_power} must be >= 0, got %g'
          % self.learning_power)
    check_one_of(field_ref(self, 'optimizer'), self.optimizer,
                 OPTIMIZERS)
    check(self.adam_learning_rate >= 0,
          '{TrainOptions.adam_learning_rate} must be >= 0')
    check(self.adam_epsilon > 0, '{TrainOptions.adam_epsilon} must be > 0')

  def _validate_speed(self):
    check_one_of(field_ref(self, 'mixed_precision'), self.mixed_precision,
                 MIXED_PRECISION_MODES)
    for name in ('intra_op_parallelism_threads',
                 'inter_op_parallelism_threads'):
      check((getattr(self, name) or 0) >= 0, '%s must be >= 0 (0: TensorFlow '
            'decides; unset: every core)' % field_ref(self, name))


def valid_crop_sizes_near(size, output_stride):
  """The two crop sizes around `size` of the form k * output_stride + 1."""
  below = (size - 1) // output_stride * output_stride + 1
  return below, below + output_stride


def check_training_setup(model_options, train_options, towers_on_cpu=False):
  """Cross-checks of model and training options done before any graph.

  Args:
    model_options: ModelOptions (its crop_size is the training crop).
    train_options: TrainOptions.
    towers_on_cpu: whether the towers will run on a CPU (no GPU, or
      clone_on_cpu).

  Returns:
    A list of warnings for the log, with {owner.field} references (see
    config.errors.render).

  Raises:
    ConfigError: crop sizes no larger than the output stride, or label
      weights that do not match the class count.
  """
  stride = model_options.output_stride
  sizes = ','.join(str(s) for s in model_options.crop_size or ())
  unaligned, off = [], 0
  for size in model_options.crop_size or ():
    # 1 (= 0 * stride + 1) leaves the network no feature to learn from:
    # the smallest valid size is stride + 1.
    if size <= stride:
      raise ConfigError(
          '{ModelOptions.crop_size}=%s does not fit '
          '{ModelOptions.output_stride}=%d: each size must be larger than '
          'the stride, best a multiple of it plus 1; nearest valid size '
          'for %d: (none below) or %d' % (sizes, stride, size, stride + 1))
    lo, hi = valid_crop_sizes_near(size, stride)
    near = '%d: %d or %d' % (size, lo, hi)
    if (size - 1) % stride and near not in unaligned:
      unaligned.append(near)
      # ceil(size / stride) features, the last one's field centred at
      # stride * (that - 1); the upsampling puts it at size - 1.
      off = max(off, size - 1 - stride * (-(-size // stride) - 1))
  warnings = []
  if unaligned:
    # The original trains such crops (512,512 is common).
    warnings.append(
        '{ModelOptions.crop_size}=%s is not a multiple of '
        '{ModelOptions.output_stride}=%d plus 1: the upsampled logits lie '
        'off their features on the labels, by up to %d pixels at the far '
        'edge (the original trains it so too); the nearest aligned sizes '
        'for %s' % (sizes, stride, off, '; for '.join(unaligned)))
  weights = train_options.label_weights
  check(weights is None or len(weights) == model_options.num_classes,
        '{TrainOptions.label_weights} has %d values but the dataset has %d '
        'classes: give one weight per class'
        % (len(weights or ()), model_options.num_classes))
  if (train_options.fine_tune_batch_norm
      and train_options.clone_batch_size < MIN_BATCH_NORM_IMAGES):
    warnings.append(
        '{TrainOptions.fine_tune_batch_norm}=true with %d images per tower: '
        'batch-norm statistics from fewer than %d images are noisy; use a '
        'larger {TrainOptions.train_batch_size} or '
        '{TrainOptions.fine_tune_batch_norm}=false'
        % (train_options.clone_batch_size, MIN_BATCH_NORM_IMAGES))
  if train_options.use_xla and towers_on_cpu:
    warnings.append(XLA_ON_CPU)
  if train_options.mixed_precision == 'fp16' and towers_on_cpu:
    warnings.append(FP16_ON_CPU)
  if train_options.optimizer == 'adam':
    defaults = TrainOptions()
    unused = [name for name in _SCHEDULE_FIELDS
              if getattr(train_options, name) != getattr(defaults, name)]
    if unused:
      warnings.append(
          '{TrainOptions.optimizer}=adam trains at the constant '
          '{TrainOptions.adam_learning_rate}=%g, as in the original: %s '
          'set no rate for it' % (train_options.adam_learning_rate, ', '.join(
              '{TrainOptions.%s}' % name for name in unused)))
  return warnings


# What sets the rate of the momentum optimizer only (Adam's is constant).
_SCHEDULE_FIELDS = ('base_learning_rate', 'learning_policy',
                    'learning_rate_decay_factor', 'learning_rate_decay_step',
                    'learning_power', 'slow_start_step',
                    'slow_start_learning_rate', 'decay_steps',
                    'end_learning_rate', 'momentum')


# TensorFlow's float16 rewrite (grappler's auto_mixed_precision) changes
# GPU ops only; its notice is a C++ log line that TF_CPP_MIN_LOG_LEVEL=2
# hides.
FP16_ON_CPU = ('{TrainOptions.mixed_precision}=fp16 with the towers on the '
               "CPU: TensorFlow's float16 rewrite changes GPU ops only, so "
               'the step runs in float32 here (with the loss scaling of fp16); '
               "{TrainOptions.mixed_precision}=bf16 is the CPU's reduced "
               'precision')


# The network compiled by XLA for a CPU trains far slower than on
# TensorFlow's oneDNN kernels: on a 2-core Xeon with AMX, crop 321, with /
# without --use_xla, mobilenet_v2 OS8 9.1x (fp32) and 12x (bf16) as long a
# step, xception_65 OS16 5.6x (fp32); docs/speed.md.
XLA_ON_CPU = ('{TrainOptions.use_xla} with the towers on the CPU: XLA\'s CPU '
              'kernels made a training step 5-12x slower than without it '
              '(docs/speed.md); it is meant for GPUs')
