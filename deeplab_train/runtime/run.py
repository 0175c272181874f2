"""A training run: lock, resume or initialise, train, stop, report.

`train` is what `deeplab-train` calls. It never raises for the outcomes a
cron job must tell apart; it returns a `RunResult` (result.py) whose status
maps to the exit code. Order of precedence for the starting weights: a
checkpoint in train_logdir (resume), else the initial checkpoint
(TrainOptions.tf_initial_checkpoint), else random initialisation.

A `TrainingRun` has a `Role`. The local run and a cluster's chief decide
the starting weights, write the checkpoints, summaries and
deeplab_config.json and hold the logdir lock; another worker locks only its
own task (`.deeplab-train.worker-<i>.lock`), waits for the chief (its
JoinHook), and reports no checkpoint.

With `RunOptions.eval_interval_steps` the local run also scores its
weights on a split every N steps, keeps the best checkpoint in
train_logdir/best and may stop early (validation.py); a run whose
metrics history already used up the early-stopping patience does not
train again. Not on a cluster yet.
"""
import dataclasses
import enum
import functools
import os
import re
import time
from typing import Any, List, Optional

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train import restore
from deeplab_train.config import errors
from deeplab_train.data import pipeline
from deeplab_train.runtime import checkpoint_state
from deeplab_train.runtime import cluster as cluster_lib
from deeplab_train.runtime import cluster_session
from deeplab_train.runtime import hooks as hooks_lib
from deeplab_train.runtime import lock as lock_lib
from deeplab_train.runtime import session_config as session_lib
from deeplab_train.runtime import validation as validation_lib
from deeplab_train.runtime.result import RunResult
from deeplab_train.train import checkpoint_init
from deeplab_train.train import graph as graph_lib

# Steps between two Chrome traces in RunOptions.profile_logdir; read at
# run time, so a profiling script may set it on this module.
PROFILE_STEPS = config.PROFILE_STEPS


def checkpoint_step(prefix):
  """The global step stored in a checkpoint (0 when it has none)."""
  reader = tf.train.NewCheckpointReader(prefix)
  if reader.has_tensor('global_step'):
    return int(reader.get_tensor('global_step'))
  return 0


def default_session_config(train_options=None):
  """Soft placement (ops without a GPU kernel go to the CPU), threads on
  every core, and the XLA / mixed-precision settings of `train_options`."""
  if train_options is None:
    return session_lib.make_session_config()
  return session_lib.from_train_options(train_options)


class Role(enum.Enum):
  """What this process is in its run."""
  LOCAL = 'local'    # a single-machine run
  CHIEF = 'chief'    # worker 0 of a cluster
  WORKER = 'worker'  # another worker of a cluster

  @classmethod
  def of(cls, cluster):
    if cluster is None:
      return cls.LOCAL
    return cls.CHIEF if cluster.is_chief else cls.WORKER

  @property
  def decides_weights(self):
    """Restores, initialises, checkpoints and saves the run config: the
    local run and the chief; a worker trains what the chief prepared."""
    return self is not Role.WORKER


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """What a training run is made of (see `train` for the fields)."""
  model_options: Any
  train_options: Any
  run_options: Any
  ignore_label: int
  input_fn: Any
  preprocess_options: Any = None
  dataset: Any = None
  model_fn: Any = None
  last_layer_scopes: Any = None
  session_config: Any = None
  device_pattern: Optional[str] = None
  eval_data: Any = None
  train_split: Optional[str] = None


@dataclasses.dataclass
class _Hooks:
  """The session hooks of a run, with the ones the result is read from."""
  all: List[Any]
  progress: hooks_lib.ProgressHook
  checkpoints: Optional[hooks_lib.CheckpointHook]  # None for a worker
  join: Optional[Any]  # a worker's cluster.JoinHook, else None
  validation: Optional[validation_lib.ValidationHook] = None
  events: Optional[hooks_lib.EventsFile] = None  # None for a worker


