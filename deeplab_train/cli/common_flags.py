"""Flags shared by deeplab-train, -eval, -vis and -export.

The names and defaults are the original DeepLab's (common.py and the per-command
scripts), so existing command lines keep working. Importing this module defines
them once; each command module defines only its own extra flags.

The model options saved in a train logdir (`deeplab_config.json`) win over
flag defaults; a model flag given explicitly that contradicts them is an
error, so eval/vis/export never silently build a different network than the
one that was trained.
"""

import os

from absl import flags
from absl import logging

from deeplab_train import config
from deeplab_train.cli import flag_table
from deeplab_train.data import datasets
from deeplab_train.data import stats as stats_lib

FLAGS = flags.FLAGS

# Dataset.
_DATASET_TABLE = (
    ('string', 'dataset', 'pascal_voc_seg',
     'Dataset name: pascal_voc_seg, cityscapes, ade20k, or any dataset '
     'described by a dataset.json in --dataset_dir.'),
    ('string', 'dataset_dir', None, 'Folder of the TFRecord shards.'),
)

# Preprocessing (also applied at export time).
_RESIZE_TABLE = (
    ('integer', 'min_resize_value', None,
     'Desired size of the smaller image side.'),
    ('integer', 'max_resize_value', None,
     'Maximum allowed size of the larger image side.'),
    ('integer', 'resize_factor', None,
     'Resized dimensions are multiple of factor plus one.'),
    ('boolean', 'keep_aspect_ratio', True,
     'Accepted for the original\'s command lines, which define it: resizing '
     'by --min_resize_value / --max_resize_value always keeps the aspect '
     'ratio, as the original\'s did (it reads this flag nowhere).'),
)

# The original's flags that several of its commands define, with the
# meaning deeplab-train gives them; defined here once, so that a command
# line (or flagfile) shared by the original's commands works with each.
_SHARED_TABLE = (
    ('string', 'master', '',
     'Address of a TensorFlow server to run the session on (the original\'s '
     'flag). deeplab-train: leave empty for in-process, and use '
     '--ps_hosts/--worker_hosts or TF_CONFIG for clusters; the other '
     'commands run in their own process and accept only the empty value.'),
    ('integer', 'quantize_delay_step', -1,
     'Quantised training and quantised evaluation graphs (not supported: '
     'only -1 is accepted; deeplab-export --tflite_quantize quantises an '
     'exported model).'),
)


