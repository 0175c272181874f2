"""Flags shared by deeplab-eval, deeplab-vis and deeplab-export.

The original scripts each defined these (same names and meanings); here they
are defined once so the three command modules can be imported together, plus
the helpers that turn them into the library's option dataclasses.
"""
import functools
import logging
import os

from absl import flags

from deeplab_train import config
from deeplab_train import restore
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS

# Defined here once for eval, vis and export (see the module docstring).
_INFERENCE_TABLE = (
    ('string', 'checkpoint_dir', None,
     'deeplab-eval and -vis: directory of model checkpoints (the '
     'train_logdir); its latest checkpoint is used. A checkpoint prefix '
     'also works. (deeplab-export: --checkpoint_path.)'),
    ('multi_float', 'eval_scales', [1.0],
     'deeplab-eval and -vis: the scales to resize images for inference '
     '(repeat the flag for multi-scale inference). (deeplab-export: '
     '--inference_scales.)'),
    ('boolean', 'add_flipped_images', False,
     'Add left-right flipped images during inference.'),
    ('integer', 'eval_interval_secs', 60 * 5,
     'deeplab-eval\'s follow mode: how often (in seconds) to look for and '
     'evaluate a new checkpoint. Giving this flag turns follow mode on. '
     '(deeplab-vis and -export read one checkpoint, once.)'),
)
flag_table.define(_INFERENCE_TABLE)


def refuse_flags_of_the_others(command, fixes):
  """Refuses a flag of another inference command: defined once for all
  three (above), it would be accepted and ignored.

  Args:
    command: the command's name.
    fixes: {flag name: what to do instead}.

  Raises:
    config.ConfigError: one of them is given.
  """
  for name, fix in fixes.items():
    if common_flags.explicitly_set(name):
      raise config.ConfigError('--%s is not a flag of %s: %s', name, command,
                               fix)


def exported_model_kind(path, crop_flag):
  """The format of --exported_model `path` (export/loaded.KINDS).

  Raises:
    config.ConfigError: --checkpoint_dir given too, or a flag the exported
      model cannot honour (`crop_flag`, scales, flips, image pyramid; the
      resize flags but for a .tflite file, whose input the caller resizes).
  """
  if FLAGS.checkpoint_dir:
    raise config.ConfigError('give --checkpoint_dir or --exported_model, '
                             'not both')
  from deeplab_train.export import loaded  # pylint: disable=g-import-not-at-top
  kind = loaded.detect_format(path)
  names = [crop_flag, 'eval_scales', 'add_flipped_images', 'image_pyramid']
  if kind != loaded.TFLITE:
    names += list(config.RESIZE_FIELDS)
  given = ['--' + n for n in names if common_flags.explicitly_set(n)]
  if given:
    raise config.ConfigError(
        '%s cannot apply to --exported_model: the %s model was made with its '
        'crop size, scales, flips and resize fixed (deeplab-export); drop '
        'them' % (', '.join(given), kind))
  return kind


def parse_crop(value, flag_name):
  """'65,65' / ['65', '65'] / ['65,65'] -> (65, 65); None stays None."""
  if value is None:
    return None
  if not isinstance(value, str):
    value = ','.join(str(v) for v in value)
  crop = common_flags.parse_int_list(value, flag_name)
  if not crop:
    return None
  if len(crop) != 2 or min(crop) < 1:
    raise config.ConfigError('--%s must be HEIGHT,WIDTH (two positive '
                             'integers), got %s' % (flag_name, value))
  return crop


def inference_options(crop_flag, scales_flag):
  """InferenceOptions from the command's crop and scales flags and the
  shared --add_flipped_images and --image_pyramid (not yet validated)."""
  return config.InferenceOptions(
      crop_size=parse_crop(FLAGS[crop_flag].value, crop_flag),
      scales=FLAGS[scales_flag].value,
      add_flipped_images=FLAGS.add_flipped_images,
      image_pyramid=FLAGS.image_pyramid)


def saved_run_config(folder):
  """(ModelOptions, PreprocessOptions, dataset dict) saved there, or Nones."""
  saved = config.load_run_config(folder) if folder else None
  return saved if saved is not None else (None, None, None)


