"""The training flags shared by deeplab-train and deeplab-bench.

The original train.py's names and defaults: towers, optimisation, loss,
fine-tuning, speed, the training crop and its augmentation. Importing this
module defines them once; `train_options()` and `preprocess_options()` turn
them into the library's option objects.

--label_weights takes one weight per class, or the name of a scheme that
derives them from the pixel counts of --train_split recorded in
--dataset_dir/dataset.json (data/stats.py has the formulas): auto /
auto_median (median-frequency balancing) or auto_inverse_sqrt.
"""
import dataclasses
import os

from absl import flags
from absl import logging

from deeplab_train import config
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.data import datasets
from deeplab_train.data import stats as stats_lib
from deeplab_train.runtime import cpu as cpu_lib

FLAGS = flags.FLAGS

# Option fields whose flag is not named after the field.
FLAG_NAMES = {'ModelOptions.crop_size': 'train_crop_size',
              'PreprocessOptions.crop_size': 'train_crop_size'}

# Towers.
_TOWER_TABLE = (
    ('integer', 'num_clones', 1,
     'Number of clones (towers) to deploy; the batch is split evenly '
     'between them.'),
    ('boolean', 'clone_on_cpu', False, 'Use CPUs to deploy clones.'),
    ('integer', 'train_batch_size', 8,
     'The number of images in each batch during training (all clones '
     'together).'),
)

# Optimisation.
_OPTIMISATION_TABLE = (
    ('enum', 'learning_policy', 'poly',
     'Learning rate policy for training.',
     {'enum_values': list(config.LEARNING_POLICIES)}),
    ('float', 'base_learning_rate', .0001,
     'The base learning rate for model training.'),
    ('float', 'learning_rate_decay_factor', 0.1,
     'The rate to decay the base learning rate.'),
    ('integer', 'learning_rate_decay_step', 2000,
     'Decay the base learning rate at a fixed step.'),
    ('float', 'learning_power', 0.9,
     'The power value used in the poly learning policy.'),
    ('float', 'decay_steps', 0.0,
     'Decay steps of the poly learning rate, and of the cosine one (which '
     'the original\'s train.py does not offer) (0: the steps after the '
     'slow start).'),
    ('float', 'end_learning_rate', 0.0,
     'The poly learning rate\'s value at the end of its decay.'),
    ('enum', 'optimizer', 'momentum',
     'Which optimizer to use.', {'enum_values': list(config.OPTIMIZERS)}),
    ('float', 'adam_learning_rate', 0.001, 'Adam\'s (constant) learning rate.'),
    ('float', 'adam_epsilon', 1e-08, 'Adam optimizer epsilon.'),
    ('integer', 'seed', None,
     'Random seed of the initialisation, input order and augmentation '
     '(unset: random).'),
    ('integer', 'training_number_of_steps', 30000,
     'The number of steps used for training.'),
    ('float', 'momentum', 0.9, 'The momentum value to use.'),
    ('float', 'weight_decay', None,
     'The value of the weight decay for training (default: the backbone '
     'family\'s, 0.00004 for every built-in one, as the original).'),
    ('integer', 'slow_start_step', 0,
     'Training model with small learning rate for few steps.'),
    ('float', 'slow_start_learning_rate', 1e-4,
     'Learning rate employed during slow start.'),
)

# Loss and last layers.
_LOSS_TABLE = (
    ('float', 'last_layer_gradient_multiplier', 1.0,
     'The gradient multiplier for last layers, which is used to boost the '
     'gradient of last layers if the value > 1.'),
    ('boolean', 'upsample_logits', True, 'Upsample logits during training.'),
    ('boolean', 'fine_tune_batch_norm', True,
     'Fine tune the batch norm parameters or not (needs 12 or more images '
     'per clone).'),
    ('integer', 'hard_example_mining_step', 0,
     'The training step in which exact hard example mining kicks off; the '
     'mining percent shrinks from 100% to top_k_percent_pixels until then.'),
    ('float', 'top_k_percent_pixels', 1.0,
     'The top k percent pixels (in terms of the loss values) used to '
     'compute loss during training.'),
    ('boolean', 'save_summaries_images', False,
     'Save sample inputs, labels, and semantic predictions as images to '
     'summary.'),
    ('float', 'drop_path_keep_prob', 1.0,
     'NAS backbones only: probability to keep each path in the cells when '
     'training; the last cell reaches it at training_number_of_steps, '
     'earlier cells and steps keep more (needs fine_tune_batch_norm).'),
)

