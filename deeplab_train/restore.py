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

A reader can also keep the files it chose: inside a `pinning` block,
`hold(prefix)` makes hard links to the checkpoint's files in a hidden
folder beside it, and `restore` and `checkpoint_reader` read those until
the block ends. A training run deleting the checkpoint then frees only its
names, so every read of one command sees the checkpoint it chose (saves a
few seconds apart with --keep_checkpoint_max=1 would otherwise delete it
before each attempt's restore). Where links cannot be made (a read-only
folder, another file system, a remote path), the files are read in place.

TensorFlow is imported by `restore` only: the commands catch the errors
defined here before they load it.
"""
import contextlib
import glob
import logging
import os
import re
import shutil

from deeplab_train import atomic
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


_SHARD = re.compile(r'\.data-(\d{5})-of-(\d{5})$')


def missing_data(prefix, glob_fn=glob.glob):
  """Which data shards of the checkpoint `prefix` are missing, as a
  phrase ('no .data-* file', '.data-00001-of-00002'), or None when every
  shard is there. `glob_fn`: tf.io.gfile.glob for remote paths."""
  shards = [m for m in (_SHARD.search(p) for p in glob_fn(
      glob.escape(prefix) + '.data-*')) if m]
  if not shards:
    return 'no .data-* file'
  total = int(shards[0].group(2))
  lacking = sorted(set(range(total)) - {int(m.group(1)) for m in shards
                                        if int(m.group(2)) == total})
  if not lacking:
    return None
  return ', '.join('.data-%05d-of-%05d' % (i, total) for i in lacking)


def _check_files(path, prefix, tf):
  """For a read of the checkpoint `prefix` from `path` (its pin, or
  itself) that failed: raises CheckpointGoneError when its index is gone
  (a training run deletes the index first, then the data), and
  DamagedCheckpointError when its index is there without all its data (a
  copy or download stopped half-way)."""
  lacking = missing_data(path, tf.io.gfile.glob)
  if not tf.io.gfile.exists(path + '.index'):
    raise CheckpointGoneError(prefix) from None
  _check_data(prefix, lacking)


def check_complete(prefix):
  """Raises DamagedCheckpointError when the checkpoint `prefix` has its
  .index without all its data shards: before a restore, which would find
  it only after the graph is built. (A V1 checkpoint, one file, has
  neither.)"""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  path = read_path(prefix)
  if tf.io.gfile.exists(path + '.index'):
    _check_data(prefix, missing_data(path, tf.io.gfile.glob))


def _check_data(prefix, lacking):
  if lacking:
    raise DamagedCheckpointError(
        'checkpoint %s is incomplete: it has its .index but %s (a copy or '
        'download stopped half-way?); copy all its files (the .index and '
        'every .data-NNNNN-of-NNNNN) again, or use another checkpoint',
        prefix, lacking) from None


_ARCHIVE = re.compile(r'\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz|zip)$')


def file_not_a_checkpoint(path):
  """Why the file `path`, given where a checkpoint is expected, is none; None
  when it reads as one (a TF1 V1 checkpoint is a single file)."""
  if _ARCHIVE.search(path):
    return ('%s is an archive (a model zoo download?): extract it (tar -xf '
            '%s) and pass the folder it unpacks, which holds model.ckpt.index, '
            'or the model.ckpt prefix in it' % (path, path))
  try:
    checkpoint_reader(path)
  except Exception:  # pylint: disable=broad-except
    return ('%s is a file, not a checkpoint: pass a checkpoint prefix '
            '(DIR/model.ckpt-N, the name its .index file starts with) or '
            'the folder holding it' % path)
  return None


# {absolute prefix: the prefix of its pinned links} while they are held.
_pins = {}
# The ExitStacks of the `pinning` blocks open, innermost last.
_holders = []
# The name a pin folder is a temp of: '.model.ckpt-7.pin.tmp-PID@HOST'.
_PIN = '.pin'


@contextlib.contextmanager
def pinning():
  """The checkpoints `hold` pins in this block stay pinned until it ends."""
  with contextlib.ExitStack() as stack:
    _holders.append(stack)
    try:
      yield
    finally:
      _holders.pop()


def hold(prefix):
  """Pins the checkpoint `prefix` until the innermost `pinning` block ends
  (outside one, nothing happens), and returns `prefix`.

  Raises:
    CheckpointGoneError: its files were deleted before they were linked.
  """
  if _holders:
    _holders[-1].enter_context(pinned(prefix))
  return prefix


@contextlib.contextmanager
def pinned(prefix):
  """Reads of `prefix` in the block go to hard links to its files, made
  now (see the module's docstring); nothing happens when it is pinned
  already or cannot be linked.

  Raises:
    CheckpointGoneError: its files were deleted before they were linked.
  """
  key = os.path.abspath(prefix)
  folder = None if key in _pins or '://' in prefix else _link(key)
  if folder is None:
    yield
    return
  _pins[key] = os.path.join(folder, os.path.basename(key))
  try:
    yield
  finally:
    del _pins[key]
    shutil.rmtree(folder, ignore_errors=True)


def _link(prefix):
  """A new folder of hard links to the files of the checkpoint `prefix`
  (absolute), or None where they cannot be made.

  Raises:
    CheckpointGoneError: its files were deleted before they were linked.
  """
  directory = os.path.dirname(prefix)
  remove_dead_pins(directory)
  data = sorted(glob.glob(glob.escape(prefix) + '.data-*'))
  if not data:
    return None   # incomplete or gone: the reads say which
  folder = atomic.temp_name(prefix + _PIN)
  try:
    shutil.rmtree(folder, ignore_errors=True)
    os.mkdir(folder)
    for path in [prefix + '.index'] + data:
      os.link(path, os.path.join(folder, os.path.basename(path)))
  except FileNotFoundError:
    shutil.rmtree(folder, ignore_errors=True)
    raise CheckpointGoneError(prefix) from None
  except OSError as e:
    shutil.rmtree(folder, ignore_errors=True)
    logging.info('reading %s in place: its files cannot be linked (%s)',
                 prefix, e.strerror or e)
    return None
  return folder


def remove_dead_pins(directory):
  """Removes the pins that readers of this host left in `directory` when
  they were killed (their process is gone), and returns their names."""
  try:
    entries = sorted(os.listdir(directory))
  except OSError:
    return []
  removed = []
  for entry in entries:
    target = atomic.temp_target(entry)
    if (target and target.endswith(_PIN)
        and atomic.left_by_a_dead_process(entry)):
      shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
      removed.append(entry)
  if removed:
    logging.info('removed the checkpoint pins that killed readers left in '
                 '%s: %s', directory, ', '.join(removed))
  return removed


def carry_pins(directory, new_directory):
  """Gives `new_directory`, about to replace `directory` whole
  (atomic.replace_dir deletes the old one: the trainer's best/), copies of
  the pins live readers hold in `directory`, hard links to the same files
  under the same names: a pinned read goes on across the swap, and its
  reader removes the copy when it ends as it would its pin. A pin that
  cannot be copied (its reader just removed it) is skipped."""
  remove_dead_pins(directory)
  try:
    entries = sorted(os.listdir(directory))
  except OSError:
    return
  for entry in entries:
    target = atomic.temp_target(entry)
    if not (target and target.endswith(_PIN)):
      continue
    source = os.path.join(directory, entry)
    copy = os.path.join(new_directory, entry)
    try:
      os.mkdir(copy)
      for name in os.listdir(source):
        os.link(os.path.join(source, name), os.path.join(copy, name))
    except OSError:
      shutil.rmtree(copy, ignore_errors=True)


# What each file of a checkpoint adds to its prefix.
_FILE_SUFFIX = re.compile(r'\.(index|meta|data-\d+-of-\d+)$')


def prefix_of(path):
  """The checkpoint prefix when `path` names one of its files
  (model.ckpt-30000.index, .meta or .data-00000-of-00001, as a file listing
  shows them), else `path`. Given a file, the commands found a file there
  and read it as a checkpoint: none of the model's variables, or
  TensorFlow's 'not an sstable (bad magic number)'."""
  prefix = _FILE_SUFFIX.sub('', path)
  if prefix != path and os.path.isfile(prefix + '.index'):
    return prefix
  return path


def read_path(prefix):
  """Where the files of `prefix` are read: its pin, else itself."""
  return _pins.get(os.path.abspath(prefix), prefix)


def restore(saver, session, prefix):
  """saver.restore(session, prefix), a damaged checkpoint named.

  Raises:
    DamagedCheckpointError: the data cannot be read.
    CheckpointGoneError: its files were deleted meanwhile.
  """
  _restoring(prefix, lambda path: saver.restore(session, path))


def run_restore(session, op, prefix_input, prefix):
  """session.run(op) with `prefix_input` fed the path of the checkpoint
  `prefix`'s files, for an op reading them (tf.raw_ops.RestoreV2); errors
  as `restore`'s."""
  _restoring(prefix, lambda path: session.run(op, {prefix_input: path}))


def _restoring(prefix, read):
  """read(path of the files of `prefix`), a damaged checkpoint named."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  path = read_path(prefix)
  try:
    read(path)
  except (tf.errors.OpError, ValueError) as e:
    # ValueError: the Saver found no files for `prefix` before reading.
    _check_files(path, prefix, tf)
    if not isinstance(e, (tf.errors.OutOfRangeError,
                          tf.errors.DataLossError)):
      raise
    raise _damaged(prefix, 'its data is', e) from None


def checkpoint_reader(prefix):
  """tf.train.load_checkpoint(prefix).

  Raises:
    CheckpointGoneError: its files were deleted meanwhile.
    DamagedCheckpointError: its .index cannot be read (a damaged or cut
      short file: "not an sstable (bad magic number)", a traceback before).
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  path = read_path(prefix)
  try:
    return tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    _check_files(path, prefix, tf)
    if isinstance(e, (ValueError, tf.errors.NotFoundError,
                      tf.errors.PermissionDeniedError)):
      raise
    raise _damaged(prefix, 'its .index file is', e) from None


def _damaged(prefix, what, error):
  """The DamagedCheckpointError of `prefix` whose `what` ('its data is')
  TensorFlow's `error` could not read."""
  # TensorFlow's reason is its message's last line but the node it ran
  # ('\t [[{{node save/RestoreV2}}]]'), which was shown instead.
  lines = [line.strip() for line in (error.message or str(error)).splitlines()
           if line.strip() and not line.strip().startswith('[[')]
  reason = lines[-1] if lines else type(error).__name__
  return DamagedCheckpointError(
      'checkpoint %s cannot be read: ' + what + ' damaged or cut short (%s); '
      'use another checkpoint or copy this one again', prefix, reason)


# The ranges quantisation-aware training (the original's
# --quantize_delay_step) keeps beside a layer's variables, e.g. the model
# zoo's 8-bit checkpoints: 'MobilenetV2/Conv/weights_quant/min'.
QUANTISATION_RANGE_SUFFIXES = ('weights_quant/min', 'weights_quant/max',
                               'act_quant/min', 'act_quant/max')
# Checkpoint variables that no network builds (by their last name part),
# beside those ranges and the optimizer's slots ('<variable>/Momentum'):
# the step counter and Adam's powers of its decay rates.
_NOT_MODEL_VARIABLES = ('global_step', 'beta1_power', 'beta2_power')


def compare_shapes(prefix, variables):
  """How the checkpoint `prefix` fits `variables` (tf.Variables).

  Returns:
    (names of the variables it lacks, [(name, its shape in the checkpoint,
    the variable's shape)] of those it holds with another shape, names of
    the network variables it holds that `variables` lack: a part of the
    network the flags left out, e.g. the decoder). Optimizer slots
    ('<variable>/Momentum'), the global step and quantisation ranges are
    not network variables.
  """
  shapes = checkpoint_reader(prefix).get_variable_to_shape_map()
  missing, reshaped = [], []
  for var in variables:
    name = var.op.name
    if name not in shapes:
      missing.append(name)
    elif list(shapes[name]) != var.shape.as_list():
      reshaped.append((name, list(shapes[name]), var.shape.as_list()))
  built = {var.op.name for var in variables}
  unused = sorted(
      name for name in shapes
      if name not in built
      and name.rsplit('/', 1)[-1] not in _NOT_MODEL_VARIABLES
      and not name.endswith(QUANTISATION_RANGE_SUFFIXES)
      and name.rsplit('/', 1)[0] not in shapes)
  return missing, reshaped, unused