def train(model_options, train_options, run_options, *, ignore_label,
          input_fn, preprocess_options=None, dataset=None, model_fn=None,
          last_layer_scopes=None, session_config=None, device_pattern=None,
          handle_signals=True, master='', start_time=None, cluster=None,
          started=None, eval_data=None, train_split=None):
  """Runs (or resumes) training in `run_options.train_logdir`.

  Args:
    model_options: validated ModelOptions (crop_size = training crop).
    train_options: validated TrainOptions.
    run_options: validated RunOptions.
    ignore_label: the dataset's ignore label.
    input_fn: see `graph.build_training_graph`.
    preprocess_options / dataset: saved with the model options in
      deeplab_config.json for eval, vis and export (skipped when None).
    model_fn, last_layer_scopes, device_pattern: see build_training_graph.
    session_config: tf.ConfigProto (default: `default_session_config` of
      train_options: soft placement, threads, XLA, mixed precision).
    handle_signals: stop cleanly on SIGTERM/SIGINT (main thread only);
      false when the caller forwards them (see `started`).
    master: TensorFlow master for the session ('' = in-process).
    start_time: time.time() when the command started (for the budget).
    cluster: a cluster_spec.Cluster (a worker task) to train on, or None for
      a single-machine run; its server is started here and is the master.
    started: optional fn(TrainingRun) called before the run starts, e.g.
      to forward signals to its `stop` and to report `stopped_now`.
    eval_data: validation.EvalData of run_options.eval_split (required
      when run_options.eval_interval_steps is set).
    train_split: the split input_fn reads; a cluster's workers must share
      it, with preprocess_options and the dataset's name.

  Returns:
    A RunResult.
  """
  spec = RunSpec(model_options, train_options, run_options, ignore_label,
                 input_fn, preprocess_options, dataset, model_fn,
                 last_layer_scopes, session_config, device_pattern,
                 eval_data, train_split)
  run = TrainingRun(spec, cluster, master, start_time)
  if started is not None:
    started(run)
  return run.execute(handle_signals)