# Speed (see deeplab-bench to measure them).
_SPEED_TABLE = (
    ('enum', 'mixed_precision', 'none',
     'Low-precision compute with fp32 variables, logits and loss: bf16 '
     '(CPUs with AVX512_BF16/AMX; oneDNN rewrite), fp16 (GPUs; with '
     'dynamic loss scaling), or auto: bf16 where the CPU has native '
     'bfloat16 and oneDNN may use it (not with TF_ENABLE_ONEDNN_OPTS=0 or '
     'ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16), else none (see '
     'docs/speed.md; results differ slightly from fp32 training).',
     {'enum_values': list(config.MIXED_PRECISION_MODES) + [cpu_lib.AUTO]}),
    ('boolean', 'use_xla', False,
     'Compile the network and its gradients with XLA (for GPUs; on CPUs a '
     'training step took 5-12x as long, see docs/speed.md).'),
    ('integer', 'intra_op_parallelism_threads', None,
     'Threads inside one op (unset: every usable core; 0: TensorFlow '
     'decides).'),
    ('integer', 'inter_op_parallelism_threads', None,
     'Ops run at once (unset: every usable core; 0: TensorFlow decides).'),
)

# Fine-tuning.
_FINE_TUNING_TABLE = (
    ('string', 'tf_initial_checkpoint', None,
     'The initial checkpoint (a prefix, or a directory: its latest '
     'checkpoint); ignored when train_logdir already holds one.'),
    ('boolean', 'initialize_last_layer', True,
     'Initialize the last layer from tf_initial_checkpoint.'),
    ('boolean', 'last_layers_contain_logits_only', False,
     'Only consider logits as last layers or not.'),
    ('boolean', 'allow_partial_initial_checkpoint', False,
     'Start from tf_initial_checkpoint even when it lacks most of the '
     'model\'s variables (refused otherwise: it is usually a checkpoint of '
     'another network; the missing ones start from random values).'),
)

# Dataset and augmentation.
_AUGMENTATION_TABLE = (
    ('string', 'train_split', 'train',
     'Which split of the dataset to be used for training.'),
    ('list', 'train_crop_size', '513,513',
     'Image crop size [height, width] during training; best each a '
     'multiple of output_stride plus 1 (others get a warning).'),
    ('float', 'min_scale_factor', 0.5,
     'Mininum scale factor for data augmentation.'),
    ('float', 'max_scale_factor', 2.,
     'Maximum scale factor for data augmentation.'),
    ('float', 'scale_factor_step_size', 0.25,
     'Scale factor step size for data augmentation.'),
)
flag_table.define(_TOWER_TABLE, _OPTIMISATION_TABLE, _LOSS_TABLE,
                  _SPEED_TABLE, _FINE_TUNING_TABLE,
                  _AUGMENTATION_TABLE)


# Every TrainOptions field is set by the flag of the same name.
_TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(config.TrainOptions))


def train_options(cpu_features=None, dataset_info=None):
  """TrainOptions from the flags, validated; --mixed_precision=auto
  resolved for `cpu_features` (default: this machine's, runtime/cpu.py)
  and the environment's oneDNN settings, bf16 refused where it would abort,
  a --label_weights scheme from the counts in `dataset_info` (default:
  --dataset_dir's dataset.json)."""
  values = {name: FLAGS[name].value for name in _TRAIN_FIELDS}
  values['label_weights'] = label_weights(dataset_info)
  asked = values['mixed_precision']
  mode, reason, refusal = cpu_lib.choose_mixed_precision(asked, cpu_features)
  if refusal:  # only for an explicit bf16: auto never picks it here
    raise config.ConfigError('--mixed_precision=bf16: %s', refusal)
  if reason and asked == cpu_lib.AUTO:
    logging.info('--mixed_precision=auto: %s (%s)', mode, reason)
  elif reason:
    logging.warning('--mixed_precision=bf16: %s, where bf16 trains slower '
                    'than float32 (--mixed_precision=auto would train in '
                    'float32 here)', reason)
  values['mixed_precision'] = mode
  return config.TrainOptions(**values).validate()


