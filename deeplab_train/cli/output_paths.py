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


def _creation_refused(folder):
  """The OSError of creating an entry in `folder`, or None if it can be.

  Tried for real (an empty folder made and removed at once): the
  permission bits do not stop root, while a read-only or virtual file
  system (/proc, /sys) refuses root too.
  """
  try:
    os.rmdir(tempfile.mkdtemp(prefix='.deeplab-write-check-', dir=folder))
  except OSError as e:
    return e
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
  if not os.access(parent, os.W_OK | os.X_OK):
    return config.ConfigError('--%s=%s cannot be created: %s is not '
                              'writable; give ' + what, flag_name, path,
                              parent)
  refused = _creation_refused(parent)
  if refused:
    return config.ConfigError('--%s=%s cannot be created: %s refuses new '
                              'entries (%s); give ' + what, flag_name, path,
                              parent, refused.strerror or refused)
  return None


def check_output_folder(flag_name, path):
  """Raises ConfigError when the folder `path` given by --flag_name cannot
  be written: a file, under a file, or not writable."""
  if not path:
    return
  what = 'a folder you can write to (created if missing)'
  if not os.path.exists(path):
    problem = _place_problem(flag_name, path, what)
  elif not os.path.isdir(path):
    problem = config.ConfigError('--%s=%s is a file, not a folder: give '
                                 + what, flag_name, path)
  elif (not os.access(path, os.W_OK | os.X_OK)
        or _creation_refused(path)):
    problem = config.ConfigError('--%s=%s is not writable: give ' + what,
                                 flag_name, path)
  else:
    problem = None
  if problem:
    raise problem


def check_output_file(flag_name, path):
  """Raises ConfigError when the file `path` given by --flag_name cannot be
  written: a folder, under a file, or in a folder that is not writable."""
  if not path:
    return
  what = 'the path of a file you can write'
  if os.path.isdir(path):
    problem = config.ConfigError('--%s=%s is a folder: give ' + what,
                                 flag_name, path)
  elif os.path.exists(path):
    # Replaced by rename: the folder must be writable, not the file.
    folder = os.path.dirname(os.path.abspath(path))
    writable = (os.access(folder, os.W_OK | os.X_OK)
                and not _creation_refused(folder))
    problem = (None if writable else
               config.ConfigError('--%s=%s cannot be replaced: %s is not '
                                  'writable; give ' + what, flag_name, path,
                                  folder))
  else:
    problem = _place_problem(flag_name, path, what)
  if problem:
    raise problem
