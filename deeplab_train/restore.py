"""Restoring a checkpoint, with one clear error when its files are damaged.

A checkpoint whose data file was cut short (a full disk, a copy stopped
half-way) or damaged fails inside TensorFlow's RestoreV2 op with a long
graph traceback ("Read less bytes than requested"). Every command that
restores weights (eval, vis, export, and training's initial checkpoint)
goes through `restore`, which names the checkpoint and says what to do.
"""
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError


class DamagedCheckpointError(ConfigError):
  """The checkpoint's files cannot be read."""


def restore(saver, session, prefix):
  """saver.restore(session, prefix), a damaged checkpoint named.

  Raises:
    DamagedCheckpointError: the data cannot be read.
  """
  try:
    saver.restore(session, prefix)
  except (tf.errors.OutOfRangeError, tf.errors.DataLossError) as e:
    reason = (e.message or str(e)).strip().splitlines()[-1].strip()
    raise DamagedCheckpointError(
        'checkpoint %s cannot be read: its data is damaged or cut short '
        '(%s); use another checkpoint or copy this one again', prefix,
        reason) from None
