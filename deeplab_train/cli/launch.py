"""deeplab-train's console script: signal handling first, then the command.

Importing TensorFlow takes seconds; a SIGTERM in them (a scheduler that
changed its mind) must still end in a clean stop and a JSON line, so the
handlers (cli/signals.py) are set before the command's module is imported.
Until the run takes them over, a second signal ends the process at once
with the JSON result line (also written to --result_json, read here from
the command line as flags are not parsed yet). No TensorFlow here.
"""
import sys
import time

from deeplab_train.cli import signals
from deeplab_train.runtime import result as result_lib

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
    name = signals.signal_name(signum)
    result = result_lib.RunResult(
        result_lib.STOPPED_NOW[name], result_lib.SIGNAL_PREFIX + name,
        seconds=time.time() - start,
        message='stopped at once (%s again) before training started' % name)
    # Imported only now: nothing but the handlers before TensorFlow.
    from deeplab_train.cli import app  # pylint: disable=g-import-not-at-top
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
