"""One training run per logdir: deeplab-train's lock (locking.py) on
`<logdir>/.deeplab-train.lock`."""
from deeplab_train import locking

LOCK_FILENAME = '.deeplab-train.lock'

LogdirLockedError = locking.FolderLockedError


class LogdirLock(locking.FolderLock):
  """Context manager holding the logdir lock.

  Another file name gives another lock (cluster workers other than the
  chief each lock their own task in a logdir they share with it).

  Raises:
    LogdirLockedError: on entry, when a live process holds the lock.
  """

  def __init__(self, logdir, filename=LOCK_FILENAME):
    super().__init__(logdir, filename, 'deeplab-train', 'run on this logdir')
