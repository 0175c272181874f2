"""The logdir's checkpoint state file, repaired from the checkpoints on disk.

TensorFlow finds the latest checkpoint through the small `checkpoint` state
file. When that file is missing, unreadable or names checkpoint files that
are gone, tf.train.latest_checkpoint answers None, and a resumed run would
start again from step 0 on top of the existing checkpoints (overwriting
model.ckpt-0 and orphaning the rest). `repair` looks at the checkpoint files
themselves instead and, when a complete one exists, rewrites the state file
to name the newest (saying so), so that the run resumes from it.
"""
import glob
import logging
import os
import re

import tensorflow.compat.v1 as tf

_INDEX = re.compile(r'^(?P<prefix>.*-(?P<step>\d+))\.index$')
_SHARD = re.compile(r'\.data-(\d{5})-of-(\d{5})$')


def _complete(prefix):
  """Whether `prefix` has its index and every data shard it names."""
  shards = [m for m in (_SHARD.search(p) for p in glob.glob(
      glob.escape(prefix) + '.data-*')) if m]
  if not shards:
    return False
  total = int(shards[0].group(2))
  have = {int(m.group(1)) for m in shards if int(m.group(2)) == total}
  return have == set(range(total))


def complete_checkpoints(logdir, basename='model.ckpt'):
  """Prefixes of the complete checkpoints in `logdir`, oldest step first."""
  found = []
  for path in glob.glob(os.path.join(glob.escape(os.path.abspath(logdir)),
                                     basename + '-*.index')):
    m = _INDEX.match(path)
    if m and _complete(m.group('prefix')):
      found.append((int(m.group('step')), m.group('prefix')))
  return [prefix for _, prefix in sorted(found)]


def repair(logdir, basename='model.ckpt'):
  """The latest checkpoint of `logdir`, the state file rewritten if needed.

  Returns:
    The prefix tf.train.latest_checkpoint gives, or, when it gives None but
    complete checkpoints are on disk, the newest of them, after rewriting
    the state file to name it (and the others, oldest first). None when
    the logdir holds no complete checkpoint.
  """
  try:
    latest = tf.train.latest_checkpoint(logdir)
  except (UnicodeDecodeError, ValueError, tf.errors.OpError):
    latest = None  # a state file that is not text: TensorFlow raises
  if latest or not os.path.isdir(logdir):
    return latest
  prefixes = complete_checkpoints(logdir, basename)
  if not prefixes:
    return None
  state = os.path.join(logdir, 'checkpoint')
  why = ('is missing' if not os.path.exists(state)
         else 'is unreadable or names checkpoint files that are gone')
  logging.warning('%s %s; resuming from the newest complete checkpoint on '
                  'disk, %s, and rewriting the state file to name it',
                  state, why, prefixes[-1])
  # TensorFlow writes the state file to a temp name and renames it.
  tf.train.update_checkpoint_state(logdir, prefixes[-1],
                                   all_model_checkpoint_paths=prefixes)
  return prefixes[-1]
