"""SIGTERM/SIGINT for a whole deeplab-train process, from its first second.

`install()` runs before TensorFlow is imported (deeplab-train's console
script, cli/launch.py), so a signal during the import or the flag checks is
not lost: the first one is kept as `pending` and handed to the run when it
starts (`connect`), which then stops cleanly (final checkpoint, exit 0).

A second signal of the same kind means "stop now", unless it comes within
DUPLICATE_SECS of the first: then it is the same signal sent twice (to the
process group and handed on by a wrapper script, or by a batch system to
every process of a job). Python runs its signal
handlers only when the main thread is back in the interpreter, never in the
middle of a session step, so the signals also go to a wake-up socket read by
a thread: on the second one it calls the command's `on_stop_now(signum)`
(which prints the JSON result line) and ends the process at once with
128 + the signal number (143 for SIGTERM, 130 for SIGINT). Checkpoints are
written under temporary names and renamed, so ending mid-save loses nothing
already written.

The other commands have no clean stop to make: `raised_in_main` (around
each one's work in cli/app.run_body) turns a signal into an exception in
them, so that on its way out the temp file being written is removed and
deeplab-bench's child processes are ended, before the command prints its
result line and exits with 143 / 130. Their console scripts (cli/launch.py)
call `keep_until_work` first (`python -m`: cli/app.start), so that a
signal while their modules load and their flags parse stops them the same
way when the work begins.

Standard library only: this module is imported before TensorFlow.
"""
import contextlib
import os
import signal
import socket
import sys
import threading
import time

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A signal of the kind received less than this many seconds before is the
# same one sent twice (to the process group and handed on by a wrapper
# script, or by a batch system to every process of a job), not "stop now".
DUPLICATE_SECS = 1.0
# What the first signal does, said on stderr (% the signal's name).
FIRST_NOTICE = ('%s received: stopping after the current step with a final '
                'checkpoint (send it again to stop at once)')


def signal_name(signum):
  """'SIGTERM' for signal.SIGTERM."""
  return signal.Signals(signum).name


def exit_code(signum):
  """The shell's exit status of a process ended by `signum`."""
  return 128 + int(signum)