def preprocess_options(saved_preprocess, resize=None):
  """PreprocessOptions with the (reconciled) resize values; no crop.
  `resize`: those values if the caller read them already
  (common_flags.resize_values of the same `saved_preprocess`)."""
  if resize is None:
    resize = common_flags.resize_values(saved_preprocess, inference=True)
  return config.PreprocessOptions(crop_size=None, **resize).validate()


def check_split_fits(job, split):
  """Refuses a fixed crop size that images of `split` do not fit, for the
  whole split at once (by the size range dataset.json's statistics keep,
  else read from the records), not at the first such image, which left the
  next larger one to another run. Resized images (--min/max_resize_value)
  are judged by their sizes read from the records, resized."""
  options = job.preprocess_options
  if job.inference.crop_size is None:
    return
  resized = bool(options.min_resize_value or options.max_resize_value)
  counted = None if resized else job.dataset_info.split_statistics(split)
  if counted is not None:
    size = counted.max_height, counted.max_width
    source = 'from %s' % os.path.join(FLAGS.dataset_dir, 'dataset.json')
  else:
    # Records without counts (the original's converter), or resized: their
    # sizes are read, nothing decoded (0.2-0.4 s for VOC's val split, 1449
    # records).
    # pylint: disable=g-import-not-at-top
    from deeplab_train.data import image_ops
    from deeplab_train.data import pipeline
    from deeplab_train.data import tfrecord
    size = tfrecord.largest_image_size(
        pipeline.split_files(FLAGS.dataset_dir, split),
        functools.partial(image_ops.resize_to_range_size,
                          min_size=options.min_resize_value,
                          max_size=options.max_resize_value,
                          factor=options.resize_factor)
        if resized else None)
    if size is None:
      return   # each image is checked as it comes
    source = ('read from its records, resized as %s' % ', '.join(
        '{PreprocessOptions.%s}=%d' % (name, getattr(options, name))
        for name in config.RESIZE_FIELDS if getattr(options, name))
              if resized else 'read from its records')
  job.inference.check_holds(
      size[0], size[1], job.model_options.output_stride,
      'split %r (its largest height and width, %s)' % (split, source))


def check_unsupported(command):
  """Refuses the original's shared flags that an inference command cannot
  honour (their defaults pass).

  Raises:
    config.ConfigError: --quantize_delay_step >= 0 or a --master address.
  """
  common_flags.refuse_quantisation('quantised models are not supported '
                                   '(deeplab-train does not train them)')
  if FLAGS.master:
    raise config.ConfigError(
        '--master=%s: %s runs in its own process, not on a TensorFlow '
        'server; run it where it should work and leave --master empty',
        FLAGS.master, command)


# Times a command starts again when the checkpoint it reads is deleted.
_GONE_ATTEMPTS = 3


def main_for(command, body, flag_names, checkpoint_flag='checkpoint_dir'):
  """absl's main(argv) of an inference command: INFO logging, then body()
  in the command shell (exit codes, the result line, flag names), after
  `check_unsupported`.

  The checkpoint body() chooses is pinned until it ends (restore.pinning):
  a training run that keeps only its newest checkpoints may delete it
  meanwhile. When it was deleted before it was pinned and
  `checkpoint_flag` names its directory, body() starts again from the new
  latest, up to 3 times in all: every output is written from one
  checkpoint.
  """
  def checked_body():
    check_unsupported(command)
    for attempt in range(1, _GONE_ATTEMPTS + 1):
      try:
        with restore.pinning():
          return body()
      except restore.CheckpointGoneError as e:
        folder = FLAGS[checkpoint_flag].value
        if (attempt == _GONE_ATTEMPTS or not folder or
            not os.path.isdir(folder) or os.path.abspath(
                os.path.dirname(e.prefix)) != os.path.abspath(folder)):
          raise
        logging.warning('%s: %s; starting again from the latest checkpoint '
                        'in %s', command, e, folder)

  def main(argv):
    logging.getLogger().setLevel(logging.INFO)
    return app.run_body(command, argv, checked_body, flag_names=flag_names)
  return main


def run_app(command, main, doc, module_name):
  """Starts an inference command in the shared command shell.

  Args:
    command: the command name for messages.
    main: fn(argv) -> exit code.
    doc: the --help text (the command module's docstring).
    module_name: the command module, whose flags --help lists along with
      the shared ones.
  """
  app.start(command, main, doc,
            (module_name, __name__, common_flags.__name__))
