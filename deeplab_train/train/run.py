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
"""
import dataclasses
import json
import os
import time
from typing import Optional

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.train import checkpoint_init
from deeplab_train.train import graph as graph_lib
from deeplab_train.train import hooks as hooks_lib
from deeplab_train.train import inputs
from deeplab_train.train import lock as lock_lib

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
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = os.path.join(directory, '.%s.tmp-%d' % (os.path.basename(path),
                                                os.getpid()))
  with open(tmp, 'w') as f:
    f.write(result.to_json() + '\n')
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def checkpoint_step(prefix):
  """The global step stored in a checkpoint (0 when it has none)."""
  reader = tf.train.NewCheckpointReader(prefix)
  if reader.has_tensor('global_step'):
    return int(reader.get_tensor('global_step'))
  return 0


def default_session_config():
  # Soft placement puts ops without a GPU kernel on the CPU.
  return tf.ConfigProto(allow_soft_placement=True)


def train(model_options, train_options, run_options, *, ignore_label,
          input_fn, preprocess_options=None, dataset=None, model_fn=None,
          last_layer_scopes=None, session_config=None, device_pattern=None,
          handle_signals=True, master='', start_time=None):
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
    session_config: tf.ConfigProto (default: soft placement).
    handle_signals: stop cleanly on SIGTERM/SIGINT (main thread only).
    master: TensorFlow master for the session ('' = in-process).
    start_time: time.time() when the command started (for the budget).

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
    with lock_lib.LogdirLock(logdir):
      return _train_locked(
          model_options, train_options, run_options, ignore_label, input_fn,
          preprocess_options, dataset, model_fn, last_layer_scopes,
          session_config, device_pattern, stop, signals, master, start)
  except lock_lib.LogdirLockedError as e:
    return RunResult('locked', 'locked', seconds=time.time() - start,
                     message=str(e))
  except config.ConfigError as e:
    return RunResult('bad_input', 'bad_input', seconds=time.time() - start,
                     message=str(e))
  finally:
    if handle_signals:
      signals.restore()


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
                  signals, master, start):
  latest, start_step, init = _starting_point(train_options, run_options)
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
      device_pattern=device_pattern)
  if preprocess_options is not None and dataset is not None:
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
                       session_config or default_session_config(), stop,
                       signals, master, start)


def _make_hooks(g, run_options, last_step, stop, signals, start):
  """The hooks, in the order their after_run must run (see hooks.py)."""
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
  return hook_list, progress, checkpoints


def _session_loop(g, run_options, last_step, target, start_step,
                  session_config, stop, signals, master, start):
  with g['graph'].as_default():
    hook_list, progress, checkpoints = _make_hooks(
        g, run_options, last_step, stop, signals, start)
  elapsed = lambda: time.time() - start
  try:
    with g['graph'].as_default():
      with tf.train.MonitoredTrainingSession(
          master=master, is_chief=True,
          checkpoint_dir=run_options.train_logdir, scaffold=g['scaffold'],
          hooks=hook_list, save_checkpoint_secs=None,
          save_checkpoint_steps=None, save_summaries_steps=None,
          save_summaries_secs=None, log_step_count_steps=None,
          config=session_config) as sess:
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
  checkpoint = checkpoints.last_checkpoint
  if stop.reason:
    reason = stop.reason
  elif step >= last_step:
    reason = 'finished' if last_step == target else 'num_steps_more'
  else:
    message = ('the input ended at step %d before step %d: is the training '
               'split empty?' % (step, last_step))
    return RunResult('bad_input', 'input_exhausted', step, progress.loss,
                     checkpoint, elapsed(), message)
  return RunResult('ok', reason, step, progress.loss, checkpoint, elapsed(),
                   'stopped at step %d (%s); checkpoint %s'
                   % (step, reason, checkpoint))
