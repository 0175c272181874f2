"""Validation during training: score the latest weights every N steps,
keep the best checkpoint, stop early.

`ValidationHook` runs in the local (or chief) training process. Every
`RunOptions.eval_interval_steps` steps it has the run's CheckpointHook save
the step, then scores that checkpoint on `RunOptions.eval_split` as
deeplab-eval does by default (eval preprocessing, each image padded to its
fitting size, single scale, no flips) with one Predictor (a separate
inference graph) reused for every evaluation. The last step is scored too
when the run ends off that rhythm; no evaluation starts once a signal or
the time budget asked the run to stop (they ask for a quick stop). Each
evaluation:

  - logs the mIoU and writes `eval/miou` and `eval/iou/<class>` summaries
    to the train logdir;
  - keeps the best checkpoint: when the metric (`RunOptions.best_metric`:
    'miou' or 'iou/<class name or id>') beats the best so far, the
    checkpoint's index and data files, deeplab_config.json, a `checkpoint`
    state file naming it (a relative path) and best.json (step, metric,
    value and the evaluation's record) are copied to a temp folder renamed
    to `<logdir>/best/`, which deeplab-eval, -vis and -export take as a
    checkpoint directory;
  - appends {"step", "miou", "per_class_iou", "seconds" (of the
    evaluation)} to `<logdir>/metrics_history.jsonl`, rewritten under a
    temp name then renamed;
  - counts the evaluations in a row that did not beat the early-stopping
    best by more than `RunOptions.early_stopping_min_delta`, and stops the
    run (stop reason 'early_stopping', final checkpoint written) once they
    reach `RunOptions.early_stopping_patience` (0: never); evaluations of
    steps before `RunOptions.early_stopping_start_step` are not counted
    nor compared with (with batch norm trained from its initial moving
    averages, decay 0.9997, the first few thousand steps score near
    nothing whatever the weights: see benchmarks/early_stopping.py).

best/ is written before the history, and best.json holds the evaluation's
record, so a run killed between the two gets the record back on resume.
A restarted run reads both back: the best value from best.json (when it is
of the same metric), the early-stopping count from the history. A run
whose history already shows `patience` evaluations without improvement
does not train again (see `ValidationState.patience_used_up`).
"""
import dataclasses
import glob
import json
import math
import os
import shutil
from typing import Any, List, Optional

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train import restore as restore_lib
from deeplab_train.config import serialize
from deeplab_train.evaluation import confusion as confusion_lib
from deeplab_train.evaluation import eval_loop
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.model import registry
from deeplab_train.runtime import hooks as hooks_lib

HISTORY_FILENAME = 'metrics_history.jsonl'
BEST_DIRNAME = 'best'
BEST_JSON = 'best.json'
# The run's stop reason when the metric stopped improving.
EARLY_STOPPING = 'early_stopping'
MIOU = 'miou'
IOU_PREFIX = 'iou/'


@dataclasses.dataclass(frozen=True)
class EvalData:
  """Where the split scored during training is read from.

  Attributes:
    dataset_dir: folder of the TFRecords.
    dataset_info: datasets.DatasetInfo (classes, ignore label, names).
  """
  dataset_dir: str
  dataset_info: Any


def metric_key(best_metric, dataset_info):
  """The history key `best_metric` reads: None for the mIoU, else the
  class's name in `per_class_iou`.

  Args:
    best_metric: 'miou', or 'iou/' + a class name or id.
    dataset_info: DatasetInfo of the dataset (class names and count).

  Raises:
    ConfigError: an unknown class.
  """
  if best_metric == MIOU:
    return None
  wanted = best_metric[len(IOU_PREFIX):]
  names = confusion_lib.class_labels(dataset_info.num_classes,
                                     dataset_info.class_names)
  if wanted in names:
    return wanted
  if wanted.isdigit() and int(wanted) < len(names):
    return names[int(wanted)]
  raise config.ConfigError(
      '{RunOptions.best_metric}=%s names no class of dataset %s: use miou, '
      'or iou/ and one of %s (or a class id below %d)', best_metric,
      dataset_info.name, ', '.join(names), len(names))


def metric_value(record, key):
  """The metric of a history record (None when undefined)."""
  value = record.get(MIOU) if key is None else (
      record.get('per_class_iou') or {}).get(key)
  if value is None or not math.isfinite(value):
    return None
  return float(value)


def improves(value, best, min_delta=0.0):
  """Whether `value` beats `best` (None: no value yet) by more than
  min_delta; an undefined value never does."""
  return value is not None and (best is None or value > best + min_delta)


def history_path(logdir):
  return os.path.join(logdir, HISTORY_FILENAME)


