"""Flags shared by deeplab-eval, deeplab-vis and deeplab-export.

The original scripts each defined these (same names and meanings); here they
are defined once so the three command modules can be imported together, plus
the helpers that turn them into the library's option dataclasses.
"""
import json
import logging
import sys

from absl import flags
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags

FLAGS = flags.FLAGS

flags.DEFINE_string('checkpoint_dir', None,
                    'Directory of model checkpoints (the train_logdir); its '
                    'latest checkpoint is used. A checkpoint prefix also '
                    'works.')
flags.DEFINE_multi_float('eval_scales', [1.0],
                         'The scales to resize images for evaluation '
                         '(repeat the flag for multi-scale inference).')
flags.DEFINE_bool('add_flipped_images', False,
                  'Add left-right flipped images during inference.')
flags.DEFINE_integer('eval_interval_secs', 60 * 5,
                     'Follow mode: how often (in seconds) to look for and '
                     'evaluate a new checkpoint. Giving this flag turns '
                     'follow mode on.')

EXIT_OK = app.EXIT_OK
EXIT_UNEXPECTED = app.EXIT_UNEXPECTED
EXIT_BAD_INPUT = app.EXIT_BAD_INPUT


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


def saved_run_config(folder):
  """(ModelOptions, PreprocessOptions, dataset dict) saved there, or Nones."""
  saved = config.load_run_config(folder) if folder else None
  return saved if saved is not None else (None, None, None)


def preprocess_options(saved_preprocess):
  """PreprocessOptions with the (reconciled) resize values; no crop."""
  return config.PreprocessOptions(
      crop_size=None, **common_flags.resize_values(saved_preprocess)).validate()


def run_main(command, argv, body):
  """Runs body() as a command: errors become a message, a JSON line, a code.

  Args:
    command: the command name for messages.
    argv: the positional arguments left by absl (only the program name is
      allowed).
    body: fn() doing the work (printing its own result lines).

  Returns:
    EXIT_OK, EXIT_BAD_INPUT (ConfigError, missing or corrupt files) or
    EXIT_UNEXPECTED (anything else, logged with its traceback).
  """
  try:
    check_no_positional(command, argv)
    body()
  except (config.ConfigError, tf.errors.NotFoundError,
          tf.errors.DataLossError) as e:
    message = getattr(e, 'message', None) or str(e)
    sys.stderr.write('%s: error: %s\n' % (command, message))
    print(json.dumps({'status': 'bad_input', 'message': message}), flush=True)
    return EXIT_BAD_INPUT
  except Exception as e:  # pylint: disable=broad-except
    logging.exception('%s failed', command)
    print(json.dumps({'status': 'error',
                      'message': '%s: %s' % (type(e).__name__, e)}),
          flush=True)
    return EXIT_UNEXPECTED
  return EXIT_OK


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


def check_no_positional(command, argv):
  if len(argv) > 1:
    raise config.ConfigError('unexpected argument(s) %s; %s takes only '
                             '--flags' % (' '.join(argv[1:]), command))