def exit_now(code):
  """Flushes stdout and stderr as far as they can be (a full disk under
  2>log), then ends the process with `code` at once."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code)  # pylint: disable=protected-access


def say(line):
  """Writes `line` to stderr. A stderr that cannot be written (2>log on a
  full disk) loses the line only: its OSError escaped the commands' error
  handling (no result line, exit 1) and broke the stop a signal's notice
  announces."""
  try:
    sys.stderr.write(line + '\n')
    sys.stderr.flush()
  except (OSError, ValueError):
    pass


class ProcessSignals:
  """The process's SIGTERM/SIGINT handling (one instance: see `install`).

  Attributes:
    pending: name of the first signal received ('SIGTERM'), else None.
  """

  def __init__(self):
    self.pending = None
    self._pending_since = None
    self._first_notice = FIRST_NOTICE
    self._on_first = None
    self._on_stop_now = None
    self._finished_code = None
    self._lock = threading.Lock()
    self._reader = None
    self._writer = None

  def install(self):
    """Sets the handlers and starts the wake-up thread (main thread only)."""
    reader, writer = socket.socketpair()
    reader.setblocking(True)
    writer.setblocking(False)
    self._reader = reader
    # The C-level handler writes each signal number to `writer` at once.
    # Set before the handlers: a signal caught between the two was lost
    # (the process already showed it as caught, and ran on to the end).
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    self._writer = writer
    for sig in SIGNALS:
      signal.signal(sig, _ignore_in_python)
    thread = threading.Thread(target=self._watch, name='signals',
                              daemon=True)
    thread.start()

  def connect(self, on_first=None, on_stop_now=None, first_notice=None):
    """Hands the signals to the command's run.

    Args:
      on_first: fn(signal_name) for the first signal (also called now if
        one is pending): e.g. ask the run to stop after its step.
      on_stop_now: fn(signum) for the second signal of a kind, called on
        the watching thread just before the process ends: print the result.
      first_notice: what a first signal from now on does, said on stderr
        (% the signal's name); None: FIRST_NOTICE.
    """
    with self._lock:
      self._first_notice = first_notice or FIRST_NOTICE
      self._on_first = on_first
      self._on_stop_now = on_stop_now
      pending = self.pending
    if pending and on_first is not None:
      on_first(pending)

  def finished(self, code):
    """The command is done and its result printed: from now on a signal
    ends the process at once with `code` (see `exit_on_signal`)."""
    with self._lock:
      self._finished_code = code

  def _watch(self):
    while True:
      try:
        data = self._reader.recv(64)
      except OSError:
        return
      if not data:
        return
      for signum in data:
        self._received(signum)

  def _received(self, signum):
    if signum not in SIGNALS:
      return
    with self._lock:
      finished_code = self._finished_code
    if finished_code is not None:
      exit_now(finished_code)
    name = signal_name(signum)
    with self._lock:
      first = self.pending is None
      second = self.pending == name
      if second and time.monotonic() - self._pending_since < DUPLICATE_SECS:
        say('%s received again within %g s: taken as the same one '
                '(send it again to stop at once)' % (name, DUPLICATE_SECS))
        return
      if first:
        self.pending = name
        self._pending_since = time.monotonic()
      on_first, on_stop_now = self._on_first, self._on_stop_now
      notice = self._first_notice
    if first:
      say(notice % name)
      if on_first is not None:
        on_first(name)
    elif second:
      try:
        if on_stop_now is not None:
          on_stop_now(signum)
      finally:
        exit_now(exit_code(signum))


def _ignore_in_python(signum, frame):
  """The Python-level handler: the watching thread does the work."""
  del signum, frame


_INSTANCE = None


def install():
  """The process's ProcessSignals, installed on the first call."""
  global _INSTANCE
  if _INSTANCE is None:
    _INSTANCE = ProcessSignals()
    _INSTANCE.install()
  return _INSTANCE


def current():
  """The installed ProcessSignals, or None (e.g. a command's main() called
  in-process by a test: the run then sets its own handlers)."""
  return _INSTANCE


class Stopped(BaseException):
  """A SIGTERM/SIGINT raised in the main thread by `raised_in_main`.

  A BaseException, so that `except Exception` blocks let it through and the
  code holding child processes ends them on its way out (e.g.
  subprocess.run and bench/compare.run_logged kill their child on any
  exception).

  Attributes:
    signum: the signal's number; `name` its name ('SIGTERM').
  """

  def __init__(self, signum):
    self.signum = int(signum)
    self.name = signal_name(signum)
    super().__init__('stopped by %s' % self.name)


# The signals raised as Stopped within the current `raised_in_main`.
_raised = []


def _raise_stopped(signum, frame):
  del frame
  if _finished:
    return  # the work is done and its result printed
  _raised.append(signum)
  if len(_raised) == 1:
    # Once: a second signal (the copy a wrapper script hands on) must not
    # break into the cleanup the first one started.
    raise Stopped(signum)


# Signals received before the command's work began (see keep_until_work).
_kept = []


def _keep(signum, frame):
  del frame
  _kept.append(signum)


def keep_until_work():
  """Keeps a SIGTERM/SIGINT received from now on until `raised_in_main`
  begins, which raises it as Stopped at once. For the commands of
  `raised_in_main`, from their first line: the import of their modules
  (a quarter of a second) and the parsing of their flags were a window in
  which a signal ended them without a result line. Main thread only; not
  in a process whose ProcessSignals are installed (deeplab-train)."""
  if (_INSTANCE is not None or
      threading.current_thread() is not threading.main_thread()):
    return
  for sig in SIGNALS:
    signal.signal(sig, _keep)


def raised_signal():
  """The last signal raised as Stopped within the current
  `raised_in_main`, or None. A Stopped raised while TensorFlow's C++ code
  hands an error back to Python comes out as another exception (pybind11's
  RuntimeError 'MISMATCH ... REPLACED BY Stopped'): this tells the stop
  from a failure."""
  return _raised[-1] if _raised else None


# [the exit code] once the command's last result line is printed.
_finished = []


def result_printed(code):
  """The command printed its last result line (exit `code`): a signal
  within `raised_in_main` no longer raises Stopped, which printed a
  second, 'terminated' line and exited 143 in its last clean-ups."""
  _finished[:] = [code]


def exit_on_signal(code):
  """The command's work is done and its result printed (exit `code`):
  from now on SIGTERM and SIGINT are ignored, so that the process exits
  with `code`. During the interpreter's shut-down (a second or so with
  TensorFlow) Python puts the default handlers back, and a signal then
  ended a finished command with 143 / 130; an ignored one stays ignored
  through it. Also for deeplab-train's ProcessSignals. Main thread only;
  else nothing."""
  if threading.current_thread() is not threading.main_thread():
    return
  result_printed(code)
  if _INSTANCE is not None:
    _INSTANCE.finished(code)
  for sig in SIGNALS:
    signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def raised_in_main():
  """Within it, SIGTERM and SIGINT raise `Stopped` in the main thread.

  For commands that start child processes and have no clean stop of their
  own (deeplab-bench): without it SIGTERM ends the Python process at once
  and its children run on. Python runs the handler when the main thread is
  back in the interpreter (a wait on a child, between session runs). The
  previous handlers are restored on leaving. Outside the main thread (where
  handlers cannot be set) it does nothing.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  del _raised[:]
  del _finished[:]
  previous = {sig: signal.signal(sig, _raise_stopped) for sig in SIGNALS}
  try:
    if _kept:
      kept = _kept[0]
      del _kept[:]
      _raise_stopped(kept, None)
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
