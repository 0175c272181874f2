"""Restoring a checkpoint, with one clear error when its files are damaged.

A checkpoint whose data file was cut short (a full disk, a copy stopped
half-way) or damaged fails inside TensorFlow's RestoreV2 op with a long
graph traceback ("Read less bytes than requested"). Every command that
restores weights (eval, vis, export, and training's initial checkpoint)
goes through `restore`, which names the checkpoint and says what to do.

A checkpoint deleted while it is read (a training run keeps only its newest
checkpoints, deleting the older ones) is a CheckpointGoneError, which the
commands reading the latest checkpoint of a directory answer by starting
again from the new latest (cli/inference_flags.py).

TensorFlow is imported by `restore` only: the commands catch the errors
defined here before they load it.
"""
import glob

from deeplab_train.config import ConfigError


class DamagedCheckpointError(ConfigError):
  """The checkpoint's files cannot be read."""


class CheckpointGoneError(ConfigError):
  """The checkpoint's files were deleted while it was being read.

  Attributes:
    prefix: the checkpoint.
  """

  def __init__(self, prefix):
    super().__init__(
        'checkpoint %s was deleted while it was being read (the training run '
        'writing it keeps only its newest checkpoints); use a newer one',
        prefix)
    self.prefix = prefix


def _gone(prefix, tf):
  return not (tf.io.gfile.exists(prefix + '.index') and
              tf.io.gfile.glob(glob.escape(prefix) + '.data-*'))


def restore(saver, session, prefix):
  """saver.restore(session, prefix), a damaged checkpoint named.

  Raises:
    DamagedCheckpointError: the data cannot be read.
    CheckpointGoneError: its files were deleted meanwhile.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  try:
    saver.restore(session, prefix)
  except (tf.errors.OpError, ValueError) as e:
    # ValueError: the Saver found no files for `prefix` before reading.
    if _gone(prefix, tf):
      raise CheckpointGoneError(prefix) from None
    if not isinstance(e, (tf.errors.OutOfRangeError,
                          tf.errors.DataLossError)):
      raise
    reason = (e.message or str(e)).strip().splitlines()[-1].strip()
    raise DamagedCheckpointError(
        'checkpoint %s cannot be read: its data is damaged or cut short '
        '(%s); use another checkpoint or copy this one again', prefix,
        reason) from None


def checkpoint_reader(prefix):
  """tf.train.load_checkpoint(prefix).

  Raises:
    CheckpointGoneError: its files were deleted meanwhile.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  try:
    return tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError):
    if _gone(prefix, tf):
      raise CheckpointGoneError(prefix) from None
    raise
