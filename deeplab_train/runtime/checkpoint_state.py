"""The logdir's checkpoint state file, repaired from the checkpoints on disk.

TensorFlow finds the latest checkpoint through the small `checkpoint` state
file. When that file is missing, unreadable or names checkpoint files that
are gone, tf.train.latest_checkpoint answers None, and a resumed run would
start again from step 0 on top of the existing checkpoints (overwriting
model.ckpt-0 and orphaning the rest); when the latest checkpoint's data is
cut short (a full disk, a copy stopped half-way), restoring it fails.
`repair` looks at the checkpoint files themselves and, when the latest is
missing or unreadable, rewrites the state file to name the newest complete
and readable one (saying so), so that the run resumes from it.
"""
import glob
import logging
import os
import re
import shutil

import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train import restore

_INDEX = re.compile(r'^(?P<prefix>.*-(?P<step>\d+))\.index$')


def complete_checkpoints(logdir, basename='model.ckpt'):
  """Prefixes of the complete checkpoints in `logdir`, oldest step first."""
  found = []
  for path in glob.glob(os.path.join(glob.escape(os.path.abspath(logdir)),
                                     basename + '-*.index')):
    m = _INDEX.match(path)
    if m and restore.missing_data(m.group('prefix')) is None:
      found.append((int(m.group('step')), m.group('prefix')))
  return [prefix for _, prefix in sorted(found)]


def inside(prefix, folder):
  """Whether the checkpoint `prefix` lies in `folder` itself."""
  return (os.path.dirname(os.path.realpath(prefix)) ==
          os.path.realpath(folder))


def _state(folder):
  """The state file of `folder` read, or None when it is missing or cannot
  be read (not text, empty), where TensorFlow raises."""
  try:
    return tf.train.get_checkpoint_state(folder)
  except (UnicodeDecodeError, ValueError, tf.errors.OpError):
    return None


def latest(folder):
  """The checkpoint the state file of `folder` names, when its files are
  there, as tf.train.latest_checkpoint gives it; None when the state file
  cannot be read (not text, empty: a crash can leave it empty), where
  TensorFlow raises, or when the files are gone, where TensorFlow logs
  an error line of its own beside the message the callers give."""
  state = _state(folder)
  named = state.model_checkpoint_path if state else ''
  if named and (tf.io.gfile.exists(named + '.index') or
                tf.io.gfile.exists(named)):   # V2, or V1 (the file itself)
    return named
  return None


_UNREADABLE = 'cannot be read (empty, or not a state file)'


def _state_file_problem(folder, named):
  """Why the state file of `folder` does not give a checkpoint of its own
  (`named`: what it names, from `latest`)."""
  state = os.path.join(folder, 'checkpoint')
  if named is not None:
    return 'names %s, outside this folder (a moved or copied logdir?)' % named
  if not os.path.exists(state):
    return 'is missing'
  try:
    gone = tf.train.get_checkpoint_state(folder).model_checkpoint_path
  except (AttributeError, UnicodeDecodeError, ValueError, tf.errors.OpError):
    return _UNREADABLE
  return 'names %s, whose files are gone' % gone if gone else 'names none'


def to_read(folder, warn=True):
  """The checkpoint of `folder` that a reader (eval, vis, export, an
  initial checkpoint) takes.

  The state file's latest checkpoint when it lies in the folder. Otherwise
  (a logdir moved or copied with the original's absolute paths, a missing
  or damaged state file) the folder's newest complete model.ckpt-N, with a
  warning when `warn`; failing that, the folder's only checkpoint of any
  name (a model zoo folder holds model.ckpt and no state file: no warning
  then). Unlike `repair`, nothing is rewritten: readers leave a logdir as
  it is.

  Returns:
    A checkpoint prefix; what the state file names outside the folder when
    the folder holds no checkpoint of its own; None when there is nothing.
  """
  named = latest(folder)
  if named is not None and inside(named, folder):
    return named
  local = complete_checkpoints(folder)
  if local:
    if warn:
      logging.warning('the state file of %s %s; using the newest complete '
                      'checkpoint in the folder, %s', folder,
                      _state_file_problem(folder, named), local[-1])
    return local[-1]
  indexes = glob.glob(os.path.join(glob.escape(folder), '*.index'))
  if len(indexes) != 1:
    return named
  only = indexes[0][:-len('.index')]
  has_state = os.path.exists(os.path.join(folder, 'checkpoint'))
  if warn and has_state:
    logging.warning('the state file of %s %s; using the only checkpoint in '
                    'the folder, %s', folder,
                    _state_file_problem(folder, named), only)
  elif warn:   # a model zoo folder: nothing to warn about
    logging.info('using %s, the only checkpoint in %s', only, folder)
  return only