# Model (the original's common.py and per-command model flags).
_MODEL_TABLE = (
    ('string', 'model_variant', 'mobilenet_v2',
     'DeepLab model variant (the backbone): mobilenet_v2, '
     'mobilenet_v3_large_seg, mobilenet_v3_small_seg, mobilenet_edgetpu, '
     'xception_41, xception_65, xception_71, resnet_v1_18, '
     'resnet_v1_18_beta, resnet_v1_50, resnet_v1_50_beta, resnet_v1_101, '
     'resnet_v1_101_beta, nas_pnasnet or nas_hnasnet.'),
    ('multi_integer', 'atrous_rates', None,
     'Atrous rates for atrous spatial pyramid pooling (repeat the flag, '
     '--atrous_rates=6 --atrous_rates=12, or give a comma list, '
     '--atrous_rates=6,12).'),
    ('integer', 'output_stride', 16,
     'Ratio of input to output spatial resolution.'),
    ('list', 'decoder_output_stride', None,
     'Comma-separated output strides of the decoder stages, e.g. 4; not '
     'set: no decoder.'),
    ('boolean', 'decoder_use_separable_conv', True,
     'Employ separable convolution for decoder or not.'),
    ('multi_float', 'image_pyramid', None,
     'Input scales for multi-scale feature extraction.'),
    ('boolean', 'add_image_level_feature', True, 'Add image level feature.'),
    ('list', 'image_pooling_crop_size', None,
     'Image pooling crop size [height, width] used in the ASPP module; not '
     'set: the crop size.'),
    ('list', 'image_pooling_stride', '1,1',
     'Image pooling stride [height, width] used in the ASPP image pooling '
     'module.'),
    ('boolean', 'aspp_with_batch_norm', True,
     'Use batch norm parameters for ASPP or not.'),
    ('boolean', 'aspp_with_separable_conv', True,
     'Use separable convolution for ASPP or not.'),
    ('multi_integer', 'multi_grid', None,
     'Employ a hierarchy of atrous rates for ResNet.'),
    ('float', 'depth_multiplier', 1.0,
     'Multiplier for the depth (number of channels) of all convolution ops '
     'used in MobileNet.'),
    ('integer', 'divisible_by', None,
     'An integer that ensures the layer # channels are divisible by this '
     'value. Used in MobileNet.'),
    ('integer', 'logits_kernel_size', 1,
     'The kernel size for the convolutional kernel that generates logits.'),
    ('enum', 'merge_method', 'max',
     'Scheme to merge multi scale features.', {'enum_values': ['max', 'avg']}),
    ('boolean', 'prediction_with_upsampled_logits', True,
     'Upsample logits before argmax (True) or argmax then upsample the '
     'labels (False).'),
    ('boolean', 'use_bounded_activation', False,
     'Use bounded activations (relu6) in ASPP and decoder.'),
    ('integer', 'aspp_convs_filters', 256,
     'Number of filters in the ASPP convolutions.'),
    ('integer', 'decoder_filters', 256,
     'Number of filters in the decoder convolutions.'),
    ('float', 'batch_norm_decay', 0.9997,
     'Batch norm decay of the ASPP and decoder layers.'),
    ('boolean', 'aspp_with_concat_projection', True,
     'Project the concatenated ASPP branches with a 1x1 convolution.'),
    ('boolean', 'aspp_with_squeeze_and_excitation', False,
     'Use the image pooling branch as a squeeze-and-excitation gate of the '
     'ASPP output (MobileNetV3).'),
    ('boolean', 'image_se_uses_qsigmoid', False,
     'The squeeze-and-excitation gate is a hard sigmoid.'),
    ('boolean', 'decoder_use_sum_merge', False,
     'The decoder sums its features instead of concatenating them.'),
    ('boolean', 'decoder_output_is_logits', False,
     'The decoder\'s last layer outputs the logits.'),
    ('integer', 'nas_stem_output_num_conv_filters', 20,
     'Number of filters of the NAS stem output tensor.'),
    ('boolean', 'nas_use_classification_head', False,
     'Use the NAS backbone\'s classification head.'),
    ('boolean', 'nas_remove_os32_stride', False,
     'Remove the stride of the NAS backbone\'s output stride 32 cell.'),
    ('string', 'dense_prediction_cell_json', '',
     'A JSON file describing the dense prediction cell that replaces ASPP; '
     'deeplab/core/dense_prediction_cell_branch5_top1_cityscapes.json (the '
     'original\'s path) or that bare file name give the model zoo\'s cell, '
     'shipped with deeplab-train. Empty: ASPP.'),
)
# Exported models (deeplab-eval, -vis and -bench import this module).
_EXPORTED_TABLE = (
    ('multi_string', 'exported_model', None,
     'An exported model (a frozen .pb, a SavedModel folder or a .tflite '
     'file): deeplab-eval and deeplab-vis use it (one) instead of a '
     'checkpoint; deeplab-bench measures the inference speed of each one '
     '(repeat the flag or give a comma list).'),
)
flag_table.define(_DATASET_TABLE, _RESIZE_TABLE, _SHARED_TABLE, _MODEL_TABLE,
                  _EXPORTED_TABLE)


class _LabelWeightParser(flags.FloatParser):
  """A class weight (a number) or the name of a weighting scheme."""

  syntactic_help = 'a number or one of %s' % ', '.join(
      stats_lib.WEIGHT_SCHEMES)

  def convert(self, argument):
    if isinstance(argument, str) and argument.strip() in (
        stats_lib.WEIGHT_SCHEMES):
      return argument.strip()
    try:
      return super().convert(argument)
    except ValueError:
      raise ValueError('%r is neither a number nor one of %s'
                       % (argument, ', '.join(stats_lib.WEIGHT_SCHEMES))
                       ) from None

  def is_outside_bounds(self, val):
    return False  # TrainOptions.validate refuses negative weights

  def flag_type(self):
    return 'float or scheme'


