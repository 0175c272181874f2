"""The retraining round's policy: pure decisions, no files, no commands.

scripts/cron_retrain.sh runs one retraining round (docs/cron.md): it runs
deeplab-build-data, -train, -eval and -export and moves the files. Each
decision between those steps is a function here, so that the rules are
tested without training anything:

  plan_round         rebuild the TFRecords? how many steps to train? or
                     nothing to do at all
  training_outcome   how the round ends when deeplab-train failed, read
                     through the trainer's own exit-code table
  choose_candidate   the checkpoint to judge: best/'s or the latest one
  candidate_outcome  whether there is a new checkpoint to judge
  judge              promote, keep, or first re-measure the current model
  conclusion         how a round that judged a checkpoint ends
  to_prune           which old exports, logs or records go

records.py holds what a round writes down (eval results, an export's
metrics.json, the JSON summary), settings.py the checks of the script's
settings, data_folder.py the data folder's check and fingerprint, state.py
the files; deeplab_train/cli/retrain.py answers the script's questions with
them.
"""
import dataclasses
from typing import Optional

# The round's exit codes: its contract with cron (docs/cron.md).
# cron_retrain.sh repeats EXIT_FAILURE and EXIT_BUSY, which it needs before
# and without Python (a test checks that the two agree).
EXIT_SUCCESS = 0
EXIT_FAILURE = 1
EXIT_NOTHING_TO_DO = 10
# EX_TEMPFAIL (sysexits.h), like deeplab-train's own code for a locked logdir.
EXIT_BUSY = 75

# The round's statuses (the JSON summary's `status`).
PROMOTED = 'promoted'
KEPT = 'kept'
UNCHANGED = 'unchanged'
REBUILT = 'rebuilt'
NOTHING_TO_DO = 'nothing_to_do'
BUSY = 'busy'
FAILED = 'failed'

# The deeplab-train statuses told apart here: keys of the trainer's
# EXIT_CODES (deeplab_train/runtime/result.py). Any other is a failure.
TRAINER_OK = 'ok'
TRAINER_BAD_INPUT = 'bad_input'
TRAINER_NON_FINITE_LOSS = 'non_finite_loss'
TRAINER_LOCKED = 'locked'
TRAINER_STATUSES = (TRAINER_OK, TRAINER_BAD_INPUT, TRAINER_NON_FINITE_LOSS,
                    TRAINER_LOCKED)

# Which checkpoint a round judges (the CANDIDATE setting, Candidate.source):
# the one the trainer's validation keeps in <train_logdir>/best/, or the
# latest; AUTO takes best/'s when training validates and best/ holds one.
AUTO = 'auto'
BEST = 'best'
LATEST = 'latest'
CANDIDATE_SETTINGS = (AUTO, BEST, LATEST)

# What to do with a new checkpoint (Verdict.action).
PROMOTE = 'promote'
KEEP = 'keep'
REEVALUATE = 'reevaluate'