def resolve(path, option, advice, error=config.ConfigError):
  """The checkpoint prefix that `path`, given to a reader, names.

  Args:
    path: a checkpoint prefix ('DIR/model.ckpt-30000'), one of its files, a
      V1 checkpoint (a single file), or a folder (`to_read`'s choice in it).
    option: the option's reference for messages, e.g.
      '{TrainOptions.tf_initial_checkpoint}'.
    advice: what to do when a folder holds no checkpoint (a template that
      may hold references, no %-specs).
    error: the ConfigError class to raise.

  Returns:
    The checkpoint prefix.

  Raises:
    error: nothing readable at `path`.
  """
  path = restore.prefix_of(path)
  if os.path.isdir(path):
    prefix = to_read(path)
    if prefix is None:
      indexes = glob.glob(os.path.join(glob.escape(path), '*.index'))
      raise error(option + '=%s holds no checkpoint to read (its '
                  '"checkpoint" state file %s, no complete model.ckpt-N, and '
                  '%s .index files): ' + advice, path,
                  _state_file_problem(path, None), len(indexes) or 'no')
    return prefix
  # A checkpoint pinned (restore.hold) earlier is read from its pin.
  if tf.io.gfile.exists(restore.read_path(path) + '.index'):
    return path
  if os.path.isfile(path):
    why = restore.file_not_a_checkpoint(path)
    if why:
      raise error(option + '=%s', why)
    return path
  raise error(option + '=%s: no checkpoint there (expected %s.index, or a '
              'folder holding checkpoints)', path, path)


def readable(prefix):
  """Whether every tensor of the checkpoint `prefix` can be read (a
  truncated or damaged data file cannot)."""
  try:
    reader = tf.train.NewCheckpointReader(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except Exception:  # pylint: disable=broad-except
    # TensorFlow raises DataLossError, OutOfRangeError or IndexError ("Read
    # less bytes than requested") depending on where the data stops.
    return False
  return True


# TensorFlow's temp name of a file it writes and renames (the state file,
# a checkpoint's .meta): the name + '.tmp' + a uuid4's hex.
_TF_TEMP = re.compile(r'\.tmp[0-9a-f]{32}$')


def remove_killed_saves(logdir, basename='model.ckpt'):
  """Removes what saves killed half-way left in `logdir`: TensorFlow's temp
  files of the state file and of checkpoint files, the saver's `_temp`
  folders, and the files of checkpoints that have no index (never
  complete). Call with the logdir lock held, before resuming: no save is
  running then.

  Returns:
    The removed names, sorted.
  """
  if not os.path.isdir(logdir):
    return []
  own = re.compile(r'^%s-\d+(?P<rest>_temp|\..+)$' % re.escape(basename))
  removed = []
  for entry in sorted(os.listdir(logdir)):
    path = os.path.join(logdir, entry)
    match = own.match(entry)
    if match:
      prefix = path[:len(path) - len(match.group('rest'))]
      left = (match.group('rest') == '_temp' or _TF_TEMP.search(entry) or
              not os.path.exists(prefix + '.index'))
    else:
      left = entry.startswith('checkpoint.tmp') and _TF_TEMP.search(entry)
    if not left:
      continue
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)
    removed.append(entry)
  if removed:
    logging.info('removed %d files that killed saves left in %s: %s',
                 len(removed), logdir, ', '.join(removed))
  return removed