flag_table.define_comma_multi(
    _LabelWeightParser(), 'label_weights', None,
    'deeplab-train: one loss weight per class (repeat the flag, or a comma '
    'list); unset: all '
    '1. Or one of these schemes, deriving the weights from the pixel counts '
    'of --train_split in --dataset_dir/dataset.json (freq_c: class c\'s '
    'share of the labelled pixels, ignore excluded): auto or auto_median: '
    'median(freq) / freq_c (median-frequency balancing, median over the '
    'classes present); auto_inverse_sqrt: 1 / sqrt(freq_c), normalised to '
    'mean 1 over the classes present. A class with no pixel gets the '
    'largest weight (with a warning). The counts are written by '
    'deeplab-build-data, or by deeplab-stats --write_dataset_json. The '
    'other commands accept it and ignore it, as the original\'s did.')


# ModelOptions field -> flag name, for the fields set from flags.
_MODEL_FLAGS = (
    'model_variant', 'atrous_rates', 'output_stride', 'decoder_output_stride',
    'decoder_use_separable_conv', 'add_image_level_feature',
    'image_pooling_crop_size', 'image_pooling_stride', 'aspp_with_batch_norm',
    'aspp_with_separable_conv', 'multi_grid', 'depth_multiplier',
    'divisible_by', 'logits_kernel_size', 'merge_method',
    'prediction_with_upsampled_logits', 'use_bounded_activation',
    'aspp_convs_filters', 'decoder_filters', 'batch_norm_decay',
    'aspp_with_concat_projection', 'aspp_with_squeeze_and_excitation',
    'image_se_uses_qsigmoid', 'decoder_use_sum_merge',
    'decoder_output_is_logits', 'nas_stem_output_num_conv_filters',
    'nas_use_classification_head', 'nas_remove_os32_stride')
# ModelOptions fields set from a flag of another name, by reading it.
_MODEL_FIELD_FLAGS = {'dense_prediction_cell_config':
                      'dense_prediction_cell_json'}
_RESIZE_FLAGS = ('min_resize_value', 'max_resize_value', 'resize_factor')


def parse_int_list(value, flag_name):
  """'513,513' or ['513', '513'] -> (513, 513); a clear error otherwise."""
  if value is None:
    return None
  if isinstance(value, str):
    value = value.split(',')
  try:
    return tuple(int(v) for v in value if str(v).strip() != '')
  except ValueError:
    raise config.ConfigError('--%s must be comma-separated integers, got %r'
                             % (flag_name, ','.join(map(str, value)))) from None


def require(value, flag_name, why=''):
  """Raises ConfigError('--flag_name is required' + why) when not value."""
  if not value:
    raise config.ConfigError('--%s is required%s' % (flag_name, why))


def _saved_dataset_name(saved_dataset):
  """The trained-on dataset's name when --dataset is not given, else None."""
  if explicitly_set('dataset') or not saved_dataset:
    return None
  return saved_dataset.get('name') or None


def dataset_name(saved_dataset):
  """--dataset, or the trained-on dataset when the flag is not given."""
  return _saved_dataset_name(saved_dataset) or FLAGS.dataset


def dataset_info(saved_dataset=None):
  """The DatasetInfo of --dataset_dir (its dataset.json) and `dataset_name`;
  the flag's default, which the user did not choose, warns of no other
  dataset in the dataset.json."""
  saved_name = _saved_dataset_name(saved_dataset)
  return datasets.load_dataset_info(
      dataset_name(saved_dataset), FLAGS.dataset_dir,
      name_is_default=not explicitly_set('dataset') and saved_name is None,
      name_from=("the training run's %s" % config.RUN_CONFIG_FILENAME
                 if saved_name else None))


def _flag_model_values(defaults=None):
  values = {name: FLAGS[name].value for name in _MODEL_FLAGS}
  for name, value in (defaults or {}).items():
    if not explicitly_set(name):
      values[name] = value
  for name in ('decoder_output_stride', 'image_pooling_crop_size',
               'image_pooling_stride'):
    values[name] = parse_int_list(values[name], name)
  values['dense_prediction_cell_config'] = dense_prediction_cell()
  return values


def dense_prediction_cell():
  """The cell of --dense_prediction_cell_json (read now), or None.

  Raises:
    config.ConfigError: the file is missing, unreadable or not a valid cell.
  """
  # pylint: disable=g-import-not-at-top
  from deeplab_train.model import dense_prediction_cell as cell_lib
  path = FLAGS.dense_prediction_cell_json
  if not path:
    return None
  try:
    return cell_lib.load_cell(path)
  except config.ConfigError as e:
    raise config.ConfigError('--dense_prediction_cell_json=%s: %s', path,
                             str(e)) from None


