"""A training run: lock, resume or initialise, train, stop, report.

`train` is what `deeplab-train` calls. It never raises for the outcomes a
cron job must tell apart; it returns a `RunResult` whose `status` maps to the
exit code (`EXIT_CODES`):

  ok               0  finished, time budget, SIGTERM/SIGINT (a final
                      checkpoint is written), or nothing to do
  error            1  anything unexpected (raised by the caller's catch-all)
  bad_input        2  bad flags, dataset or checkpoint (ConfigError), bad
                      records met while training, input exhausted
  non_finite_loss  3  NaN/inf loss or weights; no checkpoint of that step
  locked          75  another live run holds the logdir (EX_TEMPFAIL)

Order of precedence for the starting weights: a checkpoint in train_logdir
(resume), else --tf_initial_checkpoint, else random initialisation.

On a cluster (see cluster.py) the chief decides the starting weights, writes
the checkpoints, summaries and deeplab_config.json and holds the logdir lock;
another worker locks only its own task (`.deeplab-train.worker-<i>.lock`),
waits for the chief and reports no checkpoint.
"""
import dataclasses
import functools
import json
import os
import time
from typing import Optional

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train.train import checkpoint_init
from deeplab_train.train import cluster as cluster_lib
from deeplab_train.train import graph as graph_lib
from deeplab_train.train import hooks as hooks_lib
from deeplab_train.train import inputs
from deeplab_train.train import lock as lock_lib
from deeplab_train.train import session_config as session_lib

EXIT_CODES = {'ok': 0, 'error': 1, 'bad_input': 2, 'non_finite_loss': 3,
              'locked': 75}
# Steps between two Chrome traces with --profile_logdir.
PROFILE_STEPS = 100


@dataclasses.dataclass
class RunResult:
  """How a run ended (see the module docstring for statuses)."""
  status: str
  stop_reason: str
  global_step: Optional[int] = None
  loss: Optional[float] = None
  checkpoint: Optional[str] = None
  seconds: float = 0.0
  message: str = ''

  @property
  def exit_code(self):
    return EXIT_CODES[self.status]

  def to_dict(self):
    d = {'event': 'result'}
    d.update(dataclasses.asdict(self))
    d['seconds'] = round(self.seconds, 3)
    if d['loss'] is not None and not hooks_lib.is_finite_number(d['loss']):
      d['loss'] = str(d['loss'])  # JSON has no NaN
    return d

  def to_json(self):
    return json.dumps(self.to_dict(), sort_keys=True)


def write_result_json(result, path):
  """Writes the result to `path` under a temporary name, then renames."""
  atomic.write_bytes(path, (result.to_json() + '\n').encode('utf-8'))


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