def best_dir(logdir):
  return os.path.join(logdir, BEST_DIRNAME)


def read_history(logdir):
  """The records of `<logdir>/metrics_history.jsonl`, oldest first ([]
  without the file); lines that are not records are skipped, loudly."""
  path = history_path(logdir)
  if not os.path.isfile(path):
    return []
  records = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        _check_record(record)
      except (ValueError, KeyError, TypeError):
        logging.warning('%s:%d is not a metrics record; ignored', path,
                        number)
        continue
      records.append(record)
  return records


def _is_int(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value, or_none=True):
  return ((value is None and or_none) or _is_int(value)
          or isinstance(value, float))


def _check_record(record):
  """Raises ValueError unless `record` is an evaluation's record: an
  integer step, numbers (or null) for the mIoU, each class's IoU and the
  seconds it took."""
  ious = record.get('per_class_iou', {}) if isinstance(record, dict) else None
  if not (isinstance(record, dict) and _is_int(record.get('step'))
          and _is_number(record.get(MIOU))
          and _is_number(record.get('seconds'))
          and isinstance(ious, dict)
          and all(_is_number(v) for v in ious.values())):
    raise ValueError('not a metrics record')


def write_history(logdir, records):
  """Rewrites the history file under a temp name, then renames it."""
  text = ''.join(json.dumps(r, sort_keys=True) + '\n' for r in records)
  atomic.write_bytes(history_path(logdir), text.encode('utf-8'))


def read_best(logdir):
  """best/best.json as a dict, or None (absent, or not what save_best
  writes: the next evaluation replaces best/)."""
  path = os.path.join(best_dir(logdir), BEST_JSON)
  why = 'cannot read %s (%s): the next evaluation replaces the best checkpoint'
  try:
    best = serialize.read_json_file(path, why)
  except config.ConfigError as e:
    logging.warning('%s', e)
    return None
  if best is None:
    return None
  try:
    if not (isinstance(best, dict) and _is_int(best.get('step'))
            and isinstance(best.get('metric'), str)
            and _is_number(best.get('value'), or_none=False)
            and math.isfinite(best['value'])):
      raise ValueError('no step, metric and finite value')
    if best.get('record') is not None:
      _check_record(best['record'])
  except ValueError as e:
    logging.warning(why, path, '%s: %s' % (e, json.dumps(best)[:200]))
    return None
  return best


def _checkpoint_files(prefix):
  """The index and data files of a checkpoint prefix."""
  pattern = glob.escape(prefix)
  return glob.glob(pattern + '.index') + glob.glob(pattern + '.data-*')


def save_best(logdir, checkpoint, best):
  """Copies `checkpoint` (a prefix in logdir) with the run config to
  `<logdir>/best/`: into a temp folder, renamed into place.

  Args:
    logdir: the train logdir.
    checkpoint: the checkpoint prefix.
    best: the best.json payload.

  Returns:
    The best/ folder (where a link best/ points).
  """
  # best/ as a link to another disk: the folder it names is replaced (the
  # link itself was, by a folder in the logdir, the old model left there).
  target = os.path.realpath(best_dir(logdir))
  with atomic.writing_dir(target) as tmp:
    os.makedirs(tmp)
    for path in _checkpoint_files(checkpoint):
      shutil.copy2(path, tmp)
    run_config = os.path.join(logdir, config.RUN_CONFIG_FILENAME)
    if os.path.isfile(run_config):
      shutil.copy2(run_config, tmp)
    # The state file names it by a relative path: best/ may be moved.
    name = os.path.basename(checkpoint)
    tf.train.update_checkpoint_state(tmp, name,
                                     all_model_checkpoint_paths=[name])
    with open(os.path.join(tmp, BEST_JSON), 'wb') as f:
      f.write(atomic.json_bytes(best))
    # On disk before the swap, as every other write (a power cut after it
    # must not leave a best/ of empty files).
    atomic.sync_files(tmp)
    # deeplab-eval, -vis or -export reading best/ holds its checkpoint by
    # hard links in a pin folder inside it, which the swap would delete.
    restore_lib.carry_pins(target, tmp)
  return target


def recover_best_dir(logdir):
  """Finishes or undoes a best/ swap a killed run left (see
  atomic.finish_replace_dir), and removes the history's temp files (call
  with the logdir lock held)."""
  target = best_dir(logdir)
  restored = atomic.finish_replace_dir(target)
  if restored is not None:
    logging.warning('restored %s from %s (a run was killed while replacing '
                    'it)', target, restored)
  atomic.remove_leftover_temps(history_path(logdir))


