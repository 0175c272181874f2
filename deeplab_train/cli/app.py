"""The shell every command runs in: --help, bad flags, errors, exit codes
and the one JSON result line.

absl's `app.run` prints the `__main__` module's docstring for --help and
exits 1 after it, and a bad flag exits 1 with the whole usage. A command
here instead prints its own module docstring and flags for --help and exits
0, and a bad or unknown flag exits 2 with one line. `run_body` maps the
errors of a command's work to exit codes (bad input 2 with one line,
anything else 1 with its traceback in the log), and every command ends with
one JSON line on stdout (`print_result`): {"event": "result", "status":
..., ...}. The exit codes are those of runtime/result.py.

Library errors name option fields ({owner.field}, see config/errors.py);
`user_message` shows each as the flag that sets it in this command: by
default the field's own name, else the command's FLAG_NAMES entry (e.g.
InferenceOptions.crop_size is --eval_crop_size in deeplab-eval and
--vis_crop_size in deeplab-vis). Library log lines that name fields are
`errors.Message`s: `flag_terms_in_logs` shows them in flags the same way.
"""
import contextlib
import dataclasses
import json
import logging
import sys

from absl import app
from absl import flags

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train import locking
from deeplab_train.cli import signals
from deeplab_train.config import errors
from deeplab_train.runtime import result as result_lib

FLAGS = flags.FLAGS

EXIT_OK = result_lib.EXIT_CODES['ok']
EXIT_UNEXPECTED = result_lib.EXIT_CODES['error']
EXIT_BAD_INPUT = result_lib.EXIT_CODES['bad_input']
EXIT_LOCKED = result_lib.EXIT_CODES['locked']


def bad_input_errors():
  """Errors that mean bad input (flags, files, checkpoints), not a bug.

  TensorFlow's (a missing or corrupt file it read) count only once the
  command imported it: --help, bad flags and a missing required flag are
  answered before TensorFlow loads (seconds), and importing it just to
  classify a ConfigError would undo that.
  """
  tf = sys.modules.get('tensorflow')
  if tf is None:
    return (config.ConfigError,)
  return (config.ConfigError, tf.errors.NotFoundError,
          tf.errors.DataLossError)


class Reported(Exception):
  """The command already printed its message and JSON line: exit with
  `exit_code` (raised inside run_body's body)."""

  def __init__(self, exit_code):
    super().__init__(exit_code)
    self.exit_code = exit_code


say = signals.say  # a line on stderr, which may fail (see there)


def print_result(status, **fields):
  """Prints the command's JSON result line (sorted keys, flushed)."""
  line = dict(fields, event='result', status=status)
  print(json.dumps(line, sort_keys=True), flush=True)


def print_final_result(status, **fields):
  """print_result for the command's last result: a signal from then on no
  longer stops it (its work is done; see signals.result_printed)."""
  print_result(status, **fields)
  signals.result_printed(result_lib.EXIT_CODES[status])


def report_result(command, result, result_json=None, flag_names=None):
  """Prints a RunResult as the command's JSON line, after one error line on
  stderr when it is not ok, and writes it to `result_json`.

  Returns:
    False when result_json could not be written (the run then exits 1 even
    if it trained: a caller reading that file would find nothing).
  """
  if result.detail is not None:
    result = dataclasses.replace(
        result, message=user_message(result.detail, flag_names))
  if result.status != 'ok':
    say('%s: %s' % (command, result.message))
  print(result.to_json(), flush=True)
  if result_json:
    try:
      result_lib.write_result_json(result, result_json)
    except OSError as e:
      logging.error('cannot write --result_json=%s: %s', result_json, e)
      return False
  return True


# Option fields of every command whose flag is not named after the field.
SHARED_FLAG_NAMES = {
    'ModelOptions.dense_prediction_cell_config': 'dense_prediction_cell_json',
    'load_dataset_info.name': 'dataset',
}