def train(model_options, train_options, run_options, *, ignore_label,
          input_fn, preprocess_options=None, dataset=None, model_fn=None,
          last_layer_scopes=None, session_config=None, device_pattern=None,
          handle_signals=True, master='', start_time=None, cluster=None):
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
    handle_signals: stop cleanly on SIGTERM/SIGINT (main thread only).
    master: TensorFlow master for the session ('' = in-process).
    start_time: time.time() when the command started (for the budget).
    cluster: a cluster.Cluster (a worker task) to train on, or None for a
      single-machine run; its server is started here and is the master.

  Returns:
    A RunResult.
  """
  start = start_time or time.time()
  logdir = run_options.train_logdir
  os.makedirs(logdir, exist_ok=True)
  stop = hooks_lib.StopState()
  signals = hooks_lib.SignalStopHook(stop)
  if handle_signals:
    signals.install()
  try:
    with lock_lib.LogdirLock(logdir, cluster_lib.lock_filename(cluster)):
      if cluster is not None:
        _check_cluster_run(run_options)
        master = cluster_lib.start_server(cluster).target
      return _train_locked(
          model_options, train_options, run_options, ignore_label, input_fn,
          preprocess_options, dataset, model_fn, last_layer_scopes,
          session_config, device_pattern, stop, signals, master, start,
          cluster)
  except lock_lib.LogdirLockedError as e:
    return RunResult('locked', 'locked', seconds=time.time() - start,
                     message=str(e))
  except config.ConfigError as e:
    return RunResult('bad_input', 'bad_input', seconds=time.time() - start,
                     message=str(e))
  finally:
    if handle_signals:
      signals.restore()


def _check_cluster_run(run_options):
  if run_options.num_steps_more:
    raise config.ConfigError(
        '--num_steps_more is not supported on a cluster (every worker would '
        'need the chief\'s checkpoint step): raise --training_number_of_steps '
        'instead')


def _starting_point(train_options, run_options):
  """(latest logdir checkpoint or None, its step, init checkpoint or None)."""
  logdir = run_options.train_logdir
  latest = tf.train.latest_checkpoint(logdir)
  step = checkpoint_step(latest) if latest else 0
  init = None
  if train_options.tf_initial_checkpoint:
    if latest:
      bar = '!' * 72
      logging.warning(
          '\n%s\n  %s already holds checkpoint %s (step %d): RESUMING from it.'
          '\n  --tf_initial_checkpoint=%s is IGNORED (it only initialises a '
          'new run).\n  Use an empty --train_logdir to start afresh from it.'
          '\n%s', bar, logdir, latest, step,
          train_options.tf_initial_checkpoint, bar)
    else:
      init = checkpoint_init.resolve_checkpoint(
          train_options.tf_initial_checkpoint)
  return latest, step, init


def _train_locked(model_options, train_options, run_options, ignore_label,
                  input_fn, preprocess_options, dataset, model_fn,
                  last_layer_scopes, session_config, device_pattern, stop,
                  signals, master, start, cluster=None):
  chief = cluster is None or cluster.is_chief
  if chief:
    latest, start_step, init = _starting_point(train_options, run_options)
  else:
    # The chief restores or initialises the shared variables; the step this
    # worker starts at is known once it joins (see cluster.JoinHook).
    latest, start_step, init = None, 0, None
  target = train_options.training_number_of_steps
  if start_step >= target:
    message = ('nothing to do: %s is at step %d, --training_number_of_steps=%d'
               % (run_options.train_logdir, start_step, target))
    logging.info(message)
    return RunResult('ok', 'nothing_to_do', start_step, None, latest,
                     time.time() - start, message)
  last_step = target
  if run_options.num_steps_more:
    last_step = min(target, start_step + run_options.num_steps_more)

  g = graph_lib.build_training_graph(
      model_options, train_options, ignore_label=ignore_label,
      input_fn=input_fn, model_fn=model_fn,
      last_layer_scopes=last_layer_scopes, init_checkpoint=init,
      keep_checkpoint_max=run_options.keep_checkpoint_max,
      device_pattern=device_pattern, **_cluster_graph_args(cluster))
  if chief and preprocess_options is not None and dataset is not None:
    config.save_run_config(run_options.train_logdir, model_options,
                           preprocess_options, dataset)
  logging.info('Training %s from step %d to %d: batch %d on %d tower(s), '
               'crop %s, output stride %d', model_options.model_variant,
               start_step, last_step, train_options.train_batch_size,
               train_options.num_clones, model_options.crop_size,
               model_options.output_stride)
  if stop.reason:
    # Signalled while the graph was built: nothing trained, nothing to save.
    return RunResult('ok', stop.reason, start_step, None, latest,
                     time.time() - start, 'stopped before training (%s)'
                     % stop.reason)
  return _session_loop(g, run_options, last_step, target, start_step,
                       session_config or default_session_config(train_options),
                       stop, signals, master, start, cluster)


def _cluster_graph_args(cluster):
  """build_training_graph's device and optimizer arguments on a cluster."""
  if cluster is None:
    return {}
  return {'graph_device': cluster_lib.variables_device(cluster),
          'wrap_optimizer': functools.partial(cluster_lib.wrap_optimizer,
                                              cluster=cluster)}


def _make_hooks(g, run_options, last_step, stop, signals, start,
                cluster=None):
  """The hooks, in the order their after_run must run (see hooks.py)."""
  if cluster is not None and not cluster.is_chief:
    return _worker_hooks(g, run_options, last_step, stop, signals, start,
                         cluster)
  logdir = run_options.train_logdir
  progress = hooks_lib.ProgressHook(
      {'loss': g['total_loss'], 'learning_rate': g['learning_rate'],
       'step': g['step_after']}, g['batch_size'], last_step,
      run_options.log_steps)
  checkpoints = hooks_lib.CheckpointHook(
      g['saver'], logdir, g['global_step'], g['step_after'],
      save_secs=run_options.save_interval_secs,
      save_steps=run_options.save_interval_steps)
  hook_list = [hooks_lib.NonFiniteGuardHook(g['total_loss'], g['all_finite'],
                                            g['step_after']),
               progress,
               tf.train.StopAtStepHook(last_step=last_step),
               signals]
  if run_options.max_run_seconds:
    hook_list.append(hooks_lib.TimeBudgetHook(run_options.max_run_seconds,
                                              start, stop))
  hook_list.append(checkpoints)
  if run_options.save_summaries_secs:
    hook_list.append(tf.train.SummarySaverHook(
        save_secs=run_options.save_summaries_secs, output_dir=logdir,
        summary_op=g['summary_op']))
  if run_options.profile_logdir:
    os.makedirs(run_options.profile_logdir, exist_ok=True)
    hook_list.append(tf.train.ProfilerHook(
        save_steps=PROFILE_STEPS, output_dir=run_options.profile_logdir))
  if cluster is not None:
    hook_list += cluster_lib.optimizer_hooks(g['optimizer'], cluster,
                                             g['global_step'], last_step)
  return hook_list, progress, checkpoints


