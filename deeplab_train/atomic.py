"""Writes that never leave a half-written file: temp name, then rename.

Used for the files the commands write besides TFRecords and checkpoints
(the saved run config, dataset.json, JSON results, PNGs, frozen graphs,
SavedModel directories), so a reader or a killed run never sees a partial
output. The temp name is hidden and carries the pid and host, so
concurrent writers do not collide, and the temps of writers that were
killed (their process is gone) are removed by the next write of the path.
"""
import contextlib
import ctypes
import errno
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading

_log = logging.getLogger(__name__)


class OutputNotWrittenError(OSError):
  """`path` could not be written (a full disk, a read-only file system,
  ...); nothing was put in its place. str(): 'cannot write PATH: REASON'.
  The errno, strerror (the reason) and filename are OSError's."""

  def __init__(self, path, reason, error_number=None):
    super().__init__(error_number, reason, path)

  def __str__(self):
    return 'cannot write %s: %s' % (self.filename, self.strerror)


def not_written(path, error):
  """OutputNotWrittenError for `path` from an OSError (or any error with
  a message, e.g. TensorFlow's OpError of a file it wrote)."""
  if isinstance(error, OutputNotWrittenError):
    return error
  reason = (getattr(error, 'strerror', None) or getattr(error, 'message', None)
            or str(error) or type(error).__name__)
  # A writer's own words name the file it wrote: in this process's temp of
  # `path`, which the user never asked for.
  reason = reason.strip().splitlines()[0].replace(temp_name(path), path)
  return OutputNotWrittenError(path, reason, getattr(error, 'errno', None))


# '.NAME.tmp-PID@HOST', '.old' added to a folder put aside by replace_dir
# (before 2026-12-06: no '@HOST').
_TEMP_NAME = re.compile(r'^\.(?P<target>.+)\.tmp-(?P<pid>\d+)'
                        r'(@(?P<host>[^@/]+?))?(\.old)?$')
_HOST = socket.gethostname()


def temp_target(name):
  """The file name a temp name (`temp_name`, or the `.old` of
  `replace_dir`) is written for, else None: '.x.json.tmp-12@h' -> 'x.json'.
  """
  match = _TEMP_NAME.match(os.path.basename(name))
  return match.group('target') if match else None


def process_alive(pid):
  """Whether a process `pid` runs on this host (True when that cannot be
  told: another user's process, a pid that is not a number)."""
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, TypeError, OverflowError):
    return True
  return True


def left_by_a_dead_process(name):
  """Whether the temp name `name` is of a process of this host that is
  gone (False for other names)."""
  match = _TEMP_NAME.match(os.path.basename(name))
  return bool(match and match.group('host') in (None, _HOST)
              and not process_alive(match.group('pid')))


def _temp_prefix(path):
  """(folder, the start of every temp name of `path`, whatever its pid)."""
  folder, base = os.path.split(os.path.abspath(path))
  return folder, '.%s.tmp-' % base


def temp_name(path):
  """The hidden temp name of `path` in its folder (with this pid and
  host)."""
  folder, prefix = _temp_prefix(path)
  return os.path.join(folder, '%s%d@%s' % (prefix, os.getpid(), _HOST))


def leftover_temps(path):
  """The temp files and folders of `path` in its folder, of any process
  (e.g. of a killed writer), sorted."""
  folder, prefix = _temp_prefix(path)
  if not os.path.isdir(folder):
    return []
  return [os.path.join(folder, entry) for entry in sorted(os.listdir(folder))
          if entry.startswith(prefix)]


def remove_leftover_temps(path, dead_only=False):
  """Removes `leftover_temps(path)`. Call only when no writer of `path`
  is running (e.g. under the lock of its folder), or with `dead_only`:
  then only those of processes of this host that are gone, and none while
  `path` is missing and a folder put aside for it is there (a killed
  `replace_dir` left the folder it replaces and its replacement under temp
  names: `finish_replace_dir`)."""
  leftovers = leftover_temps(path)
  if dead_only and not os.path.lexists(path) and any(
      leftover.endswith('.old') for leftover in leftovers):
    return
  for leftover in leftovers:
    if dead_only and not left_by_a_dead_process(leftover):
      continue
    _remove(leftover)


