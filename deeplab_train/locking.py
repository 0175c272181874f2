"""One writer per folder: an exclusive lock file holding pid and host.

deeplab-train locks its logdir (runtime/lock.py); deeplab-build-data and
deeplab-stats --write_dataset_json lock a TFRecord folder (data/build.py).
The lock is an `flock` on a hidden file in the folder, which the kernel
releases when the process dies however it dies, so a lock left by a killed
run is never mistaken for a live one; the file's content (pid, host,
command, start time) only names the holder in messages. A leftover file
from a dead run is taken over (and logged).
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


class FolderLockedError(RuntimeError):
  """Another live process holds the folder's lock."""

  def __init__(self, path, holder, command, another):
    pid = holder.get('pid', '?')
    host = holder.get('host', '?')
    super().__init__(
        '%s is locked by a running %s (pid %s on host %s, since %s); wait for'
        ' it or stop it (kill %s) before starting another %s'
        % (os.path.dirname(path), holder.get('command', command), pid, host,
           holder.get('started', '?'), pid, another))
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


class FolderLock:
  """Context manager holding the lock file `filename` of `folder`.

  Args:
    folder: an existing folder.
    filename: the lock file's name in it; another name is another lock.
    command: the command taking it, named in messages (the lock file
      records it for the other commands taking the same lock).
    another: what a second holder would be, for the message telling it to
      wait ('deeplab-build-data on this folder').

  Raises:
    FolderLockedError: on entry, when a live process holds the lock.
  """

  def __init__(self, folder, filename, command, another):
    self.path = os.path.join(folder, filename)
    self._command = command
    self._another = another
    self._fd = None

  def acquire(self):
    """Takes the lock or raises FolderLockedError (never waits)."""
    while True:
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except OSError as e:  # e.g. a read-only folder
        raise atomic.not_written(self.path, e) from None
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        holder = _read_holder(fd)
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise FolderLockedError(self.path, holder, self._command,
                                  self._another) from None
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
          'gone' if not atomic.process_alive(previous.get('pid'))
          else 'not a %s holding the lock' % previous.get('command',
                                                          self._command))
    me = {'pid': os.getpid(), 'host': socket.gethostname(),
          'command': self._command,
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