def _worker_hooks(g, run_options, last_step, stop, signals, start, cluster):
  """A non-chief worker's hooks: no checkpoints, summaries or profiles."""
  progress = hooks_lib.ProgressHook(
      {'loss': g['total_loss'], 'learning_rate': g['learning_rate'],
       'step': g['step_after']}, g['batch_size'], last_step,
      run_options.log_steps)
  hook_list = [cluster_lib.JoinHook(g['global_step'], last_step,
                                    cluster.startup_step()),
               hooks_lib.NonFiniteGuardHook(g['total_loss'], g['all_finite'],
                                            g['step_after']),
               progress, tf.train.StopAtStepHook(last_step=last_step),
               signals]
  if run_options.max_run_seconds:
    hook_list.append(hooks_lib.TimeBudgetHook(run_options.max_run_seconds,
                                              start, stop))
  hook_list += cluster_lib.optimizer_hooks(g['optimizer'], cluster,
                                           g['global_step'], last_step)
  return hook_list, progress, None


def _open_session(g, run_options, hook_list, session_config, master,
                  cluster):
  """The MonitoredSession of a single-machine run or of a cluster worker."""
  if cluster is None:
    return tf.train.MonitoredTrainingSession(
        master=master, is_chief=True,
        checkpoint_dir=run_options.train_logdir, scaffold=g['scaffold'],
        hooks=hook_list, save_checkpoint_secs=None,
        save_checkpoint_steps=None, save_summaries_steps=None,
        save_summaries_secs=None, log_step_count_steps=None,
        config=session_config)
  creator = cluster_lib.session_creator(
      cluster, g['scaffold'], master,
      cluster_lib.session_config(cluster, session_config),
      run_options.train_logdir)
  return tf.train.MonitoredSession(
      session_creator=creator, hooks=hook_list,
      stop_grace_period_secs=cluster_lib.STOP_GRACE_SECS)


def _session_loop(g, run_options, last_step, target, start_step,
                  session_config, stop, signals, master, start,
                  cluster=None):
  with g['graph'].as_default():
    hook_list, progress, checkpoints = _make_hooks(
        g, run_options, last_step, stop, signals, start, cluster)
  elapsed = lambda: time.time() - start
  try:
    with g['graph'].as_default():
      with _open_session(g, run_options, hook_list, session_config, master,
                         cluster) as sess:
        while not sess.should_stop():
          sess.run(g['train_op'])
  except hooks_lib.NonFiniteLossError as e:
    logging.error('%s', e)
    return RunResult('non_finite_loss', 'non_finite_loss', e.step, e.loss,
                     tf.train.latest_checkpoint(run_options.train_logdir),
                     elapsed(), str(e))
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    message = inputs.input_error_message(e)
    if message is None:
      raise
    logging.error('%s', message)
    return RunResult('bad_input', 'bad_input', progress.step, progress.loss,
                     tf.train.latest_checkpoint(run_options.train_logdir),
                     elapsed(), message)
  finally:
    # Flushes and closes the summary writers (also after an error).
    tf.summary.FileWriterCache.clear()

  step = progress.step if progress.step is not None else start_step
  checkpoint = checkpoints.last_checkpoint if checkpoints else None
  if cluster is not None and checkpoint:
    # Other workers may have updated after the chief's last step (they do
    # in asynchronous mode): report the step the final checkpoint holds.
    step = max(step, checkpoint_step(checkpoint))
  if stop.reason:
    reason = stop.reason
  elif step >= last_step:
    reason = 'finished' if last_step == target else 'num_steps_more'
  elif checkpoints is None:
    join = next(h for h in hook_list if isinstance(h, cluster_lib.JoinHook))
    return _worker_end(join, progress, elapsed())
  else:
    message = ('the input ended at step %d before step %d: is the training '
               'split empty?' % (step, last_step))
    return RunResult('bad_input', 'input_exhausted', step, progress.loss,
                     checkpoint, elapsed(), message)
  where = ('checkpoint %s' % checkpoint if checkpoints
           else 'the chief writes the checkpoints')
  return RunResult('ok', reason, step, progress.loss, checkpoint, elapsed(),
                   'stopped at step %d (%s); %s' % (step, reason, where))


def _worker_end(join_hook, progress, seconds):
  """The result of a non-chief worker that stopped before the last step:
  the run was already over when it joined, or the chief ended it."""
  if join_hook.finished_step is not None:
    return RunResult('ok', 'nothing_to_do', join_hook.finished_step, None,
                     None, seconds, 'the run was already at step %d when this '
                     'worker joined' % join_hook.finished_step)
  step = progress.step
  return RunResult('ok', 'chief_stopped', step, progress.loss, None, seconds,
                   'the chief ended the run; this worker stopped at step %s'
                   % step)
