"""The shell every command starts in: --help, bad flags, exit codes.

absl's `app.run` prints the `__main__` module's docstring for --help and
exits 1 after it, and a bad flag exits 1 with the whole usage. A command
here instead prints its own module docstring and flags for --help and exits
0, and a bad or unknown flag exits 2 with one line.
"""
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS

# Exit codes shared by every command.
EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_BAD_INPUT = 2

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
    on_bad_flags: optional fn(message) called before exiting 2 on a bad
      flag (e.g. to print the command's JSON result line).

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
      sys.stderr.write('%s: %s (see --help)\n' % (command, e))
      if on_bad_flags is not None:
        on_bad_flags(str(e))
      sys.exit(EXIT_BAD_INPUT)
  return parse


def start(command, main, doc, flag_modules=(), on_bad_flags=None):
  """Runs `main` as the command `command` (does not return).

  Args:
    command: the command's name, for messages.
    main: fn(argv) -> exit code, run after the flags are parsed.
    doc: the --help text (the command module's docstring).
    flag_modules: names of the modules whose flags --help lists.
    on_bad_flags: as for `flag_parser`.
  """
  main_module = sys.modules.get('__main__')
  if main_module is not None:
    # Started through a console script, __main__ is a stub without a
    # docstring; absl's usage prints __main__'s.
    main_module.__doc__ = doc
  for name in flag_modules:
    for flag in FLAGS.get_key_flags_for_module(name):
      FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  app.run(main, flags_parser=flag_parser(command, on_bad_flags))