def _remove(temp):
  """Removes a temp file or folder, if it is there."""
  if os.path.isdir(temp) and not os.path.islink(temp):
    shutil.rmtree(temp, ignore_errors=True)
  else:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temp)


# The `together` blocks open, innermost last: each a list of the
# (temp, path, replace function) its writes left to put in place.
_together = []


@contextlib.contextmanager
def together():
  """The outputs written in this block (by the functions below) are put in
  place when it ends without an error, one right after another; an error
  removes all of their temps. A command with several outputs (a frozen
  graph and a SavedModel) then leaves either all of them new or all as
  they were, never some of each (a full disk while writing the second).
  """
  pending = []
  _together.append(pending)
  try:
    yield
  except BaseException:
    for tmp, _, _ in pending:
      _remove(tmp)
    raise
  finally:
    _together.pop()
  # A rename that cannot succeed (a folder where a file goes) is found
  # before the first: eval replaced two of its three files, then failed on
  # the third, leaving results of two evaluations side by side.
  for tmp, path, _ in pending:
    if (os.path.isdir(path) and not os.path.islink(path)
        and not os.path.isdir(tmp)):
      for other, _, _ in pending:
        _remove(other)
      raise not_written(path, IsADirectoryError(
          errno.EISDIR, os.strerror(errno.EISDIR), path))
  with signals_held():
    for i, (tmp, path, replace) in enumerate(pending):
      try:
        replace(tmp, path)
      except BaseException as e:
        for later, _, _ in pending[i:]:
          _remove(later)
        if isinstance(e, OSError):
          raise not_written(path, e) from None
        raise


@contextlib.contextmanager
def signals_held():
  """SIGTERM and SIGINT wait until the block ends, then go to the handler
  they would have gone to (main thread only). For a few renames that must
  all be done or none: a handler that raises (the commands' Stopped)
  between two renames of `together` left some outputs new and some as they
  were."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  held = []
  previous = {sig: signal.getsignal(sig)
              for sig in (signal.SIGTERM, signal.SIGINT)}
  previous = {sig: h for sig, h in previous.items() if h is not None}
  for sig in previous:
    signal.signal(sig, lambda signum, frame: held.append(signum))
  failed = None
  try:
    yield
  except BaseException as e:
    failed = e
    raise
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    if held:
      if isinstance(failed, Exception):
        # The handler's Stopped would take its place: only the stop was
        # told, not why the renames failed (a full disk).
        _log.error('%s', failed)
      handler = previous[held[0]]
      if callable(handler):
        handler(held[0], None)
      elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), held[0])


def _put_in_place(tmp, path, replace):
  """replace(tmp, path) now, or when the innermost `together` block ends."""
  if _together:
    _together[-1].append((tmp, path, replace))
  else:
    replace(tmp, path)


@contextlib.contextmanager
def writing(path):
  """Yields a temp path to write `path` under; renames it into place when
  the block ends without an error (or the `together` block around it
  does), removes it in any case of error.

  For writers that want a file name (e.g. a TFRecordWriter). The temps
  that killed writers of `path` left are removed first.
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  remove_leftover_temps(path, dead_only=True)
  tmp = temp_name(path)
  try:
    yield tmp
    _put_in_place(tmp, path, os.replace)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_with(path, writer):
  """Atomically writes `path` through `writer(open_binary_file)`.

  For libraries that write to a file object (e.g. PIL's Image.save, which
  is then told the format explicitly since the temp name has no extension
  it recognises).
  """
  try:
    with writing(path) as tmp:
      _write_synced(tmp, writer)
  except OSError as e:
    raise not_written(path, e) from None
  return path


def _write_synced(path, writer):
  """Writes `path` through `writer(open_binary_file)`, flushed to disk."""
  with open(path, 'wb') as f:
    writer(f)
    f.flush()
    os.fsync(f.fileno())


