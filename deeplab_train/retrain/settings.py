"""The checks of cron_retrain.sh's settings, before a round starts.

The script takes each setting from its option or environment variable (its
usage text lists them with their defaults) and asks `problem()` about them
before it opens a log: a bad setting stops it with one line on stderr and
exit status 1, and nothing is written. `validates_during_training()` reads
TRAIN_EXTRA_FLAGS for the choice of the round's candidate (CANDIDATE).
"""
import re

from deeplab_train.retrain import data_folder
from deeplab_train.retrain import policy

# (variable, option) of the settings without a default.
REQUIRED = (('DATA_DIR', '--data_dir'), ('WORK_DIR', '--work_dir'))
# Settings that are counts (non-negative integers).
COUNTS = ('NUM_CLASSES', 'IGNORE_LABEL', 'NUM_SHARDS', 'STEPS_PER_RUN',
          'MAX_TOTAL_STEPS', 'MAX_RUN_SECONDS', 'KEEP_EXPORTS', 'KEEP_LOGS')
# Every setting checked here: the script passes these.
NAMES = tuple(name for name, _ in REQUIRED) + COUNTS + (
    'TRAIN_ONLY_ON_NEW_DATA', 'MIOU_MARGIN', 'CANDIDATE', 'TRAIN_EXTRA_FLAGS',
    'DATA_LAYOUT')
# deeplab-train's flag that turns on validation during training (and with
# it the best checkpoint in <train_logdir>/best/).
_VALIDATION_FLAG = re.compile('--?eval_interval_steps(=.*)?')


def validates_during_training(train_extra_flags):
  """Whether TRAIN_EXTRA_FLAGS turn on deeplab-train's validation.

  Args:
    train_extra_flags: TRAIN_EXTRA_FLAGS, split on whitespace as the
      script splits it.
  """
  return any(_VALIDATION_FLAG.fullmatch(word)
             for word in (train_extra_flags or '').split())


def problem(settings):
  """What is wrong with the settings, or None.

  Args:
    settings: {variable name: value as the script has it (a string)}.

  Returns:
    The message for the first bad setting (it names the variable, or the
    option as well), or None when all are fine.
  """
  for name, option in REQUIRED:
    if not settings.get(name):
      return '%s (or %s) is required (see -h)' % (option, name)
  for name in COUNTS:
    value = settings.get(name, '')
    if not re.fullmatch('[0-9]+', value):
      return "%s must be a non-negative integer, got '%s'" % (name, value)
  # The commands refuse 0 for each (deeplab-train --max_run_seconds=0 once
  # the round held its lock).
  for name in ('NUM_CLASSES', 'NUM_SHARDS', 'MAX_TOTAL_STEPS',
               'MAX_RUN_SECONDS'):
    if int(settings[name]) < 1:
      return '%s must be at least 1' % name
  layout = settings.get('DATA_LAYOUT')
  if layout not in data_folder.LAYOUTS:
    return "DATA_LAYOUT must be %s, got '%s'" % (
        ' or '.join(data_folder.LAYOUTS), layout or '')
  if settings.get('TRAIN_ONLY_ON_NEW_DATA') not in ('0', '1'):
    return 'TRAIN_ONLY_ON_NEW_DATA must be 0 or 1'
  margin = settings.get('MIOU_MARGIN', '')
  if not re.fullmatch(r'[0-9]*\.?[0-9]+', margin):
    return "--margin must be a non-negative number, got '%s'" % margin
  candidate = settings.get('CANDIDATE')
  if candidate not in policy.CANDIDATE_SETTINGS:
    *others, last = policy.CANDIDATE_SETTINGS
    return "--candidate (or CANDIDATE) must be %s or %s, got '%s'" % (
        ', '.join(others), last, candidate or '')
  if (candidate == policy.BEST
      and not validates_during_training(settings.get('TRAIN_EXTRA_FLAGS'))):
    return ('CANDIDATE=best needs validation during training, which keeps '
            'best/: add --eval_interval_steps=N to TRAIN_EXTRA_FLAGS')
  return None