class TrainingRun:
  """One training run in this process, in its role.

  It owns the stop state (signals, time budget), the lock, the hooks, the
  session and the result; the role decides who restores and checkpoints.
  """

  def __init__(self, spec, cluster=None, master='', start_time=None):
    self.spec = spec
    self.cluster = cluster
    self.role = Role.of(cluster)
    self.master = master
    self.start = start_time or time.time()
    self.stop = hooks_lib.StopState()
    self.signals = hooks_lib.SignalStopHook(self.stop)
    # What `stopped_now` reports, kept up to date as the run goes on.
    self._start_step = None
    self._start_checkpoint = None  # the logdir's latest when the run began
    self._hooks_now = None
    # The validation history and best read back (validating runs only).
    self._validation = None

  def elapsed(self):
    return time.time() - self.start

  def _result(self, status, stop_reason, detail=None, **fields):
    """A RunResult; a `detail` (a message naming option fields, see
    config/errors.py) gives the message too."""
    if detail is not None:
      fields['message'] = str(detail)
    return RunResult(status, stop_reason, seconds=self.elapsed(),
                     detail=detail, **fields)

  def _reached(self):
    """(the last step done, the last checkpoint written) so far, from any
    thread: the logdir's when the run began until it trains."""
    hooks, step = self._hooks_now, self._start_step
    checkpoint = self._start_checkpoint
    if hooks is not None:
      if hooks.progress.step is not None:
        step = hooks.progress.step
      if hooks.checkpoints is not None:
        checkpoint = hooks.checkpoints.last_checkpoint or checkpoint
    return step, checkpoint

  def stopped_now(self, status, reason, why=None):
    """The result of a run ended at once (a second signal, or `why`), from
    any thread: the last step done and the last checkpoint written."""
    hooks = self._hooks_now
    step, checkpoint = self._reached()
    loss = hooks.progress.loss if hooks is not None else None
    if self.role.decides_weights:
      resumes = ('training resumes from the last checkpoint (%s)'
                 % (checkpoint or 'none written yet'))
    else:
      resumes = 'the chief writes the checkpoints'
    return self._result(
        status, reason, global_step=step, loss=loss, checkpoint=checkpoint,
        message='stopped at once (%s) after step %s; %s'
        % (why or reason + ' again', step, resumes))

  def session_progress(self):
    """(whether its training session started, seconds per step or None),
    from any thread."""
    hooks = self._hooks_now
    if hooks is None:
      return False, None
    return hooks.progress.in_session, hooks.progress.seconds_per_step

  def step_began(self):
    """When the training step under way began (time.time()), or None
    between steps, from any thread."""
    hooks = self._hooks_now
    return None if hooks is None else hooks.progress.step_began

  def longest_step(self):
    """The longest step made so far in seconds (warm-up included), or
    None before the first ended, from any thread."""
    hooks = self._hooks_now
    return None if hooks is None else hooks.progress.longest_step

  def execute(self, handle_signals=True):
    """Locks the logdir and trains; every expected ending is a result."""
    logdir = self.spec.run_options.train_logdir
    if handle_signals:
      self.signals.install()
    try:
      if self.cluster is not None:
        # Before the logdir is made (an empty one was left behind).
        _check_cluster_run(self.spec.run_options, self.spec.train_options)
      os.makedirs(logdir, exist_ok=True)
      with lock_lib.LogdirLock(logdir,
                               cluster_lib.lock_filename(self.cluster)):
        if self.cluster is not None:
          self.master = cluster_lib.start_server(self.cluster).target
        return self._train_locked()
    except lock_lib.LogdirLockedError as e:
      return self._result('locked', 'locked', message=str(e))
    except config.ConfigError as e:
      # Found while training too (the validation split gone, a damaged
      # record): the checkpoints written before are the run's.
      step, checkpoint = self._reached()
      return self._result('bad_input', 'bad_input', detail=e,
                          global_step=step, checkpoint=checkpoint)
    finally:
      if handle_signals:
        self.signals.restore()

  def _starting_point(self):
    """(latest logdir checkpoint or None, its step, init checkpoint or
    None); a worker learns its step when it joins (cluster.JoinHook)."""
    if not self.role.decides_weights:
      return None, 0, None
    return _starting_point(self.spec.train_options, self.spec.run_options)

  def _train_locked(self):
    spec = self.spec
    latest, start_step, init = self._starting_point()
    self._start_step = start_step
    self._start_checkpoint = latest
    target = spec.train_options.training_number_of_steps
    if start_step >= target:
      scored = ''
      if latest and self.role.decides_weights and spec.run_options.validates:
        if self.stop.reason:
          return self._stopped_before_training(start_step, latest)
        failed, scored = self._score_unscored(latest, start_step)
        if failed is not None:
          return failed
      # A signal during that scoring is the run's stop reason (it was
      # 'nothing_to_do' as if none had come).
      stopped = (' (%s during the scoring)' % self.stop.reason
                 if scored and self.stop.reason else '')
      detail = errors.Message(
          'nothing to do: %s is at step %d, '
          '{TrainOptions.training_number_of_steps}=%d%s%s',
          spec.run_options.train_logdir, start_step, target, scored, stopped)
      if self.cluster is not None and self.role.decides_weights:
        self._hand_over_finished_run(init)
      logging.info('%s', detail)
      return self._result('ok', self.stop.reason if stopped else
                          'nothing_to_do', global_step=start_step,
                          checkpoint=latest, detail=detail)
    if self.role.decides_weights and spec.run_options.validates:
      if (latest and start_step and
          not start_step % spec.run_options.eval_interval_steps):
        # A step of the rhythm the run that saved it did not score (killed,
        # stopped by a signal or the time budget, or best/ or the history
        # could not be written): scored before training goes on.
        failed, _ = self._score_unscored(latest, start_step)
        if failed is not None:
          return failed
      else:
        self._validation = self._validation_state(start_step)
      if self._validation.patience_used_up(
          spec.run_options.early_stopping_patience):
        return self._patience_used_up(start_step, latest)
    last_step = target
    if spec.run_options.num_steps_more:
      last_step = min(target, start_step + spec.run_options.num_steps_more)
    if self.stop.reason:
      return self._stopped_before_training(start_step, latest)
    g = self._training_graph(init)
    if latest and self.role.decides_weights:
      _check_shapes_resumable(latest, g.graph, spec.run_options.train_logdir)
    # A worker learns the step it starts from when it joins (JoinHook).
    steps = ('from step %d to %d' % (start_step, last_step)
             if self.role.decides_weights else
             'up to step %d, from the step the chief reached' % last_step)
    logging.info('Training %s %s: batch %d on %d tower(s), crop %s, output '
                 'stride %d', spec.model_options.model_variant, steps,
                 spec.train_options.train_batch_size,
                 spec.train_options.num_clones, spec.model_options.crop_size,
                 spec.model_options.output_stride)
    if self.stop.reason:
      return self._stopped_before_training(start_step, latest)
    return self._session_loop(g, last_step, target, start_step)

  def _training_graph(self, init):
    spec = self.spec
    return graph_lib.build_training_graph(
        spec.model_options, spec.train_options,
        ignore_label=spec.ignore_label, input_fn=spec.input_fn,
        model_fn=spec.model_fn, last_layer_scopes=spec.last_layer_scopes,
        init_checkpoint=init,
        keep_checkpoint_max=spec.run_options.keep_checkpoint_max,
        device_pattern=spec.device_pattern,
        **_cluster_graph_args(self.cluster))

  def _hand_over_finished_run(self, init):
    """A chief with nothing to do still loads its last checkpoint into the
    ps tasks: the other workers wait for the chief to make the model ready
    on them, and only then see that the run is finished (nothing_to_do).
    Without this, ps tasks restarted since the run finished left them
    waiting (up to two hours)."""
    g = self._training_graph(init)
    cluster_lib.without_steps(g.optimizer)
    with g.graph.as_default():
      with self._open_session(g, []):
        logging.info('The parameter servers hold the finished run: the other '
                     'workers stop when they join')

  def _score_unscored(self, latest, step):
    """A validating run scores the latest checkpoint when the run that
    saved it did not (it was killed before, or could not write best/ or the
    history): with nothing to train, or at a step of the rhythm. Sets
    self._validation.

    Returns:
      (a RunResult when best/ or the history could not be written, else
      None; '' or words on the evaluation for the result's message).
    """
    self._validation = self._validation_state(step)
    if step in self._validation.evaluated_steps:
      return None, ''
    logging.info('scoring %s: the run that saved it did not', latest)
    events = hooks_lib.EventsFile(self.spec.run_options.train_logdir, None,
                                  with_graph=False)
    with tf.Graph().as_default():
      validator = self._validator(events)
      try:
        validator.score(latest, step)
      except validation_lib.ValidationNotSavedError as e:
        logging.error('%s', e)
        return self._result('error', 'validation_not_saved', global_step=step,
                            checkpoint=latest, message=str(e)), ''
      finally:
        validator.close()
        events.close()
    return None, '; scored step %d, which the run that saved it did not: %s' % (
        step, validator.summary())

  def _validation_state(self, checkpoint_step):
    """The ValidationState read back from the logdir, whose latest
    checkpoint is of `checkpoint_step` (0: none)."""
    run_options = self.spec.run_options
    if self.spec.eval_data is None:
      raise config.ConfigError(
          '{RunOptions.eval_interval_steps} needs the dataset to evaluate '
          'on: pass eval_data to train()')
    key = validation_lib.metric_key(run_options.best_metric,
                                    self.spec.eval_data.dataset_info)
    return validation_lib.load_state(
        run_options.train_logdir, run_options.best_metric, key,
        run_options.early_stopping_min_delta,
        run_options.early_stopping_start_step, checkpoint_step=checkpoint_step,
        split=run_options.eval_split,
        dataset_info=self.spec.eval_data.dataset_info)

  def _patience_used_up(self, start_step, latest):
    """The history already ends with `patience` evaluations without
    improvement: the run stopped early before and does not train again."""
    run_options = self.spec.run_options
    detail = errors.Message(
        'nothing to do: the last %d evaluations in %s did not improve %s by '
        'more than %g ({RunOptions.early_stopping_patience}=%d); raise '
        '{RunOptions.early_stopping_patience} to train on',
        self._validation.without_improvement,
        validation_lib.history_path(run_options.train_logdir),
        run_options.best_metric, run_options.early_stopping_min_delta,
        run_options.early_stopping_patience)
    logging.info('%s', detail)
    return self._result('ok', validation_lib.EARLY_STOPPING,
                        global_step=start_step, checkpoint=latest,
                        detail=detail)

  def _stopped_before_training(self, start_step, latest):
    """Signalled before the session started: nothing trained or saved."""
    return self._result('ok', self.stop.reason, global_step=start_step,
                        checkpoint=latest,
                        message='stopped before training (%s)'
                        % self.stop.reason)

  def _hooks(self, g, last_step):
    """The hooks, in the order their after_run must run (see hooks.py)."""
    run_options = self.spec.run_options
    progress = hooks_lib.ProgressHook(
        {'loss': g.total_loss, 'learning_rate': g.learning_rate,
         'step': g.step_after}, g.batch_size, last_step,
        run_options.log_steps)
    join = checkpoints = validation = events = None
    hook_list = []
    if self.role is Role.WORKER:
      join = cluster_lib.JoinHook(g.global_step, last_step,
                                  self.cluster.startup_step())
      hook_list.append(join)
    hook_list += [hooks_lib.NonFiniteGuardHook(g.total_loss, g.all_finite,
                                               g.step_after),
                  progress, hooks_lib.LastStepHook(g.step_after, last_step),
                  self.signals]
    budget = None
    if run_options.max_run_seconds and not self._keeps_its_own_budget():
      logging.info(errors.Message(
          '{RunOptions.max_run_seconds}=%g is the chief\'s in a synchronous '
          'run: once it trains, this worker stops when the chief does (until '
          'then, on its own budget)', run_options.max_run_seconds))
    elif run_options.max_run_seconds:
      budget = hooks_lib.TimeBudgetHook(run_options.max_run_seconds,
                                        self.start, self.stop)
      hook_list.append(budget)
    if self.role.decides_weights:
      events = hooks_lib.EventsFile(
          run_options.train_logdir, g.graph,
          with_graph=checkpoint_state.latest(
              run_options.train_logdir) is None)
      checkpoints = hooks_lib.CheckpointHook(
          g.saver, run_options.train_logdir, g.global_step, g.step_after,
          save_secs=run_options.save_interval_secs,
          save_steps=run_options.save_interval_steps, events=events)
      hook_list.append(checkpoints)
      if self._validation is not None:
        validation = self._validation_hook(g, checkpoints, last_step, events,
                                           budget)
        hook_list.append(validation)
      hook_list += self._chief_output_hooks(g, events)
    if self.cluster is not None:
      hook_list += cluster_lib.optimizer_hooks(g.optimizer, self.cluster,
                                               g.global_step, last_step)
    return _Hooks(hook_list, progress, checkpoints, join, validation, events)

  def _keeps_its_own_budget(self):
    """Whether --max_run_seconds ends this task. Not for a worker of a
    synchronous run: the chief's ends the run and releases it. Given the
    same budget (every task runs the same command), a worker that stopped
    first left the chief's step waiting for its gradients for ever, past
    the chief's own budget, without a final checkpoint."""
    return self.role is not Role.WORKER or not self.cluster.sync_replicas

  def budget_deadline(self):
    """When --max_run_seconds ends this task (time.time()), or None."""
    seconds = self.spec.run_options.max_run_seconds
    if not seconds or not self._keeps_its_own_budget():
      return None
    return self.start + seconds

  def _validator(self, events):
    """The Validator of the run's validation state."""
    spec = self.spec
    run_options = spec.run_options
    evaluator = validation_lib.Evaluator(
        spec.eval_data, run_options.eval_split, spec.model_options,
        spec.preprocess_options)
    return validation_lib.Validator(
        run_options, evaluator, self._validation,
        validation_lib.metric_key(run_options.best_metric,
                                  spec.eval_data.dataset_info), events)

  def _validation_hook(self, g, checkpoints, last_step, events, budget):
    """Scores what `checkpoints` saves (so it comes after it)."""
    return validation_lib.ValidationHook(
        self.spec.run_options, self._validator(events), checkpoints.save_now,
        g.global_step, g.step_after, last_step, self.stop, budget)

  def _chief_output_hooks(self, g, events):
    """Summaries and profiles: written by the one who writes checkpoints."""
    run_options = self.spec.run_options
    out = []
    if run_options.save_summaries_secs:
      out.append(tf.train.SummarySaverHook(
          save_secs=run_options.save_summaries_secs,
          summary_writer=events.writer, summary_op=g.summary_op))
    if run_options.profile_logdir:
      os.makedirs(run_options.profile_logdir, exist_ok=True)
      out.append(hooks_lib.ChromeTraceHook(
          save_steps=PROFILE_STEPS, output_dir=run_options.profile_logdir))
    return out

  def _open_session(self, g, hooks, waits=None, last_step=None):
    """The MonitoredSession of a single-machine run or of a cluster task;
    `waits` (the hook of cluster_session.noticing_waits), if any, comes
    first. A non-chief worker given `last_step` joins a run the ps hold at
    that step without a live chief (it then stops: nothing to do)."""
    hook_list = ([waits] if waits is not None else []) + hooks
    session_config = (self.spec.session_config or
                      default_session_config(self.spec.train_options))
    logdir = self.spec.run_options.train_logdir
    if self.cluster is None:
      return tf.train.MonitoredTrainingSession(
          master=self.master, is_chief=True, checkpoint_dir=logdir,
          scaffold=g.scaffold, hooks=hook_list, save_checkpoint_secs=None,
          save_checkpoint_steps=None, save_summaries_steps=None,
          save_summaries_secs=None, log_step_count_steps=None,
          config=session_config)
    spec = self.spec
    options = cluster_session.ChiefOptions(cluster_session.run_options_text(
        spec.model_options, spec.train_options, self.cluster,
        spec.preprocess_options, (spec.dataset or {}).get('name'),
        spec.train_split))
    creator = cluster_session.session_creator(
        self.cluster, g.scaffold, self.master,
        cluster_session.session_config(self.cluster, session_config), logdir,
        options, waits=waits,
        should_stop=self._stops_waiting,
        finished=(None if last_step is None else
                  lambda session: session.run(g.global_step) >= last_step))
    if not self.role.decides_weights:
      hook_list.append(cluster_session.ChiefOptionsHook(options,
                                                        self.cluster.task))
    return tf.train.MonitoredSession(
        session_creator=creator, hooks=hook_list,
        stop_grace_period_secs=cluster_lib.STOP_GRACE_SECS)

  def _stops_waiting(self):
    """Whether a non-chief worker still waiting for the chief stops: it was
    asked to, or its --max_run_seconds passed. A synchronous worker's
    budget too, before its first session: it has no share in a step yet,
    and nobody waits for it (it waited for ever for a chief that did not
    come). Not once it trained (its session re-created after a chief or ps
    restart): the run's steps wait for it again, as the chief's budget
    decides."""
    seconds = self.spec.run_options.max_run_seconds
    hooks = self._hooks_now
    trained = hooks is not None and hooks.progress.in_session
    if (seconds and self.elapsed() >= seconds
        and (not trained or self._keeps_its_own_budget())):
      self.stop.request(hooks_lib.TIME_BUDGET)
    return self.stop.reason is not None

  def _session_loop(self, g, last_step, target, start_step):
    logdir = self.spec.run_options.train_logdir
    with g.graph.as_default():
      hooks = self._hooks(g, last_step)
    self._hooks_now = hooks
    try:
      with g.graph.as_default():
        with cluster_session.noticing_waits(self.cluster) as waits:
          session = self._open_session(g, hooks.all, waits, last_step)
        with session as sess:
          self._save_run_config()
          while not sess.should_stop():
            sess.run(g.train_op)
    except config.ConfigError as e:
      # A worker whose options differ from the chief's (also a chief
      # restarted with other options while it trained), the validation
      # split gone or damaged: how far it got.
      step, checkpoint = self._reached()
      return self._result('bad_input', 'bad_input', global_step=step,
                          loss=hooks.progress.loss, checkpoint=checkpoint,
                          detail=e)
    except cluster_session.StoppedWhileWaiting:
      # Also in a session re-created after a chief or ps restart, after
      # steps (it said 'before any step' then).
      step = hooks.progress.step
      when = ('before any step' if step is None else
              'after step %d' % step)
      return self._result(
          'ok', self.stop.reason, global_step=step,
          message='stopped %s (%s), while waiting for the chief; the chief '
          'writes the checkpoints' % (when, self.stop.reason))
    except hooks_lib.CheckpointNotSavedError as e:
      logging.error('%s', e)
      return self._result('error', 'checkpoint_not_saved',
                          global_step=hooks.progress.step,
                          loss=hooks.progress.loss, checkpoint=e.previous,
                          message=str(e))
    except validation_lib.ValidationNotSavedError as e:
      logging.error('%s', e)
      return self._result('error', 'validation_not_saved', global_step=e.step,
                          loss=hooks.progress.loss,
                          checkpoint=checkpoint_state.latest(logdir),
                          message=str(e))
    except tf.errors.NotFoundError as e:
      missing = _NOT_IN_CHECKPOINT.search(e.message or '')
      if missing is None:
        raise
      # Restoring the logdir's checkpoint: made by other options (those
      # deeplab_config.json records are checked before, see
      # config.check_resumable; an older logdir may not record them).
      name = missing.group(1)
      # An optimizer's slot, or a layer another model flag adds (a decoder
      # was blamed on the optimizer).
      which = ('another {TrainOptions.optimizer}'
               if _OPTIMIZER_SLOT.search(name) else
               'other model flags, e.g. {ModelOptions.decoder_output_stride}')
      detail = errors.Message(
          'the last checkpoint in %s lacks %s, a variable of this run\'s '
          'graph: it was trained with other options (' + which + '); train '
          'on with those, or start a new {RunOptions.train_logdir}', logdir,
          name)
      logging.error('%s', detail)
      return self._result('bad_input', 'bad_input',
                          checkpoint=checkpoint_state.latest(logdir),
                          detail=detail)
    except hooks_lib.NonFiniteLossError as e:
      logging.error('%s', e)
      return self._result('non_finite_loss', 'non_finite_loss',
                          global_step=e.step, loss=e.loss,
                          checkpoint=checkpoint_state.latest(logdir),
                          detail=e.detail)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
      files = getattr(self.spec.input_fn, 'record_files', None)
      message = pipeline.data_error_message(e, files() if files else None)
      if message is None:
        raise
      logging.error('%s', message)
      return self._result('bad_input', 'bad_input',
                          global_step=hooks.progress.step,
                          loss=hooks.progress.loss,
                          checkpoint=checkpoint_state.latest(logdir),
                          message=message)
    finally:
      if hooks.validation is not None:
        hooks.validation.validator.close()
      # Flushes and closes the events file (also after an error).
      if hooks.events is not None:
        hooks.events.close()
    return self._end(hooks, last_step, target, start_step)

  def _save_run_config(self):
    """Writes deeplab_config.json (for eval, vis, export and the next run)
    once the session exists: the logdir's checkpoint, if any, was restored
    into this run's graph. A run that failed before (e.g. another
    optimizer, whose slots the checkpoint lacks) leaves it as it was;
    rewritten, it made the next run be checked against the failed run's
    options."""
    spec = self.spec
    if (self.role.decides_weights and spec.preprocess_options is not None
        and spec.dataset is not None):
      config.save_run_config(spec.run_options.train_logdir,
                             spec.model_options, spec.preprocess_options,
                             spec.dataset, spec.train_options)

  def _end(self, hooks, last_step, target, start_step):
    """The result of a session loop that ended without an error."""
    progress = hooks.progress
    step = progress.step if progress.step is not None else start_step
    checkpoint = (hooks.checkpoints.last_checkpoint if hooks.checkpoints
                  else None)
    if self.cluster is not None and checkpoint:
      # Other workers may have updated after the chief's last step (they
      # do in asynchronous mode): report the step the checkpoint holds.
      step = max(step, checkpoint_step(checkpoint))
    if self.stop.reason:
      reason = self.stop.reason
    elif step >= last_step:
      reason = 'finished' if last_step == target else 'num_steps_more'
    elif self.role is Role.WORKER:
      return self._worker_end(hooks.join, progress)
    else:
      return self._result(
          'bad_input', 'input_exhausted', global_step=step,
          loss=progress.loss, checkpoint=checkpoint,
          message=('the input ended at step %d before step %d: is the '
                   'training split empty?' % (step, last_step)))
    where = ('checkpoint %s' % checkpoint if self.role.decides_weights
             else 'the chief writes the checkpoints')
    if hooks.validation is not None:
      where += '; %s' % hooks.validation.validator.summary()
    return self._result('ok', reason, global_step=step, loss=progress.loss,
                        checkpoint=checkpoint,
                        message='stopped at step %d (%s); %s'
                        % (step, reason, where))

  def _worker_end(self, join_hook, progress):
    """A non-chief worker that stopped before the last step: the run was
    already over when it joined, or the chief ended it."""
    if join_hook.finished_step is not None:
      return self._result(
          'ok', 'nothing_to_do', global_step=join_hook.finished_step,
          message='the run was already at step %d when this worker joined'
          % join_hook.finished_step)
    step = progress.step
    return self._result('ok', 'chief_stopped', global_step=step,
                        loss=progress.loss,
                        message='the chief ended the run; this worker '
                        + ('stopped at step %d' % step if step is not None
                           else 'had trained no step'))