def sync_files(folder):
  """Flushes the files of `folder` to disk (a folder filled by copies,
  before it is renamed into place)."""
  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    if os.path.isfile(path) and not os.path.islink(path):
      with open(path, 'rb') as f:
        os.fsync(f.fileno())


def write_temp(tmp, data):
  """Writes `data` (bytes) to the temp name `tmp`, flushed to disk, and
  leaves the rename to the caller (a build renames all its files together:
  data/build.py)."""
  _write_synced(tmp, lambda f: f.write(data))


def write_bytes(path, data):
  """Atomically writes `data` (bytes) to `path`, creating its folder."""
  return write_with(path, lambda f: f.write(data))


def json_bytes(payload):
  """`payload` as the indented, key-sorted JSON every written file uses."""
  return (json.dumps(payload, indent=1, sort_keys=True) + '\n').encode(
      'utf-8')


def write_json(path, payload):
  """Atomically writes `payload` as indented JSON."""
  return write_bytes(path, json_bytes(payload))


def temp_dir_for(path):
  """A fresh temp directory beside `path`, to be passed to `replace_dir`
  (the temps that killed writers of `path` left are removed first)."""
  remove_leftover_temps(path, dead_only=True)
  tmp = temp_name(path)
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  return tmp


@contextlib.contextmanager
def writing_dir(path):
  """Yields a fresh temp directory (not created) to fill; when the block
  ends without an error it replaces `path` (`replace_dir`), else it is
  removed, so a failed write (e.g. a full disk) leaves neither a partial
  directory nor its temp behind."""
  tmp = temp_dir_for(path)
  try:
    yield tmp
    # Within the try: stopped after the swap (a SIGTERM raised here), tmp
    # holds the old directory, removed as the new one's would be before.
    _put_in_place(tmp, path, replace_dir)
  except BaseException as e:
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(e, OSError):
      raise not_written(path, e) from None
    raise


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.lru_cache(maxsize=None)
def _renameat2():
  """The C library's renameat2, or None (not Linux, an old glibc)."""
  return getattr(ctypes.CDLL(None, use_errno=True), 'renameat2', None)


def _exchange(a, b):
  """Swaps the paths `a` and `b` in one step (Linux's renameat2 with
  RENAME_EXCHANGE); False where the C library or the file system cannot.
  """
  renameat2 = _renameat2()
  if renameat2 is None:
    return False
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
               _RENAME_EXCHANGE) == 0:
    return True
  error = ctypes.get_errno()
  if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
    return False
  raise OSError(error, os.strerror(error), b)


def replace_dir(tmp, path):
  """Moves the finished directory `tmp` to `path`, replacing what was there.

  A rename cannot replace a non-empty directory, so an existing `path` is
  swapped with `tmp` in one step where the system can (Linux), else first
  renamed aside (a kill before the second rename leaves no `path`:
  `finish_replace_dir`); the old one is deleted once the new is in place.
  """
  if not os.path.lexists(path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
      os.rename(tmp, path)
      return path
    except OSError as e:
      if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
        raise
      # Another writer put its directory there meanwhile: replace it.
  if _exchange(tmp, path):
    old = tmp
  else:
    old = temp_name(path) + '.old'
    os.rename(path, old)
    os.rename(tmp, path)
  if os.path.isdir(old) and not os.path.islink(old):
    shutil.rmtree(old)
  else:
    os.remove(old)
  return path


def finish_replace_dir(path):
  """Completes a `replace_dir(..., path)` that a killed process left
  between its two renames, then removes the other temp leftovers of `path`.

  With no directory at `path`, the one moved aside (`<temp>.old`) is put
  back in its place by its finished replacement when that exists, else by
  itself. Call only when no writer of `path` is running.

  Returns:
    The leftover moved to `path`, or None.
  """
  restored = None
  if not os.path.lexists(path):
    for leftover in leftover_temps(path):
      if leftover.endswith('.old'):
        finished = leftover[:-len('.old')]
        restored = finished if os.path.isdir(finished) else leftover
        os.rename(restored, path)
        break
  remove_leftover_temps(path)
  return restored
