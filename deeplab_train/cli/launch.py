"""The console scripts: signal handling first, then the command.

Importing TensorFlow takes seconds; a SIGTERM in them (a scheduler that
changed its mind) must still end in a clean stop and a JSON line, so the
handlers (cli/signals.py) are set before the command's module is imported.
Until the run takes them over, a second signal ends the process at once
with the JSON result line (also written to --result_json, read here from
the command line as flags are not parsed yet). The other commands keep a
signal until their work begins, then stop as for one during it
(signals.keep_until_work). No TensorFlow here.
"""
import importlib
import sys
import time

from deeplab_train.cli import signals

_RESULT_JSON = '--result_json'
COMMAND = 'deeplab-train'


def result_json_argument(argv):
  """The value of --result_json in `argv` (the last one), else None."""
  value = None
  for i, arg in enumerate(argv):
    if arg.startswith(_RESULT_JSON + '='):
      value = arg.split('=', 1)[1]
    elif arg == _RESULT_JSON and i + 1 < len(argv):
      value = argv[i + 1]
  return value or None


def install_signals(argv):
  """Installs the process's signal handling (once) with a second signal
  before the run ending in a 'terminated'/'interrupted' result line."""
  if signals.current() is not None:
    return signals.current()
  start = time.time()
  result_json = result_json_argument(argv[1:])

  def stop_now(signum):
    # Imported only now: nothing but the handlers before the command
    # (runtime/result.py takes a few hundredths of a second).
    # pylint: disable=g-import-not-at-top
    from deeplab_train.cli import app
    from deeplab_train.runtime import result as result_lib
    name = signals.signal_name(signum)
    result = result_lib.RunResult(
        result_lib.STOPPED_NOW[name], result_lib.SIGNAL_PREFIX + name,
        seconds=time.time() - start,
        message='stopped at once (%s again) before training started' % name)
    app.report_result(COMMAND, result, result_json)

  process_signals = signals.install()
  process_signals.connect(on_stop_now=stop_now)
  return process_signals


def train():
  install_signals(sys.argv)
  # Imported now: the handlers must be set before TensorFlow loads.
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.cli import train as train_cli
  train_cli.run()


def _command(module_name):
  """Runs the `run()` of cli module `module_name`, with a signal received
  while it is imported kept for its work (signals.keep_until_work)."""
  signals.keep_until_work()
  importlib.import_module(module_name).run()


def build_data():
  _command('deeplab_train.cli.build_data')


def stats():
  _command('deeplab_train.cli.stats')


def evaluate():
  _command('deeplab_train.cli.eval')


def vis():
  _command('deeplab_train.cli.vis')


def export():
  _command('deeplab_train.cli.export')


def bench():
  _command('deeplab_train.cli.bench')
