"""The files a retraining round reads and writes besides the commands' own.

The work folder's state/ holds what earlier rounds did (docs/cron.md):

  built.fingerprint    data fingerprint of the TFRecords in use
  trained.fingerprint  data fingerprint the last training run saw
  decided              "<step> <fingerprint>" of the last checkpoint
                       promoted or kept

Each is written under a temp name and renamed, so that a killed round
leaves the old value or the new one. The rules that use them are in
policy.py. Here too: reading the eval results and the current export's
metrics.json, writing a new export's metrics.json and checkpoint state and
the round's summary, and listing what may be pruned (old logs, exports and
records).
"""
import datetime
import fnmatch
import json
import os

from deeplab_train import atomic
from deeplab_train.retrain import policy
from deeplab_train.retrain import records

BUILT = 'built.fingerprint'
TRAINED = 'trained.fingerprint'
DECIDED = 'decided'


def _read_text(path):
  """The stripped text of `path`, None when it does not exist."""
  try:
    with open(path, encoding='utf-8') as f:
      return f.read().strip()
  except FileNotFoundError:
    return None


def load(state_dir):
  """The policy.State stored in `state_dir`."""
  return policy.State(built=_read_text(os.path.join(state_dir, BUILT)),
                      trained=_read_text(os.path.join(state_dir, TRAINED)),
                      decided=_read_text(os.path.join(state_dir, DECIDED)))


def record(state_dir, name, value):
  """Stores `value` as state file `name` (BUILT, TRAINED or DECIDED)."""
  atomic.write_bytes(os.path.join(state_dir, name),
                     (value + '\n').encode('utf-8'))


def record_decision(state_dir, step, fingerprint):
  """Stores that checkpoint `step` was promoted or kept on this data."""
  record(state_dir, DECIDED, policy.decision_key(step, fingerprint))


def read_json(path, missing):
  """The JSON value in `path`.

  Args:
    path: the file.
    missing: the message when it does not exist.

  Raises:
    policy.RoundError: when the file is missing or is not JSON.
  """
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except FileNotFoundError:
    raise policy.RoundError(missing) from None
  except (OSError, ValueError) as e:
    raise policy.RoundError('cannot read %s: %s' % (path, e)) from None


def read_miou(result_path):
  """The mIoU in a deeplab-eval --eval_result_json file.

  Raises:
    policy.RoundError: when there is none.
  """
  result = read_json(result_path, 'deeplab-eval wrote no %s' % result_path)
  return records.miou_of(result, result_path)


def read_current_model(current_link):
  """The records.CurrentModel of exports/current, None before the first.

  Raises:
    policy.RoundError: when its metrics.json cannot be read.
  """
  if not os.path.islink(current_link):
    return None
  path = os.path.join(current_link, 'metrics.json')
  metrics = read_json(path, '%s is missing: point exports/current at a '
                      'complete export (see docs/cron.md)' % path)
  if not isinstance(metrics, dict):
    raise policy.RoundError('%s is not a JSON object' % path)
  return records.CurrentModel.from_metrics(metrics)


def now_iso():
  """The local time, as `date -Iseconds` prints it."""
  return datetime.datetime.now().astimezone().isoformat(timespec='seconds')


def write_metrics(path, metrics):
  """Writes an export's metrics.json (one line, in records' key order)."""
  atomic.write_bytes(path, (json.dumps(metrics) + '\n').encode('utf-8'))


def write_checkpoint_state(folder, checkpoint):
  """Writes folder/checkpoint, naming the copy of `checkpoint` in `folder`."""
  atomic.write_bytes(os.path.join(folder, 'checkpoint'),
                     records.checkpoint_state(checkpoint).encode('utf-8'))


def records_ready(records_dir):
  """Whether the TFRecords in use are complete (their dataset.json)."""
  return os.path.isfile(os.path.join(records_dir, 'dataset.json'))


# What `names_in` lists: regular files, folders, or any entry.
FILES, FOLDERS, ANY = 'files', 'folders', 'any'


def names_in(folder, pattern, kind):
  """The names in `folder` matching the glob `pattern`, of one kind.

  Links are not followed (exports/current is a link, not an export).

  Args:
    folder: the folder.
    pattern: a shell glob on the name ('cron-*.log'); like the shell's,
      a `*` or `?` does not match a leading dot.
    kind: FILES, FOLDERS or ANY.
  """
  names = []
  with os.scandir(folder) as entries:
    for entry in entries:
      if entry.name.startswith('.') and not pattern.startswith('.'):
        continue
      if not fnmatch.fnmatchcase(entry.name, pattern):
        continue
      if ((kind == FILES and not entry.is_file(follow_symlinks=False))
          or (kind == FOLDERS and not entry.is_dir(follow_symlinks=False))):
        continue
      names.append(entry.name)
  return names


def write_summary(path, line):
  """Writes the round's summary line to `path` (last_run.json)."""
  atomic.write_bytes(path, (line + '\n').encode('utf-8'))