# TensorFlow's words for a variable that a restored checkpoint lacks.
_NOT_IN_CHECKPOINT = re.compile(r'Key (\S+) not found in checkpoint')
# The slots optimizers keep beside a variable ('.../Momentum', '.../Adam_1')
# and Adam's powers.
_OPTIMIZER_SLOT = re.compile(r'(/(Momentum|Adam(_1)?)$)|^beta[12]_power')


def _check_shapes_resumable(checkpoint, graph, logdir):
  """Raises ConfigError when the logdir's last checkpoint holds variables
  of this run's graph with another shape, or network variables the graph
  does not build (e.g. a decoder): it was trained with other model
  flags (a logdir without deeplab_config.json, e.g. the original's, takes
  the flags). Before, the restore passed, the run wrote its options to
  deeplab_config.json, and its first step failed (exit 1, a TensorFlow
  trace); the next run with the right flags was then refused."""
  with graph.as_default():
    # Missing variables are named by the restore itself (see
    # _NOT_IN_CHECKPOINT).
    _, reshaped, unused = restore.compare_shapes(checkpoint,
                                                 tf.global_variables())
  advice = ('It was trained with other model flags '
            '({ModelOptions.model_variant}, {ModelOptions.depth_multiplier}, '
            '{ModelOptions.atrous_rates}, '
            '{ModelOptions.decoder_output_stride}, ...): pass those, or start '
            'a new {RunOptions.train_logdir}')
  logits = [(saved, built) for name, saved, built in reshaped
            if name.startswith('logits/') and saved[:-1] == built[:-1]]
  if logits and len(logits) == len(reshaped):
    # The original's logdir resumed on another dataset (one of another
    # class count): no model flag is at fault.
    saved, built = logits[0]
    raise config.ConfigError(
        'the last checkpoint in %s (%s) has logits of %d classes, this run '
        '%d: it was trained on another dataset. Resume it on that one, or '
        'fine-tune it on this one in a new {RunOptions.train_logdir} with '
        '{TrainOptions.tf_initial_checkpoint}=%s '
        '{TrainOptions.initialize_last_layer}=false', logdir,
        os.path.basename(checkpoint), saved[-1], built[-1], checkpoint)
  if reshaped:
    name, saved, built = reshaped[0]
    raise config.ConfigError(
        'the last checkpoint in %s (%s) holds %d variable(s) of another shape '
        'than this run\'s graph, e.g. %s: %s in the checkpoint, %s here. '
        + advice, logdir, os.path.basename(checkpoint), len(reshaped), name,
        list(saved), built)
  if unused:
    # Resumed, the run saved the network without them (and its options),
    # and the right flags were then refused.
    raise config.ConfigError(
        'the last checkpoint in %s (%s) holds %d variable(s) that this run\'s '
        'graph does not build, e.g. %s. ' + advice, logdir,
        os.path.basename(checkpoint), len(unused), ', '.join(unused[:3]))