def explicitly_set(name):
  """True when the user gave --name (on the command line or a flagfile)."""
  return FLAGS[name].present > 0


# Model flags that change no variable, only the atrous rates of the
# network or how its labels reach the image's size: a checkpoint is
# evaluated, drawn or exported with other values than it was trained with
# (the original's recipe trains at output stride 16 with rates 6, 12, 18
# and evaluates at 8 with 12, 24, 36; TFLite needs the logits upsampled).
INFERENCE_FLAGS = ('output_stride', 'atrous_rates', 'multi_grid',
                   'prediction_with_upsampled_logits')


def model_options(num_classes, crop_size, saved=None, defaults=None,
                  num_classes_from='--num_classes', inference=False):
  """ModelOptions from the model flags, reconciled with saved options.

  Args:
    num_classes: classes of the dataset (or --num_classes for export).
    crop_size: (height, width) the graph is built for, or None.
    saved: ModelOptions read from a train logdir, or None (e.g. a model-zoo
      checkpoint: the flags then describe the network).
    defaults: {flag name: value} replacing flag defaults (a command whose
      original had other defaults); an explicit flag still wins.
    num_classes_from: where num_classes came from, for the message when it
      contradicts the saved options (see `classes_source`).
    inference: the network restores a checkpoint to predict (eval, vis,
      export): the INFERENCE_FLAGS given explicitly replace the saved
      values, with a warning (a number of atrous rates the checkpoint has
      no branches for fails when it is restored, naming them).

  Returns:
    A validated ModelOptions.

  Raises:
    config.ConfigError: an explicit model flag, or the class count,
      contradicts the saved options.
  """
  values = _flag_model_values(defaults)
  if saved is not None:
    conflicts, changes, problems = [], {}, []
    for name, value in values.items():
      saved_value = getattr(saved, name)
      flag = _MODEL_FIELD_FLAGS.get(name, name)
      if explicitly_set(flag) and _normalise(value) != _normalise(saved_value):
        branches = _changed_branch_count(name, value, saved)
        if branches:
          problems.append(branches)
          continue
        if inference and name in INFERENCE_FLAGS:
          changes[name] = value
          logging.warning('predicting with %s', _conflict(flag, value,
                                                          saved_value))
          continue
        conflicts.append(_conflict(flag, value, saved_value))
    if conflicts:
      problems.insert(0, (
          'model flags contradict the options saved with the checkpoint '
          '(%s): %s. Drop these flags; the saved options are used.'
          % (config.RUN_CONFIG_FILENAME, '; '.join(conflicts))))
    if saved.num_classes != num_classes:
      problems.append(
          '%s gives %d classes but the checkpoint was trained with %d (%s): '
          'use the dataset it was trained on, or start a new run for %d '
          'classes.' % (num_classes_from, num_classes, saved.num_classes,
                       config.RUN_CONFIG_FILENAME, num_classes))
    if problems:
      raise config.ConfigError('%s', ' '.join(problems))
    options = saved.replace(crop_size=crop_size, **changes)
  else:
    options = config.ModelOptions(num_classes=num_classes,
                                  crop_size=crop_size, **values)
  options.validate()
  _warn_unread(options.model_variant)
  return options


def _warn_unread(model_variant):
  """Warns about each backbone flag given that `model_variant` does not
  read (e.g. --depth_multiplier with a ResNet): it changes nothing."""
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.model import registry
  backbone = registry.get(model_variant)
  for name in registry.BACKBONE_OPTIONS:
    if explicitly_set(name) and name not in backbone.options_read:
      logging.warning('--%s changes nothing with --model_variant=%s; only '
                      'these variants read it: %s', name, model_variant,
                      ', '.join(registry.readers(name)))


def classes_source(dataset_dir):
  """Where a command's class count comes from, for messages: the folder's
  dataset.json, else the built-in dataset named by --dataset."""
  if dataset_dir and os.path.isfile(os.path.join(dataset_dir,
                                                 datasets.DATASET_JSON)):
    return os.path.join(dataset_dir, datasets.DATASET_JSON)
  return "--dataset=%s (the built-in dataset's table)" % FLAGS.dataset