def flag_namer(flag_names=None):
  """fn('owner.field') -> '--flag' for messages.

  Args:
    flag_names: {'owner.field': 'flag_name'} where the flag is not named
      after the field (a command's FLAG_NAMES).
  """
  flag_names = dict(SHARED_FLAG_NAMES, **(flag_names or {}))
  return lambda field: '--' + flag_names.get(field,
                                             errors.field_name(field))


def user_message(error_or_text, flag_names=None):
  """A message in this command's terms: option fields shown as flags.

  Args:
    error_or_text: a text with {owner.field} references, a ConfigError or
      config.errors.Message, or any other exception.
    flag_names: the command's field -> flag names (see `flag_namer`).
  """
  if isinstance(error_or_text, str):
    return errors.render(error_or_text, flag_namer(flag_names))
  if isinstance(error_or_text, (config.ConfigError, errors.Message)):
    return error_or_text.render(flag_namer(flag_names))
  return getattr(error_or_text, 'message', None) or str(error_or_text)


class _FlagTerms(logging.Filter):
  """Renders a record whose message is an errors.Message in a command's
  flags (absl's handler and Python's call str() on it otherwise, which
  shows the fields bare)."""

  def __init__(self, flag_names):
    super().__init__()
    self._name_of = flag_namer(flag_names)

  def filter(self, record):
    if isinstance(record.msg, errors.Message) and not record.args:
      record.msg = record.msg.render(self._name_of)
    return True


@contextlib.contextmanager
def flag_terms_in_logs(flag_names=None):
  """Within it, the log's errors.Message lines (e.g. the initial
  checkpoint's hint '{TrainOptions.initialize_last_layer}=false') name the
  command's flags ('--initialize_last_layer=false'), from every thread."""
  terms = _FlagTerms(flag_names)
  handlers = list(logging.getLogger().handlers)
  for handler in handlers:
    handler.addFilter(terms)
  try:
    yield
  finally:
    for handler in handlers:
      handler.removeFilter(terms)


def check_no_positional(command, argv):
  if len(argv) > 1:
    raise config.ConfigError('unexpected argument(s) %s; %s takes only '
                             '--flags' % (' '.join(argv[1:]), command))


def run_body(command, argv, body, bad_input=None, flag_names=None):
  """Runs body() as a command: errors become a message, a JSON line, a code.

  Args:
    command: the command name for messages.
    argv: the positional arguments left by absl (only the program name is
      allowed).
    body: fn() doing the work and printing its result line.
    bad_input: exception classes that mean bad input (default
      `bad_input_errors()`).
    flag_names: the command's field -> flag names (see `flag_namer`).

  Returns:
    EXIT_OK, EXIT_BAD_INPUT (one line on stderr), EXIT_LOCKED (another
    live process holds the lock of the output folder: one line),
    EXIT_UNEXPECTED (anything else, logged with its traceback; one line for
    an output that could not be written), or 143 / 130 when a SIGTERM /
    SIGINT stopped body() (raised in it as signals.Stopped, so that its
    cleanups run: temp files removed, child processes ended).
  """
  code = None
  try:
    with signals.raised_in_main(), flag_terms_in_logs(flag_names):
      code = _run_body(command, argv, body, bad_input, flag_names)
  except signals.Stopped as e:
    if code is None:
      # Stopped where it was: the outputs finished so far stay, the one
      # being written is not put in place (its temp is removed on the way
      # out).
      message = 'stopped by %s' % e.name
      say('%s: %s' % (command, message))
      print_result(result_lib.STOPPED_NOW[e.name], message=message)
      return signals.exit_code(e.signum)
  return code


