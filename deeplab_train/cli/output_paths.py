"""Output paths checked before a command does any work.

A command that would fail only when it writes its result (after a whole
evaluation, say) checks its output folders and files first: a path that is
a file where a folder is wanted (or the other way round), lies under a
file, or cannot be written is a bad-input error naming the flag. Paths go
into the errors as values, never into their templates.
"""
import os
import tempfile

from deeplab_train import config


def _write_refusal(folder):
  """Why no entry can be created in the existing `folder` ('is not
  writable', or 'refuses new entries (REASON)'), or None if one can.

  The permission bits first, then tried for real (an empty folder made and
  removed at once): the bits do not stop root, while a read-only or
  virtual file system (/proc, /sys) refuses root too.
  """
  if not os.access(folder, os.W_OK | os.X_OK):
    return 'is not writable'
  try:
    os.rmdir(tempfile.mkdtemp(prefix='.deeplab-write-check-', dir=folder))
  except OSError as e:
    return 'refuses new entries (%s)' % (e.strerror or e)
  return None


def _place_problem(flag_name, path, what):
  """A ConfigError when `path` (to be created) cannot be: its nearest
  existing ancestor must be a writable folder; else None."""
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return config.ConfigError('--%s=%s is under %s, which is a file: give '
                              + what, flag_name, path, parent)
  refusal = _write_refusal(parent)
  if refusal:
    return config.ConfigError('--%s=%s cannot be created: %s %s; give '
                              + what, flag_name, path, parent, refusal)
  return None


def _check_local(flag_name, path):
  """Raises ConfigError for a URL (gs://...): the commands write through
  the local file system (locks, renames), where one made a folder named
  'gs:' and failed at the end of the work."""
  if '://' in path:
    raise config.ConfigError(
        '--%s=%s is a URL: the outputs are written to a local or mounted '
        'file system (a bucket mounted with gcsfuse, say); give a path there '
        'and copy the results where you want them', flag_name, path)


def check_output_folder(flag_name, path):
  """Raises ConfigError when the folder `path` given by --flag_name cannot
  be written: a URL, a file, under a file, or not writable."""
  if not path:
    return
  _check_local(flag_name, path)
  what = 'a folder you can write to (created if missing)'
  if not os.path.exists(path):
    problem = _place_problem(flag_name, path, what)
  elif not os.path.isdir(path):
    problem = config.ConfigError('--%s=%s is a file, not a folder: give '
                                 + what, flag_name, path)
  elif _write_refusal(path):
    problem = config.ConfigError('--%s=%s is not writable: give ' + what,
                                 flag_name, path)
  else:
    problem = None
  if problem:
    raise problem


def check_writable(flag_name, path, why):
  """Raises ConfigError when the existing folder `path` given by
  --flag_name (an input folder the command also writes to) refuses new
  entries; `why` says what is written there and how to do without."""
  refusal = _write_refusal(path)
  if refusal:
    raise config.ConfigError('--%s=%s %s: %s', flag_name, path, refusal, why)


def check_output_file(flag_name, path):
  """Raises ConfigError when the file `path` given by --flag_name cannot be
  written: a URL, a folder, under a file, or in a folder that is not
  writable."""
  if not path:
    return
  _check_local(flag_name, path)
  what = 'the path of a file you can write'
  if os.path.isdir(path):
    problem = config.ConfigError('--%s=%s is a folder: give ' + what,
                                 flag_name, path)
  elif path.endswith(('/', os.sep)):
    problem = config.ConfigError('--%s=%s ends with a slash, as a folder '
                                 'does: give ' + what + ' (e.g. %smodel)',
                                 flag_name, path, path)
  elif os.path.exists(path):
    # Replaced by rename: the folder must be writable, not the file.
    folder = os.path.dirname(os.path.abspath(path))
    problem = (config.ConfigError('--%s=%s cannot be replaced: %s is not '
                                  'writable; give ' + what, flag_name, path,
                                  folder)
               if _write_refusal(folder) else None)
  else:
    problem = _place_problem(flag_name, path, what)
  if problem:
    raise problem