def refuse_quantisation(what):
  """Raises ConfigError for --quantize_delay_step >= 0, saying `what`
  (e.g. 'quantised training is not supported') and the way out."""
  if FLAGS.quantize_delay_step >= 0:
    raise config.ConfigError(
        '--quantize_delay_step=%d: %s; leave it at -1. To quantise an '
        'exported model, use deeplab-export --tflite_quantize',
        FLAGS.quantize_delay_step, what)


def resize_flags_given():
  """The resize flags given on the command line (names)."""
  return tuple(name for name in _RESIZE_FLAGS if explicitly_set(name))


def resize_values(saved=None, inference=False):
  """{'min_resize_value': .., 'max_resize_value': .., 'resize_factor': ..}.

  Saved preprocess options win over defaults; an explicit contradicting
  flag is an error, as for the model flags, but for a command that
  predicts (`inference`): it changes no variable, so it is taken with a
  warning, as the original's eval, vis and export take it (the frozen
  graph's message for an image larger than its crop suggests it).
  """
  if not FLAGS.keep_aspect_ratio:
    logging.warning('--keep_aspect_ratio=false has no effect: resizing keeps '
                    'the aspect ratio, as in the original DeepLab, whose '
                    'flag of that name was read nowhere')
  values = {name: FLAGS[name].value for name in _RESIZE_FLAGS}
  if saved is None:
    return values
  conflicts, changes = [], {}
  for name in _RESIZE_FLAGS:
    trained = getattr(saved, name)
    if explicitly_set(name) and values[name] != trained:
      conflict = '--%s=%s (trained with %s)' % (
          name, values[name], 'it unset' if trained is None else trained)
      if inference:
        changes[name] = values[name]
        logging.warning('predicting with %s', conflict)
      else:
        conflicts.append(conflict)
  if conflicts:
    raise config.ConfigError(
        'resize flags contradict the options saved with the checkpoint '
        '(%s): %s. Drop these flags; the saved values are used.'
        % (config.RUN_CONFIG_FILENAME, '; '.join(conflicts)))
  return dict({n: getattr(saved, n) for n in _RESIZE_FLAGS}, **changes)


def _changed_branch_count(name, value, saved):
  """The problem when --atrous_rates gives another number of rates than the
  checkpoint's network has ASPP branches for (each rate is a branch of
  variables; an inference command may change the rates, not their number);
  None otherwise."""
  if (name != 'atrous_rates' or saved.dense_prediction_cell_config
      or len(value or ()) == len(saved.atrous_rates or ())):
    return None
  count = len(saved.atrous_rates or ())
  return ('--atrous_rates=%s gives %d rate(s), but the network was trained '
          'with %d (%s), an ASPP branch of variables each: give %d rates%s, '
          'or drop the flag.' % (
              _show(value or ()), len(value or ()), count,
              _show(saved.atrous_rates or ()) or 'none', count,
              ' (the original\'s recipe: 12, 24, 36 at --output_stride=8 '
              'for 6, 12, 18 at 16)' if count == 3 else ''))


def _conflict(flag, value, saved_value):
  """'--flag=VALUE (trained with SAVED)' for a contradicting flag."""
  if flag in _MODEL_FIELD_FLAGS.values():
    # A file's contents: name the file, say what was trained.
    trained = 'another cell' if saved_value else 'ASPP, no cell'
    return '--%s=%s (trained with %s)' % (flag, FLAGS[flag].value, trained)
  return '--%s=%s (trained with %s)' % (flag, _show(value), _show(saved_value))


def _normalise(value):
  if isinstance(value, (list, tuple)):
    # An empty list ('--decoder_output_stride=', README's EDGE flags) is
    # the saved None: no decoder.
    return tuple(value) or None
  if isinstance(value, float):
    return round(value, 9)
  return value


def _show(value):
  if isinstance(value, (list, tuple)):
    return ','.join(str(v) for v in value)
  return str(value)


def exported_model_path():
  """The one --exported_model path, or None; ConfigError when the flag is
  repeated (only deeplab-bench takes several)."""
  paths = FLAGS.exported_model or []
  if len(paths) > 1:
    raise config.ConfigError(
        '--exported_model given %d times: this command takes one exported '
        'model', len(paths))
  return paths[0] if paths else None