def _run_body(command, argv, body, bad_input, flag_names):
  try:
    check_no_positional(command, argv)
    body()
  except Reported as e:
    return e.exit_code
  except Exception as e:  # pylint: disable=broad-except
    if signals.raised_signal() is not None:
      # The stop, turned into another exception by TensorFlow's C++ code.
      raise signals.Stopped(signals.raised_signal()) from None
    status = ('error' if isinstance(e, atomic.OutputNotWrittenError) else
              'locked' if isinstance(e, locking.FolderLockedError) else None)
    if status:
      # Neither the input's fault nor a bug (a full disk, another live
      # writer of the output folder): one line.
      say('%s: error: %s' % (command, e))
      print_result(status, message=str(e))
      return result_lib.EXIT_CODES[status]
    # Classified after the fact: see bad_input_errors.
    if isinstance(e, bad_input or bad_input_errors()):
      message = user_message(e, flag_names)
      say('%s: error: %s' % (command, message))
      print_result('bad_input', message=message)
      return EXIT_BAD_INPUT
    logging.exception('%s failed', command)
    print_result('error', message='%s: %s' % (type(e).__name__, e))
    return EXIT_UNEXPECTED
  return EXIT_OK

_SHORT_HELP = ('--help', '-help', '-h', '-?', '--helpshort', '-helpshort')
_FULL_HELP = ('--helpfull', '-helpfull')


def _asked_for_help(argv):
  """'short', 'full' or None, from the arguments before a '--'."""
  args = argv[1:]
  if '--' in args:
    args = args[:args.index('--')]
  if any(a in _FULL_HELP for a in args):
    return 'full'
  if any(a in _SHORT_HELP for a in args):
    return 'short'
  return None


def flag_parser(command, on_bad_flags=None):
  """absl's flag parser with --help exiting 0 and bad flags exiting 2.

  Args:
    command: the command's name, for messages.
    on_bad_flags: fn(message) called before exiting 2 on a bad flag, to
      print the command's JSON result line; None: the plain bad_input line
      (a script reading the last line of stdout found none).

  Returns:
    fn(argv) -> the arguments left after the flags.
  """
  def parse(argv):
    wanted = _asked_for_help(argv)
    if wanted:
      app.usage(shorthelp=wanted == 'short', writeto_stdout=True,
                exitcode=EXIT_OK)
    try:
      return FLAGS(argv)
    except flags.Error as e:
      message = _flag_error_message(e)
      say('%s: %s (see --help)' % (command, message))
      if on_bad_flags is not None:
        on_bad_flags(message)
      else:
        print_result('bad_input', message=message)
      sys.exit(EXIT_BAD_INPUT)
  return parse


def _flag_error_message(error):
  """absl's message for a bad flag; a --flagfile that cannot be opened is
  named as such (absl says 'ERROR:: Unable to open flagfile: <OSError>')."""
  if isinstance(error, flags.CantOpenFlagFileError):
    return 'cannot read a --flagfile: %s' % str(error).split(
        'Unable to open flagfile: ', 1)[-1]
  return str(error)


def start(command, main, doc, flag_modules=(), on_bad_flags=None,
          keep_signals=True):
  """Runs `main` as the command `command` (does not return).

  Args:
    command: the command's name, for messages.
    main: fn(argv) -> exit code, run after the flags are parsed.
    doc: the --help text (the command module's docstring).
    flag_modules: names of the modules whose flags --help lists.
    on_bad_flags: as for `flag_parser`.
    keep_signals: `main` runs its work in `run_body`, which stops on a
      signal kept since the start (signals.keep_until_work); False for a
      main that does not, which a kept signal would not stop at all.
  """
  if keep_signals:
    # Started as `python -m deeplab_train.cli.NAME` (deeplab-bench's
    # children), not through cli/launch.py: a signal while the flags parse.
    signals.keep_until_work()
  main_module = sys.modules.get('__main__')
  if main_module is not None:
    # Started through a console script, __main__ is a stub without a
    # docstring; absl's usage prints __main__'s.
    main_module.__doc__ = doc
  for name in flag_modules:
    for flag in FLAGS.get_key_flags_for_module(name):
      FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  def main_then_done(argv):
    code = main(argv)
    signals.exit_on_signal(code or EXIT_OK)
    return code
  app.run(main_then_done, flags_parser=flag_parser(command, on_bad_flags))