def _listed_outside(folder):
  """The checkpoints the state file of `folder` lists (besides its latest)
  that lie outside the folder."""
  state = _state(folder)
  return [p for p in (state.all_model_checkpoint_paths if state else ())
          if not inside(p, folder)]


def repair(logdir, basename='model.ckpt'):
  """The checkpoint of `logdir` to resume from, the state file rewritten if
  needed.

  Returns:
    The prefix tf.train.latest_checkpoint gives when it is readable.
    Otherwise (no state file, a damaged one, a latest checkpoint whose
    files are gone or damaged, or checkpoints listed outside the folder)
    the newest complete and readable checkpoint on disk, after rewriting
    the state file to name it (and the complete ones before it), with a
    warning saying why. None when the logdir holds no checkpoint.

  Raises:
    ConfigError: checkpoints are there but none can be read.
  """
  named = latest(logdir)
  elsewhere = named is not None and not inside(named, logdir)
  # Older entries outside the folder (a copied logdir the original then
  # trained in): the saver took them into its rotation and deleted them.
  older_elsewhere = (named is not None and not elsewhere and
                     _listed_outside(logdir))
  if named and not elsewhere and not older_elsewhere and readable(named):
    return named
  if not os.path.isdir(logdir):
    return None
  state = os.path.join(logdir, 'checkpoint')
  if elsewhere:
    # A logdir copied with the original's absolute paths: resumed from
    # there, the saver then deleted that folder's checkpoints.
    if not complete_checkpoints(logdir, basename):
      raise config.ConfigError(
          'the state file %s names %s, outside this folder, and the folder '
          'holds no checkpoint of its own: copy that checkpoint here, or start '
          'from it with {TrainOptions.tf_initial_checkpoint}', state, named)
  if older_elsewhere and readable(named):
    why = ('lists checkpoints outside this folder (e.g. %s), which the '
           'saver would delete in turn (a copied logdir?)'
           % older_elsewhere[0])
    named = None  # the folder's own, the newest among them
  elif named and not elsewhere:
    why = 'names %s, which cannot be read (damaged or cut short)' % named
  else:
    why = _state_file_problem(logdir, named)
  prefixes = [p for p in complete_checkpoints(logdir, basename)
              if os.path.abspath(p) != os.path.abspath(named or '')]
  while prefixes and not readable(prefixes[-1]):
    logging.warning('checkpoint %s cannot be read (damaged or cut short); '
                    'skipping it', prefixes.pop())
  if not prefixes:
    if named or complete_checkpoints(logdir, basename):
      # Never start over on top of checkpoints that are there.
      raise config.ConfigError(
          'the checkpoints in %s cannot be read (damaged or cut short; the '
          'state file %s); move them away or use another train_logdir to '
          'start afresh', logdir, why)
    if why == _UNREADABLE:
      # TensorFlow's session manager would raise reading it. It holds
      # nothing readable; kept aside for a look.
      os.replace(state, state + '.damaged')
      logging.warning('%s %s, and %s holds no checkpoint: starting at step '
                      '0 (the file is moved to %s.damaged)', state, why,
                      logdir, state)
    return None
  logging.warning('%s %s; resuming from the newest complete checkpoint on '
                  'disk, %s, and rewriting the state file to name it',
                  state, why, prefixes[-1])
  # Named as the trainer's saver names them (DIR/model.ckpt-N with DIR the
  # logdir as given, which TensorFlow writes as model.ckpt-N): absolute
  # paths under a relative logdir were made relative a second time at the
  # next save ('../model.ckpt-N'), and rotation then deleted the files of
  # that name in the folder above. TensorFlow writes the state file to a
  # temp name and renames it.
  named = [os.path.join(logdir, os.path.basename(p)) for p in prefixes]
  tf.train.update_checkpoint_state(logdir, named[-1],
                                   all_model_checkpoint_paths=named)
  return prefixes[-1]
