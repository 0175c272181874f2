"""The data folder a retraining round converts: its check and fingerprint.

The fingerprint tells whether the TFRecords must be rebuilt: it changes
when a file of the data folder is added, removed, resized or touched, or
when a conversion setting changes. Earlier versions of cron_retrain.sh
computed it in the shell; `fingerprint()` gives the same value for the same
folder, so that an upgrade does not rebuild and retrain for nothing:

    { cd DATA_DIR && find -L . -type f -printf '%P\\t%s\\t%T@\\n' | LC_ALL=C sort
      printf 'settings\\t%s\\n' SETTING...; } | sha256sum
"""
import dataclasses
import hashlib
import os
import stat

from deeplab_train.data import build_inputs
from deeplab_train.retrain import policy


# DATA_LAYOUT: PASCAL VOC's folders, or a Cityscapes root (leftImg8bit/ and
# gtFine/ by split and city, converted by deeplab-build-data
# --cityscapes_root, which converts its train and val splits).
VOC = 'voc'
CITYSCAPES = 'cityscapes'
LAYOUTS = (VOC, CITYSCAPES)
CITYSCAPES_FOLDERS = (build_inputs.CITYSCAPES_IMAGE_FOLDER,
                      build_inputs.CITYSCAPES_LABEL_FOLDER)
CITYSCAPES_SPLITS = build_inputs.CITYSCAPES_DEFAULT_SPLITS


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the images, labels and split lists are (the script's settings).

  Attributes:
    image_subdir: IMAGE_SUBDIR.
    label_subdir: LABEL_SUBDIR.
    list_subdir: LIST_SUBDIR.
    splits: the splits a round needs a list of (TRAIN_SPLIT, EVAL_SPLIT).
    kind: DATA_LAYOUT, VOC or CITYSCAPES (a Cityscapes root has no
      subdirs or lists to set: only `splits` applies).
  """
  image_subdir: str
  label_subdir: str
  list_subdir: str
  splits: tuple
  kind: str = VOC


def problem(data_dir, layout):
  """What is missing in the data folder, or None.

  Args:
    data_dir: the data folder.
    layout: its Layout.

  Returns:
    A message naming the missing folder or list file.
  """
  if not os.path.isdir(data_dir):
    return 'DATA_DIR=%s is not a folder' % data_dir
  if layout.kind == CITYSCAPES:
    return _cityscapes_problem(data_dir, layout.splits)
  subdirs = (layout.image_subdir, layout.label_subdir, layout.list_subdir)
  for sub in subdirs:
    if not os.path.isdir(os.path.join(data_dir, sub)):
      return ('%s/%s is missing (expected VOC layout: %s; see -h)'
              % (data_dir, sub, ', '.join(subdirs)))
  for split in layout.splits:
    path = os.path.join(data_dir, layout.list_subdir, split + '.txt')
    if not (os.path.isfile(path) and os.path.getsize(path) > 0):
      return '%s is missing or empty' % path
  return None


def _cityscapes_problem(data_dir, splits):
  """problem() of a Cityscapes root."""
  for split in splits:
    if split not in CITYSCAPES_SPLITS:
      return ("DATA_LAYOUT=cityscapes converts the train and val splits: "
              "TRAIN_SPLIT and EVAL_SPLIT must be one of them, got '%s'"
              % split)
  for folder in CITYSCAPES_FOLDERS:
    for split in CITYSCAPES_SPLITS:
      path = os.path.join(data_dir, folder, split)
      if not os.path.isdir(path):
        return ('%s is missing (expected a Cityscapes root: %s, each with '
                '<split>/<city>/ folders for %s; see -h)'
                % (path, ' and '.join(f + '/' for f in CITYSCAPES_FOLDERS),
                   ' and '.join(CITYSCAPES_SPLITS)))
  return None


def _mtime(status):
  """An mtime as find's %T@ prints it (seconds, then 10 decimals)."""
  seconds, nanoseconds = divmod(status.st_mtime_ns, 10**9)
  return '%d.%09d0' % (seconds, nanoseconds)


def _listing(folder, relative='', ancestors=frozenset()):
  """find -L's `path<TAB>size<TAB>mtime` line of every file, as bytes.

  Links are followed, as find -L does: a file or folder reached through a
  link is listed under the link's path, a dangling link is no file.

  Raises:
    policy.RoundError: on a symbolic link loop (find -L fails on one too).
  """
  status = os.stat(folder)
  ancestors = ancestors | {(status.st_dev, status.st_ino)}
  lines = []
  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    try:
      status = os.stat(path)
    except OSError:
      continue
    if stat.S_ISDIR(status.st_mode):
      if (status.st_dev, status.st_ino) in ancestors:
        raise policy.RoundError('%s: a symbolic link loop in the data folder'
                                % path)
      lines += _listing(path, relative + name + '/', ancestors)
    elif stat.S_ISREG(status.st_mode):
      lines.append(os.fsencode('%s%s\t%d\t%s\n' % (
          relative, name, status.st_size, _mtime(status))))
  return lines


def fingerprint(data_dir, conversion_settings):
  """The data folder's fingerprint (a SHA-256 hex digest).

  Args:
    data_dir: the data folder.
    conversion_settings: the strings that change the TFRecords besides the
      files (subfolders, image format, dataset name, classes, ignore label,
      shards, extra flags), in the script's order.
  """
  digest = hashlib.sha256()
  for line in sorted(_listing(data_dir)):
    digest.update(line)
  for value in conversion_settings:
    digest.update(os.fsencode('settings\t%s\n' % value))
  return digest.hexdigest()