def _check_cluster_run(run_options, train_options):
  """Refuses what a cluster task cannot train with, before any work."""
  if train_options.mixed_precision == 'fp16':
    raise config.ConfigError(
        '{TrainOptions.mixed_precision}=fp16 is not supported on a cluster '
        '(its loss scaling may skip a step, which replicas cannot agree on): '
        'give {TrainOptions.mixed_precision}=bf16, auto or none')
  if run_options.validates:
    raise config.ConfigError(
        '{RunOptions.eval_interval_steps} (validation during training) is '
        'not supported on a cluster yet: run deeplab-eval beside the '
        'cluster on the chief\'s train_logdir instead')
  if run_options.num_steps_more:
    raise config.ConfigError(
        '{RunOptions.num_steps_more} is not supported on a cluster (every '
        'worker would need the chief\'s checkpoint step): raise '
        '{TrainOptions.training_number_of_steps} instead')


def _starting_point(train_options, run_options):
  """(latest logdir checkpoint or None, its step, init checkpoint or None)."""
  logdir = run_options.train_logdir
  checkpoint_state.remove_killed_saves(logdir)
  restore.remove_dead_pins(logdir)
  # Never start over on top of checkpoints whose state file was lost.
  latest = checkpoint_state.repair(logdir)
  step = checkpoint_step(latest) if latest else 0
  init = None
  if train_options.tf_initial_checkpoint:
    if latest:
      bar = '!' * 72
      logging.warning(errors.Message(
          '\n%s\n  %s already holds checkpoint %s (step %d): RESUMING from '
          'it.\n  {TrainOptions.tf_initial_checkpoint}=%s is IGNORED (it '
          'only initialises a new run).\n  Use an empty '
          '{RunOptions.train_logdir} to start afresh from it.\n%s', bar,
          logdir, latest, step, train_options.tf_initial_checkpoint, bar))
    else:
      init = checkpoint_init.resolve_checkpoint(
          train_options.tf_initial_checkpoint)
  return latest, step, init


def _cluster_graph_args(cluster):
  """build_training_graph's device and optimizer arguments on a cluster."""
  if cluster is None:
    return {}
  return {'graph_device': cluster_lib.variables_device(cluster),
          'wrap_optimizer': functools.partial(cluster_lib.wrap_optimizer,
                                              cluster=cluster)}