def label_weights(dataset_info=None):
  """--label_weights as one float per class, or None (all 1): the numbers
  given, or those a scheme derives from --train_split's pixel counts
  (stats.class_weights) in `dataset_info` (default: read from
  --dataset_dir's dataset.json), logged as a table.

  Raises:
    config.ConfigError: a scheme mixed with numbers, or no pixel counts of
      --train_split in --dataset_dir/dataset.json.
  """
  given = FLAGS.label_weights
  if not given:
    return None
  schemes = [w for w in given if isinstance(w, str)]
  if not schemes:
    return tuple(given)
  if len(given) > 1:
    raise config.ConfigError(
        '--label_weights=%s derives every class weight: give it alone, or '
        'one number per class', schemes[0])
  return _derived_weights(schemes[0], FLAGS.dataset_dir, FLAGS.train_split,
                          dataset_info)


def _derived_weights(scheme, dataset_dir, split, info=None):
  """The weights `scheme` gives for the counts of `split` in `info`, else
  in dataset_dir's dataset.json (see label_weights)."""
  if info is None and dataset_dir and os.path.isdir(dataset_dir):
    info = datasets.read_dataset_json(dataset_dir)
  counted = info.split_statistics(split) if info is not None else None
  if counted is None:
    where = (os.path.join(dataset_dir, datasets.DATASET_JSON)
             if dataset_dir else '--dataset_dir/dataset.json')
    raise config.ConfigError(
        '--label_weights=%s needs the pixel counts of split %r, which %s '
        'does not hold: run deeplab-stats --dataset_dir=%s --split=%s '
        '--write_dataset_json, or rebuild the split with deeplab-build-data',
        scheme, split, where, dataset_dir or 'DIR', split)
  try:
    weights, absent = stats_lib.class_weights(counted.class_pixels, scheme,
                                              info.ignore_label)
  except config.ConfigError as e:
    raise config.ConfigError('--label_weights=%s: split %r: %s', scheme,
                             split, str(e)) from None
  logging.info('--label_weights=%s: weight_c = %s, from the %d labelled '
               'pixels of split %r:\n%s', scheme,
               stats_lib.WEIGHT_FORMULAS[scheme], counted.labelled_pixels,
               split, stats_lib.format_weights(weights, counted.class_pixels,
                                               info.class_names,
                                               info.ignore_label))
  if absent:
    logging.warning(
        '--label_weights=%s: split %r has no pixel of %s: given the largest '
        'weight, %.4g', scheme, split, ', '.join(
            stats_lib.class_label(i, info.class_names) for i in absent),
        weights[absent[0]])
  return weights


def train_crop():
  """--train_crop_size as (height, width)."""
  crop = common_flags.parse_int_list(FLAGS.train_crop_size, 'train_crop_size')
  if len(crop) != 2 or min(crop) < 1:
    raise config.ConfigError('--train_crop_size must be HEIGHT,WIDTH, got %s'
                             % ','.join(FLAGS.train_crop_size))
  return crop


def preprocess_options(crop, saved_preprocess=None):
  """The training PreprocessOptions: crop, augmentation and the (reconciled)
  resize flags."""
  return config.PreprocessOptions(
      crop_size=crop, min_scale_factor=FLAGS.min_scale_factor,
      max_scale_factor=FLAGS.max_scale_factor,
      scale_factor_step_size=FLAGS.scale_factor_step_size,
      **common_flags.resize_values(saved_preprocess)).validate()
