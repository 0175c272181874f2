"""One training run per logdir: an exclusive lock file holding pid and host.

The lock is an `flock` on `<logdir>/.deeplab-train.lock`, which the kernel
releases when the process dies however it dies, so a lock left by a killed
run is never mistaken for a live one; the file's content (pid, host, start
time) only names the holder in messages. A leftover file from a dead run is
taken over (and logged).
"""
import contextlib
import errno
import fcntl
import json
import os
import socket
import time

from absl import logging

from deeplab_train import atomic

LOCK_FILENAME = '.deeplab-train.lock'


class LogdirLockedError(RuntimeError):
  """Another live process trains in this logdir."""

  def __init__(self, path, holder):
    pid = holder.get('pid', '?')
    host = holder.get('host', '?')
    super().__init__(
        '%s is locked by a running deeplab-train (pid %s on host %s, since %s);'
        ' wait for it or stop it (kill %s) before starting another run on this'
        ' logdir' % (os.path.dirname(path), pid, host,
                     holder.get('started', '?'), pid))
    self.path = path
    self.holder = holder


def _read_holder(fd):
  os.lseek(fd, 0, os.SEEK_SET)
  data = os.read(fd, 4096)
  try:
    return json.loads(data.decode() or '{}')
  except ValueError:
    return {}


def _write_holder(fd, holder):
  """Replaces the lock file's content by the holder's JSON, on disk."""
  os.ftruncate(fd, 0)
  os.lseek(fd, 0, os.SEEK_SET)
  os.write(fd, json.dumps(holder).encode())
  os.fsync(fd)


def _pid_alive(pid):
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, TypeError):
    return True
  return True


class LogdirLock:
  """Context manager holding the logdir lock.

  Raises:
    LogdirLockedError: on entry, when a live process holds the lock.
  """

  def __init__(self, logdir, filename=LOCK_FILENAME):
    # Another file name gives another lock (cluster workers other than the
    # chief each lock their own task in a logdir they share with it).
    self.path = os.path.join(logdir, filename)
    self._fd = None

  def acquire(self):
    """Takes the lock or raises LogdirLockedError (never waits)."""
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        holder = _read_holder(fd)
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise LogdirLockedError(self.path, holder) from None
        raise
      # The previous holder may have removed the file between our open and
      # flock: then we hold a lock on a deleted file; try again.
      try:
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    previous = _read_holder(fd)
    if previous:
      logging.warning(
          'Taking over the stale lock %s of pid %s on host %s: that run ended '
          'without releasing it (the process is %s)', self.path,
          previous.get('pid', '?'), previous.get('host', '?'),
          'gone' if not _pid_alive(previous.get('pid'))
          else 'not a deeplab-train holding the lock')
    me = {'pid': os.getpid(), 'host': socket.gethostname(),
          'started': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
    try:
      _write_holder(fd, me)
    except OSError as e:  # e.g. a full disk: the lock is not taken
      with contextlib.suppress(FileNotFoundError):
        os.unlink(self.path)
      os.close(fd)
      raise atomic.not_written(self.path, e) from None
    self._fd = fd
    return self

  def release(self):
    """Removes the lock file and drops the lock."""
    if self._fd is None:
      return
    try:
      os.unlink(self.path)
    except FileNotFoundError:
      pass
    os.close(self._fd)
    self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
    return False