@dataclasses.dataclass
class ValidationState:
  """The history, the best checkpoint and the early-stopping count.

  Attributes:
    records: history records, oldest first.
    best: best.json's payload (None: no best checkpoint yet).
    stopping_best: the best metric value by early stopping's rule (an
      improvement of more than min_delta), from the history.
    without_improvement: evaluations in a row since that best.
  """
  records: List[dict]
  best: Optional[dict]
  stopping_best: Optional[float] = None
  without_improvement: int = 0

  @property
  def best_value(self):
    return None if self.best is None else self.best.get('value')

  @property
  def evaluated_steps(self):
    return {int(record['step']) for record in self.records}

  def add(self, record, key, min_delta, start_step=0):
    """Counts a new evaluation (the history and early-stopping count); one
    of a step before `start_step` goes into the history only."""
    self.records.append(record)
    if int(record['step']) < start_step:
      return
    value = metric_value(record, key)
    if improves(value, self.stopping_best, min_delta):
      self.stopping_best = value
      self.without_improvement = 0
    else:
      self.without_improvement += 1

  def patience_used_up(self, patience):
    return bool(patience) and self.without_improvement >= patience


def load_state(logdir, best_metric, key, min_delta, start_step=0,
               checkpoint_step=None, split=None, dataset_info=None):
  """The ValidationState of a (resumed) logdir.

  A best.json of another metric or split, or of a step past the logdir's
  latest checkpoint, is not compared with (the next evaluation replaces
  best/); its record is put back into a history that lacks it (a run
  killed between writing best/ and the history). Evaluations of steps past
  the latest checkpoint belong to a run whose checkpoints are gone: the
  history file is moved aside and rewritten without them. Evaluations of
  another split stay in the history but count for nothing.

  Args:
    logdir: the train logdir (the lock held).
    best_metric: RunOptions.best_metric.
    key: metric_key of it.
    min_delta: RunOptions.early_stopping_min_delta.
    start_step: RunOptions.early_stopping_start_step.
    checkpoint_step: the step of the logdir's latest checkpoint (0 without
      one), or None not to check.
    split: RunOptions.eval_split, or None not to check.
    dataset_info: the DatasetInfo scored, to tell 'iou/0' and 'iou/<its
      name>' for one metric; None to compare the names as given.
  """
  recover_best_dir(logdir)
  records = _records_up_to(logdir, read_history(logdir), checkpoint_step)
  best = read_best(logdir)
  if best is not None:
    record = best.get('record')
    steps = {int(r['step']) for r in records}
    past = checkpoint_step is not None and best['step'] > checkpoint_step
    if record and not past and int(record['step']) not in steps:
      records = sorted(records + [record], key=lambda r: int(r['step']))
      write_history(logdir, records)
      logging.warning('%s lacked the evaluation of step %s; restored from '
                      '%s', history_path(logdir), record['step'], BEST_JSON)
    other = None
    if past:
      other = ('step %d, past the latest checkpoint of %s (step %d)'
               % (best['step'], logdir, checkpoint_step))
    elif not _same_metric(best['metric'], best_metric, key, dataset_info):
      other = 'the best by %s, not %s' % (best['metric'], best_metric)
    elif split is not None and (record or {}).get('split', split) != split:
      other = 'the best on split %r, not %r' % (record['split'], split)
    if other:
      logging.warning('best/ holds %s: this run\'s next evaluation replaces '
                      'it', other)
      best = None
  state = ValidationState([], best)
  others = 0
  for record in records:
    if split is not None and record.get('split', split) != split:
      state.records.append(record)   # kept, not compared with
      others += 1
    else:
      state.add(record, key, min_delta, start_step)
  if others:
    logging.warning('%s: %d evaluation(s) on another split than %r count '
                    'neither for the best nor for early stopping',
                    history_path(logdir), others, split)
  return state


def _same_metric(stored, best_metric, key, dataset_info):
  """Whether best.json's metric `stored` is `best_metric` (key: its
  metric_key): 'iou/0' and 'iou/background' are one where class 0 is named
  so."""
  if stored == best_metric:
    return True
  if dataset_info is None or not stored.startswith(IOU_PREFIX):
    return False
  try:
    return metric_key(stored, dataset_info) == key
  except config.ConfigError:
    return False