class RoundError(Exception):
  """A problem that ends the round as a failure; the message is for users."""


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How a round ends: exit code, status word and message of its summary."""
  exit_code: int
  status: str
  message: str


def failed(message):
  """The Outcome of a round that went wrong (the current model untouched)."""
  return Outcome(EXIT_FAILURE, FAILED, message)


@dataclasses.dataclass(frozen=True)
class State:
  """What earlier rounds stored (state/ in the work folder).

  Attributes:
    built: data fingerprint of the TFRecords in use, or None.
    trained: data fingerprint the last training run saw, or None.
    decided: decision_key() of the last checkpoint promoted or kept, or None.
  """
  built: Optional[str] = None
  trained: Optional[str] = None
  decided: Optional[str] = None


def decision_key(step, fingerprint):
  """How state/decided names a checkpoint judged on some data."""
  return '%d %s' % (step, fingerprint)


def already_decided(state, step, fingerprint):
  """True when checkpoint `step` was promoted or kept on this data."""
  return state.decided == decision_key(step, fingerprint)


@dataclasses.dataclass(frozen=True)
class Budget:
  """How much one round may train (the script's options).

  Attributes:
    steps_per_run: steps per round (STEPS_PER_RUN, --steps).
    max_total_steps: the global step training never goes past
      (MAX_TOTAL_STEPS).
    only_on_new_data: train only when the data changed since the last
      training run (TRAIN_ONLY_ON_NEW_DATA=1).
  """
  steps_per_run: int
  max_total_steps: int
  only_on_new_data: bool = False


@dataclasses.dataclass(frozen=True)
class Candidate:
  """The checkpoint a round judges, as choose_candidate() picks it.

  Attributes:
    source: BEST (the checkpoint in <train_logdir>/best/) or LATEST (the
      train logdir's latest checkpoint).
    step: its global step, None when there is no such checkpoint.
    reason: why this one, for the log and the summary.
  """
  source: str
  step: Optional[int]
  reason: str


def choose_candidate(setting, validating, latest_step, best_step):
  """Which checkpoint the round judges: best/'s or the latest.

  Args:
    setting: CANDIDATE, one of CANDIDATE_SETTINGS.
    validating: whether deeplab-train validates during training (keeps
      best/ up to date): TRAIN_EXTRA_FLAGS has --eval_interval_steps.
    latest_step: global step of the train logdir's latest checkpoint, None
      without one.
    best_step: global step of best/'s checkpoint, None without one.

  Returns:
    A Candidate. AUTO takes best/'s checkpoint only when training validates
    (a best/ left by earlier runs that validated is not kept up to date by
    runs that do not) and best/ holds one, else the latest; BEST and LATEST
    take that one, even when it does not exist (step None).

  Raises:
    ValueError: an unknown setting.
  """
  if setting == BEST:
    return Candidate(BEST, best_step, 'CANDIDATE=best')
  if setting == LATEST:
    return Candidate(LATEST, latest_step, 'CANDIDATE=latest')
  if setting != AUTO:
    raise ValueError('CANDIDATE is one of %s, not %r'
                     % (', '.join(CANDIDATE_SETTINGS), setting))
  if not validating:
    return Candidate(LATEST, latest_step, 'training does not validate (no '
                     '--eval_interval_steps in TRAIN_EXTRA_FLAGS)%s' % (
                         '' if best_step is None
                         else ', so best/ is not kept up to date'))
  if best_step is None:
    return Candidate(LATEST, latest_step, 'training validates but best/ '
                     'holds no checkpoint yet')
  return Candidate(BEST, best_step, 'training validates '
                   '(--eval_interval_steps) and best/ holds its best '
                   'checkpoint')


def describe_checkpoint(source, step):
  """How messages name a candidate: 'checkpoint step 5', with ' of best/'
  for best/'s."""
  return 'checkpoint step %d%s' % (step, ' of best/' if source == BEST
                                   else '')


def _none_yet(source):
  """How messages say that the candidate does not exist."""
  return 'no checkpoint in best/ yet' if source == BEST else 'no checkpoint yet'


@dataclasses.dataclass(frozen=True)
class Plan:
  """The work of a round before evaluation."""
  build: bool
  train_steps: int


def needs_build(fingerprint, state, records_ready):
  """True when the TFRecords must be (re)built from the data folder.

  Args:
    fingerprint: the data folder's fingerprint now.
    state: State of earlier rounds.
    records_ready: whether the records in use exist (their dataset.json).
  """
  return state.built != fingerprint or not records_ready


def steps_to_train(step, fingerprint, state, budget):
  """Steps to train from global step `step`: the budget, up to the maximum."""
  if budget.only_on_new_data and state.trained == fingerprint:
    return 0
  return max(0, min(budget.steps_per_run, budget.max_total_steps - step))


def plan_round(fingerprint, records_ready, checkpoint_step, state, budget,
               candidate=None):
  """Where a round starts.

  Args:
    fingerprint: the data folder's fingerprint now.
    records_ready: whether the TFRecords in use exist.
    checkpoint_step: global step of the latest checkpoint, None without one
      (training goes on from it).
    state: State of earlier rounds.
    budget: Budget of the round.
    candidate: the Candidate the round would judge without training
      (choose_candidate()); None: the latest checkpoint.

  Returns:
    A Plan, or the Outcome `nothing_to_do` when there is nothing to build,
    nothing to train and no checkpoint left to judge on this data.
  """
  if candidate is None:
    candidate = Candidate(LATEST, checkpoint_step, 'the latest')
  plan = Plan(build=needs_build(fingerprint, state, records_ready),
              train_steps=steps_to_train(checkpoint_step or 0, fingerprint,
                                         state, budget))
  if plan.build or plan.train_steps:
    return plan
  if candidate.step is None:
    return Outcome(EXIT_NOTHING_TO_DO, NOTHING_TO_DO,
                   'data unchanged, no steps to train and %s'
                   % _none_yet(candidate.source))
  if already_decided(state, candidate.step, fingerprint):
    return Outcome(EXIT_NOTHING_TO_DO, NOTHING_TO_DO,
                   'data unchanged, no steps to train, %s already evaluated'
                   % describe_checkpoint(candidate.source, candidate.step))
  return plan   # only the candidate is left to judge


def trainer_status(exit_code, trainer_exit_codes):
  """deeplab-train's status for its exit code, None for an unknown code.

  Args:
    exit_code: deeplab-train's exit status.
    trainer_exit_codes: the trainer's table, status -> exit code
      (deeplab_train.runtime.result.EXIT_CODES).
  """
  for status, code in trainer_exit_codes.items():
    if code == exit_code:
      return status
  return None


def training_outcome(exit_code, trainer_exit_codes, train_logdir,
                     trainer_message=None):
  """How the round ends after deeplab-train exited with `exit_code`.

  Args:
    exit_code: deeplab-train's exit status.
    trainer_exit_codes: the trainer's table, status -> exit code.
    train_logdir: the trainer's logdir, for messages.
    trainer_message: the message of deeplab-train's JSON result line (why
      it failed, e.g. a full disk), if it printed one.

  Returns:
    None when training succeeded (the round goes on), else the Outcome:
    busy when another run holds the logdir, else failed.
  """
  status = trainer_status(exit_code, trainer_exit_codes)
  if status == TRAINER_OK:
    return None
  if status == TRAINER_LOCKED:
    return Outcome(EXIT_BUSY, BUSY, '%s is locked by another deeplab-train '
                   'run' % train_logdir)
  if status == TRAINER_NON_FINITE_LOSS:
    return failed('training stopped on a NaN loss (no NaN checkpoint was '
                  'saved); lower BASE_LEARNING_RATE?')
  said = (': %s' % trainer_message) if trainer_message else ' (see the log)'
  if status == TRAINER_BAD_INPUT:
    return failed('deeplab-train rejected its input (exit %d)%s'
                  % (exit_code, said))
  return failed('deeplab-train failed with exit status %d%s'
                % (exit_code, said))


def candidate_outcome(checkpoint_step, fingerprint, state, trained,
                      train_logdir, source=LATEST):
  """Whether the candidate is still to be judged, after training.

  Args:
    checkpoint_step: global step of the candidate (Candidate.step), None
      without one.
    fingerprint: the data folder's fingerprint.
    state: State of earlier rounds.
    trained: whether this round ran deeplab-train.
    train_logdir: the trainer's logdir, for messages.
    source: the candidate's Candidate.source.

  Returns:
    None when the checkpoint is to be evaluated and judged, else the
    Outcome: failed (training left no checkpoint), unchanged (training
    left no best/ checkpoint with CANDIDATE=best, or this checkpoint was
    already judged on this data) or rebuilt (the records were rebuilt and
    there is no checkpoint).
  """
  if checkpoint_step is None:
    if trained and source == BEST:
      return Outcome(EXIT_SUCCESS, UNCHANGED, 'CANDIDATE=best and training '
                     'left no checkpoint in best/ yet (it is written by the '
                     'first validation); nothing to promote')
    if trained:
      return failed('deeplab-train wrote no checkpoint in %s' % train_logdir)
    return Outcome(EXIT_SUCCESS, REBUILT, 'TFRecords rebuilt; no steps to '
                   'train and %s' % _none_yet(source))
  if already_decided(state, checkpoint_step, fingerprint):
    return Outcome(EXIT_SUCCESS, UNCHANGED, 'no new checkpoint (still %s); '
                   'nothing to promote'
                   % describe_checkpoint(source, checkpoint_step))
  return None


@dataclasses.dataclass(frozen=True)
class Verdict:
  """judge()'s answer.

  Attributes:
    action: PROMOTE, KEEP, or REEVALUATE (measure the current model on the
      eval split first, then judge again with its new mIoU).
    message: why, for the log and the summary.
    current_miou: the current model's mIoU the rule compared with, if it did.
  """
  action: str
  message: str
  current_miou: Optional[float] = None


def format_miou(miou):
  """An mIoU for messages (4 decimals)."""
  return '%.4f' % miou


def no_worse(new_miou, current_miou, margin):
  """The promotion rule: the mIoU did not drop by more than `margin`."""
  return new_miou >= current_miou - margin


def judge(new_miou, step, fingerprint, current, margin,
          remeasured_miou=None):
  """Promote checkpoint `step`, keep the current model, or measure it first.

  Args:
    new_miou: the new checkpoint's mIoU on the eval split.
    step: the new checkpoint's global step.
    fingerprint: the data fingerprint the new mIoU was measured on.
    current: records.CurrentModel of exports/current, None when nothing
      was promoted yet.
    margin: the mIoU drop allowed (MIOU_MARGIN, --margin).
    remeasured_miou: the current model's mIoU measured in this round, when
      an earlier verdict asked for it.

  Returns:
    A Verdict. The first model is always promoted; the current model's
    mIoU is taken from its metrics.json only when it was measured on the
    same data, else it is measured again so that both are comparable.
  """
  new = 'mIoU %s (step %d)' % (format_miou(new_miou), step)
  if current is None:
    return Verdict(PROMOTE, 'first model, %s' % new)
  if current.global_step == step:
    return Verdict(KEEP, 'the current model already is checkpoint step %d'
                   % step)
  current_miou = remeasured_miou
  if current_miou is None:
    if current.data_fingerprint != fingerprint:
      return Verdict(REEVALUATE, 'the data changed since the current model '
                     'was measured: re-evaluating it')
    if current.miou is None:
      return Verdict(REEVALUATE, "the current model's metrics.json has no "
                     'mIoU: re-evaluating it')
    current_miou = current.miou
  old = '%s (step %s)' % (format_miou(current_miou),
                          '' if current.global_step is None
                          else current.global_step)
  if no_worse(new_miou, current_miou, margin):
    return Verdict(PROMOTE, '%s vs %s' % (new, old), current_miou)
  return Verdict(KEEP, "%s is more than %g below the current model's %s: "
                 'current model kept' % (new, margin, old), current_miou)


def conclusion(verdict_action, message, export_name=None):
  """The Outcome of a round that promoted or kept its new checkpoint.

  Args:
    verdict_action: PROMOTE or KEEP (what was done).
    message: the Verdict's message.
    export_name: the export `current` now points to, after a promotion.

  Raises:
    ValueError: for another action.
  """
  if verdict_action == PROMOTE:
    return Outcome(EXIT_SUCCESS, PROMOTED, '%s: exports/current -> %s'
                   % (message, export_name))
  if verdict_action == KEEP:
    return Outcome(EXIT_SUCCESS, KEPT, message)
  raise ValueError('a round concludes by %r or %r, not %r'
                   % (PROMOTE, KEEP, verdict_action))


def to_prune(names, keep, protected=None):
  """The names to remove so that the newest `keep` are left.

  Args:
    names: export folder or log file names; they sort by age because they
      start with a time stamp.
    keep: how many of the newest to keep.
    protected: a name never removed (the export `current` points to, the
      running round's log), or None.

  Returns:
    The names to remove, newest first.
  """
  newest_first = sorted(names, reverse=True)
  return [n for n in newest_first[keep:] if n != protected]