def _records_up_to(logdir, records, checkpoint_step):
  """`records` without those past `checkpoint_step`; when there are such,
  the history file is moved aside (nothing is lost) and rewritten."""
  if checkpoint_step is None:
    return records
  kept = [r for r in records if int(r['step']) <= checkpoint_step]
  if len(kept) == len(records):
    return records
  path = history_path(logdir)
  aside = base = '%s.until-step-%d' % (path, max(int(r['step'])
                                                for r in records))
  number = 1
  while os.path.exists(aside):
    number += 1
    aside = '%s.%d' % (base, number)
  os.replace(path, aside)
  write_history(logdir, kept)
  logging.warning(
      '%s held evaluations of steps past the latest checkpoint of %s (step '
      '%d), which a run whose checkpoints are gone left: moved to %s; the '
      'history goes on from step %d', path, logdir, checkpoint_step, aside,
      checkpoint_step)
  return kept


class Evaluator:
  """Scores checkpoints on a split, as deeplab-eval's defaults do.

  The Predictor (an inference graph and its session) is built at the first
  call and reused; `close()` releases it.

  Args:
    eval_data: EvalData.
    split: the split to score.
    model_options: ModelOptions of the network (its crop is not used).
    preprocess_options: the training PreprocessOptions (its resize values
      are used), or None.
    session_config: optional tf.ConfigProto of the inference session.
  """

  def __init__(self, eval_data, split, model_options, preprocess_options=None,
               session_config=None):
    self._data = eval_data
    resize = {name: getattr(preprocess_options, name)
              for name in config.RESIZE_FIELDS} if preprocess_options else {}
    self._preprocess = config.PreprocessOptions(crop_size=None, **resize)
    self._model_options = model_options
    self._inference = config.InferenceOptions()
    self._eval_options = config.EvalOptions(split=split)
    self._session_config = session_config
    self._predictor = None

  def _samples(self):
    return eval_loop.iterate_split(
        self._data.dataset_dir, self._eval_options.split,
        self._data.dataset_info, self._preprocess,
        registry.mean_pixel(self._model_options.model_variant))

  def __call__(self, checkpoint, step):
    """The history record of `checkpoint` (of global step `step`)."""
    if self._predictor is None:
      self._predictor = predictor_lib.Predictor(
          self._model_options, self._inference, self._session_config)
    result, _ = eval_loop.evaluate_checkpoint(
        self._predictor, checkpoint, self._samples, self._data.dataset_info,
        self._eval_options, self._inference)
    return {'step': int(step), 'miou': result['miou'],
            'per_class_iou': result['per_class_iou'],
            'seconds': result['seconds']}

  def close(self):
    if self._predictor is not None:
      self._predictor.close()
      self._predictor = None


class ValidationNotSavedError(RuntimeError):
  """An evaluation's best/ or history could not be written (e.g. a full
  disk); the checkpoint is saved, and the next run scores it again."""

  def __init__(self, path, reason, step):
    super().__init__(
        'cannot keep the evaluation of step %d: cannot write %s: %s; the '
        'checkpoint of step %d is saved and the next run scores it again'
        % (step, path, hooks_lib.write_failure(reason, os.path.dirname(path)),
           step))
    self.path = path
    self.step = step


class Validator:
  """Scores checkpoints, keeping the history, best/ and eval/ summaries
  (see the module docstring).

  Args:
    run_options: RunOptions (eval_interval_steps set).
    evaluate: fn(checkpoint prefix, step) -> history record (an Evaluator).
    state: the ValidationState read back from the logdir (load_state).
    key: metric_key of run_options.best_metric.
    events: the run's hooks.EventsFile (eval/ summaries go there).
  """

  def __init__(self, run_options, evaluate, state, key, events):
    self._options = run_options
    self._logdir = run_options.train_logdir
    self._evaluate = evaluate
    self.state = state
    self._key = key
    self._events = events

  def score(self, checkpoint, step):
    """Evaluates `checkpoint` (of global step `step`) and keeps the result.

    Raises:
      ValidationNotSavedError: best/ or the history could not be written.
    """
    record = dict(self._evaluate(checkpoint, step),
                  split=self._options.eval_split)
    value = metric_value(record, self._key)
    if improves(value, self.state.best_value):
      best = {'step': step, 'metric': self._options.best_metric,
              'value': value, 'checkpoint': os.path.basename(checkpoint),
              'record': record}
      self._write(best_dir(self._logdir), step, save_best, self._logdir,
                  checkpoint, best)
      self.state.best = best
    self.state.add(record, self._key, self._options.early_stopping_min_delta,
                   self._options.early_stopping_start_step)
    self._write(history_path(self._logdir), step, write_history, self._logdir,
                self.state.records)
    self._write_summary(record, step)
    best = self.state.best
    logging.info('Evaluation of step %d on split %r: mIoU %s, %s %s (%s), '
                 '%.1f s', step, self._options.eval_split,
                 _show(record['miou']), self._options.best_metric,
                 _show(value), 'no best yet' if best is None else
                 'best %s at step %d' % (_show(best['value']), best['step']),
                 record['seconds'])
    if value is None:
      logging.warning('%s is undefined at step %d: the class is neither in '
                      'the labels of split %r nor in the predictions; no '
                      'checkpoint is kept as the best by it',
                      self._options.best_metric, step,
                      self._options.eval_split)

  def _write(self, path, step, write, *args):
    try:
      write(*args)
    except OSError as e:
      # Ends the run; the next one reads back a history without this step.
      raise ValidationNotSavedError(
          path, e.strerror or hooks_lib.write_error_reason(e), step) from e

  def close(self):
    """Releases the evaluator's session (also after an error)."""
    close = getattr(self._evaluate, 'close', None)
    if close is not None:
      close()

  def summary(self):
    """E.g. 'best miou 0.4123 at step 300 in LOGDIR/best', for the result."""
    best = self.state.best
    if best is None:
      return 'no best checkpoint yet'
    return 'best %s %s at step %s in %s' % (
        best['metric'], _show(best['value']), best['step'],
        best_dir(self._logdir))

  def _write_summary(self, record, step):
    values = [tf.Summary.Value(tag='eval/miou',
                               simple_value=_finite(record['miou']))]
    for name, iou in sorted(record['per_class_iou'].items()):
      if iou is not None:
        values.append(tf.Summary.Value(tag='eval/iou/%s' % name,
                                       simple_value=iou))
    writer = self._events.writer
    writer.add_summary(tf.Summary(value=values), step)
    writer.flush()


class ValidationHook(tf.train.SessionRunHook):
  """Has the run's CheckpointHook save every eval_interval_steps steps and
  the last one, and its Validator score them; stops early. Put it after the
  CheckpointHook: it evaluates what that hook saved.

  Args:
    run_options: RunOptions (eval_interval_steps set).
    validator: the run's Validator.
    save: fn(session, step) -> the checkpoint prefix of that step, written
      if needed (CheckpointHook.save_now).
    global_step / step_after: the global step read, and after the update.
    last_step: the run's last step (reaching it is not an early stop).
    stop_state: the run's hooks.StopState.
    time_budget: the run's hooks.TimeBudgetHook, or None. An evaluation
      that the last one's duration says would end past it is not started:
      the run stops there (the step is scored when the next run starts);
      one that ended past it stops the run before another step.
  """

  def __init__(self, run_options, validator, save, global_step, step_after,
               last_step, stop_state, time_budget=None):
    self._options = run_options
    self.validator = validator
    self._save = save
    self._global_step = global_step
    self._step_after = step_after
    self._last_step = last_step
    self._stop = stop_state
    self._budget = time_budget

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._step_after)

  def after_run(self, run_context, run_values):
    step = int(run_values.results)
    if step % self._options.eval_interval_steps or self._stopping_quickly():
      return
    if self._budget is not None:
      records = self.validator.state.records
      needs = float(records[-1].get('seconds') or 0) if records else 0.
      if needs >= self._budget.seconds_left():
        self._budget.stop(run_context, 'max_run_seconds leaves less than an '
                          'evaluation (%.1f s) for step %d, which the next '
                          'run scores' % (needs, step))
        return
    self._validate(run_context.session, step)
    if self._stopping_quickly():
      # A signal came during the evaluation: no step after it.
      run_context.request_stop()
      return
    if self._budget is not None and self._budget.seconds_left() <= 0:
      self._budget.stop(run_context, 'max_run_seconds reached during the '
                        'evaluation of step %d' % step)
      return
    state = self.validator.state
    if (state.patience_used_up(self._options.early_stopping_patience)
        and step < self._last_step):
      logging.info(
          'Early stopping at step %d: %d evaluation(s) in a row without an '
          'improvement of %s by more than %g', step,
          state.without_improvement, self._options.best_metric,
          self._options.early_stopping_min_delta)
      self._stop.request(EARLY_STOPPING)
      run_context.request_stop()

  def end(self, session):
    step = int(session.run(self._global_step))
    if (step not in self.validator.state.evaluated_steps
        and not self._stopping_quickly()):
      self._validate(session, step)

  def _stopping_quickly(self):
    """A signal or the time budget asked the run to stop: no evaluation
    delays it (the final checkpoint is still written)."""
    reason = self._stop.reason or ''
    return (reason.startswith(hooks_lib.SIGNAL_PREFIX)
            or reason == hooks_lib.TIME_BUDGET)

  def _validate(self, session, step):
    self.validator.score(self._save(session, step), step)


def _finite(value):
  return float('nan') if value is None else float(value)


def _show(value):
  return '-' if value is None else '%.4f' % value
