"""Session hooks of the training loop.

Order matters: `NonFiniteGuardHook` must come before `CheckpointHook` in the
hook list. Hooks' after_run run in list order, so a non-finite loss raises
before the checkpoint hook could save that step, and the exception leaving
the MonitoredSession skips every hook's end(), so no final checkpoint of
the broken weights is written either.
"""
import datetime
import itertools
import os
import re
import signal
import time

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train.config import errors
from deeplab_train.runtime import checkpoint_state
from deeplab_train.runtime import result as result_lib

# Stop reasons recorded by the hooks (see StopState).
TIME_BUDGET = result_lib.TIME_BUDGET
SIGNAL_PREFIX = result_lib.SIGNAL_PREFIX
# At most this many checkpoints at the end of a run (see CheckpointHook.end).
_END_SAVES = 3


class NonFiniteLossError(RuntimeError):
  """The loss or the updated weights are NaN or infinite (or, with fp16,
  the gradients at the smallest loss scale, step after step)."""

  def __init__(self, step, loss):
    # Names the option (a command shows it as its flag, see config/errors.py).
    self.detail = errors.Message(
        'non-finite loss, gradients or weights at step %d (loss %r); no '
        'checkpoint of this step was written. Lower '
        '{TrainOptions.base_learning_rate} or check the input labels.',
        step, loss)
    super().__init__(str(self.detail))
    self.step = step
    self.loss = loss


class CheckpointNotSavedError(RuntimeError):
  """Writing a checkpoint failed (e.g. a full disk); its files are removed
  and the previous checkpoint is still the latest."""

  def __init__(self, path, reason, previous):
    super().__init__(
        'cannot save checkpoint %s: %s; its partial files were removed and %s'
        % (path, write_failure(reason, os.path.dirname(path)),
           ('the last checkpoint, %s, is intact (training resumes from it)'
            % previous) if previous else 'no checkpoint was written'))
    self.path = path
    self.previous = previous


def write_failure(reason, folder):
  """'no space left on device. Free space in FOLDER and run again', or
  'REASON. Check that the folder is writable': a failed write's reason
  (write_error_reason) and what to do."""
  if 'no space left' in reason.lower():
    return 'no space left on device. Free space in %s and run again' % folder
  return '%s. Check that the folder is writable' % reason


class StopState:
  """Why the run was asked to stop (None: it ran to its last step)."""

  def __init__(self):
    self.reason = None

  def request(self, reason):
    if self.reason is None:
      self.reason = reason


class NonFiniteGuardHook(tf.train.SessionRunHook):
  """Raises NonFiniteLossError when the step's loss or weights are not
  finite (or, with fp16, the loss scale found the model diverged).

  Args:
    loss: the total loss tensor.
    all_finite: bool tensor, true when the loss and the updated weights are
      finite (evaluated after the update; see graph.TrainingGraph).
    step_after: global step after the update.
  """

  def __init__(self, loss, all_finite, step_after):
    self._fetches = {'loss': loss, 'ok': all_finite, 'step': step_after}

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    r = run_values.results
    if not r['ok']:
      raise NonFiniteLossError(int(r['step']), float(r['loss']))


class SignalStopHook(tf.train.SessionRunHook):
  """Asks the session to stop after the step when SIGTERM/SIGINT arrived.

  `install()` sets the handlers (from the start of the run, so a signal
  during graph building also stops cleanly) and `restore()` puts the
  previous ones back. A second signal of the same kind gets the previous
  behaviour (KeyboardInterrupt, termination), for an impatient user.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, stop_state):
    self._state = stop_state
    self._previous = {}

  def install(self):
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def _handle(self, signum, frame):
    name = signal.Signals(signum).name
    if self._state.reason == SIGNAL_PREFIX + name:
      # Second time: behave as before our handler (SIGINT raises
      # KeyboardInterrupt, SIGTERM terminates).
      previous = self._previous.get(signum, signal.SIG_DFL)
      if callable(previous):
        previous(signum, frame)
      else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
      return
    logging.warning('%s received: stopping after this step with a final '
                    'checkpoint (send it again to stop at once)', name)
    self._state.request(SIGNAL_PREFIX + name)

  def after_run(self, run_context, run_values):
    if self._state.reason and self._state.reason.startswith(SIGNAL_PREFIX):
      run_context.request_stop()


class LastStepHook(tf.train.SessionRunHook):
  """Asks the session to stop once the global step after an update reaches
  `last_step`.

  tf.train.StopAtStepHook decides from the global step read when the step
  starts. In synchronous cluster training the other replicas' updates land
  while a worker's step waits for its token, so that read can be behind by
  more than one step: the worker then starts a step after the last one,
  whose token never comes, and waits for ever. The value read after the
  update (and after the token) is the one that counts.

  Args:
    step_after: global step after the update (fetch only with train_op).
    last_step: the step the run stops at.
  """

  def __init__(self, step_after, last_step):
    self._step_after = step_after
    self._last_step = last_step

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._step_after)

  def after_run(self, run_context, run_values):
    if int(run_values.results) >= self._last_step:
      run_context.request_stop()


class TimeBudgetHook(tf.train.SessionRunHook):
  """Asks the session to stop once `max_seconds` passed since `start_time`."""

  def __init__(self, max_seconds, start_time, stop_state):
    self._deadline = start_time + max_seconds
    self._state = stop_state

  def seconds_left(self):
    return self._deadline - time.time()

  def stop(self, run_context, why='max_run_seconds reached'):
    logging.info('%s: stopping with a checkpoint', why)
    self._state.request(TIME_BUDGET)
    run_context.request_stop()

  def after_run(self, run_context, run_values):
    if self.seconds_left() <= 0:
      self.stop(run_context)


class EventsFile:
  """The one TensorBoard events file of a training run, made when first
  written to.

  The graph goes into it only in a run that starts the logdir (no
  checkpoint yet). A resumed run's graph is the one already in the first
  run's file; written again, it would take the size of a checkpoint's
  .meta twice (graph and meta graph, 7 MB for a tiny mobilenet_v2) on every
  resume, and a run stopped for a full disk would leave that much less
  room to the next.
  """

  # TensorFlow names the file by the second and the host only, and a run
  # starting in the same second as the one before would overwrite its
  # file: the process and a count tell them apart (as TF2's writer does).
  _made = itertools.count()

  def __init__(self, logdir, graph, with_graph):
    self._logdir = logdir
    self._graph = graph if with_graph else None
    self._writer = None

  @property
  def writer(self):
    if self._writer is None:
      self._writer = tf.summary.FileWriter(
          self._logdir, graph=self._graph,
          filename_suffix='.%d.%d' % (os.getpid(), next(self._made)))
    return self._writer

  def close(self):
    if self._writer is not None:
      self._writer.close()


class CheckpointHook(tf.train.SessionRunHook):
  """Saves every `save_secs` seconds and/or `save_steps` steps, and at end.

  The Saver writes each file under a temporary name and renames it, and
  updates the `checkpoint` state file the same way, so a killed run never
  leaves a half-written latest checkpoint. The meta graph is written before
  the checkpoint (the Saver's own order writes it after the state file), so
  the state file never names a checkpoint without its .meta.
  """

  def __init__(self, saver, logdir, global_step, step_after, save_secs=None,
               save_steps=None, filename='model.ckpt', events=None):
    # `step_after` runs the training step: fetch it only with the train op;
    # `global_step` is the plain read for outside a step. `events`: the
    # run's EventsFile, which a run starting the logdir writes the graph to.
    self._saver = saver
    self._events = events
    self._global_step = global_step
    self._prefix = os.path.join(logdir, filename)
    self._logdir = logdir
    self._step_after = step_after
    self._save_secs = save_secs or None
    self._save_steps = save_steps or None
    self._last_step = None
    self._last_time = None
    self.last_checkpoint = None

  def after_create_session(self, session, coord):
    step = int(session.run(self._global_step))
    self._last_time = time.time()
    latest = checkpoint_state.latest(self._logdir)
    if latest is None:
      # Write the starting point (after init-from-checkpoint) and the graph
      # for TensorBoard.
      if self._events is not None:
        self._events.writer.flush()
      self._save(session, step)
    else:
      self._last_step = step
      self.last_checkpoint = latest

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._step_after)

  def after_run(self, run_context, run_values):
    step = int(run_values.results)
    due_steps = (self._save_steps is not None
                 and step - self._last_step >= self._save_steps)
    due_secs = (self._save_secs is not None
                and time.time() - self._last_time >= self._save_secs)
    if due_steps or due_secs:
      self._save(run_context.session, step)

  def end(self, session):
    # In an asynchronous cluster another worker may still finish a step
    # while the chief saves: the checkpoint then holds a later global step
    # than its name says. Save again under the step read after the save
    # until it stays put (workers stop at the last step, so it soon does).
    for _ in range(_END_SAVES):
      step = int(session.run(self._global_step))
      if step == self._last_step:
        return
      self._save(session, step)

  def save_now(self, session, step):
    """The checkpoint of `step`: the last one written when it is of that
    step, else a new one (for hooks after this one, e.g. validation)."""
    if step != self._last_step:
      self._save(session, step)
    return self.last_checkpoint

  def _save(self, session, step):
    path = '%s-%d' % (self._prefix, step)
    beyond = self._trim_rotation()
    try:
      with session.graph.as_default():
        self._saver.export_meta_graph(path + '.meta')
      self.last_checkpoint = self._saver.save(
          session, self._prefix, global_step=step, write_meta_graph=False)
    except (tf.errors.OpError, OSError) as e:
      if path != self.last_checkpoint:  # never a complete one
        remove_partial_checkpoint(path)
      raise CheckpointNotSavedError(path, write_error_reason(e),
                                    self.last_checkpoint) from e
    self._last_step = step
    self._last_time = time.time()
    logging.info('Saved checkpoint %s', self.last_checkpoint)
    if beyond:
      # Only now that the new checkpoint and the state file without them
      # are written.
      for prefix in beyond:
        tf.train.remove_checkpoint(prefix)
      logging.info('Removed %d older checkpoints (%s) to keep the last %d',
                   len(beyond), ', '.join(os.path.basename(p) for p in beyond),
                   self._saver.saver_def.max_to_keep)

  def _trim_rotation(self):
    """The saver's rotation cut to its newest max_to_keep checkpoints; the
    ones cut off, which the caller removes after the next save. A run
    resumed with a lower keep count than the run before it (or a state
    file rewritten to list every checkpoint on disk) recovers a longer
    list, and the saver drops one checkpoint a save: it never shrank."""
    keep = self._saver.saver_def.max_to_keep
    listed = self._saver.last_checkpoints
    if not keep or len(listed) <= keep:
      return []
    self._saver.recover_last_checkpoints(listed[-keep:])
    return listed[:-keep]


def write_error_reason(error):
  """The system's words in a failed write's error ('No space left on
  device', 'File too large'), else the error's first line. TensorFlow's
  read as '...; File too large' after a 'Graph execution error:' header."""
  text = getattr(error, 'message', None) or str(error)
  lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
  for line in reversed(lines):
    if '; ' in line:
      return line.rsplit('; ', 1)[1]
  return lines[0] if lines else type(error).__name__


# The temp name TensorFlow writes the `checkpoint` state file under.
_STATE_FILE_TEMP = re.compile(r'^checkpoint\.tmp[0-9a-f]{32}$')


def remove_partial_checkpoint(path):
  """Removes the files of checkpoint `path` (a prefix) that a failed save
  left: its data and index files, their temporary names, the sharded
  saver's `_temp` folder and the state file's temp (the save failed while
  naming it). Call only for a checkpoint the state file does not name,
  with the logdir's lock held (no other saver writes there)."""
  folder, name = os.path.split(path)
  for entry in os.listdir(folder or '.'):
    if (entry == name + '_temp' or entry.startswith(name + '.')
        or _STATE_FILE_TEMP.match(entry)):
      full = os.path.join(folder, entry)
      if os.path.isdir(full):
        for inner in os.listdir(full):
          os.remove(os.path.join(full, inner))
        os.rmdir(full)
      else:
        os.remove(full)


class ChromeTraceHook(tf.train.ProfilerHook):
  """TensorFlow's ProfilerHook (timeline-STEP.json, the Chrome trace of a
  step every `save_steps`), each trace written under a temp name and
  renamed: TensorFlow's opened the final name, then generated the trace
  into it, so a run killed meanwhile left an empty file under the name.
  A trace that cannot be written (a full disk) is logged; training goes on.
  """

  def _save(self, step, save_path, step_stats):
    # pylint: disable-next=g-import-not-at-top
    from tensorflow.python.client import timeline
    trace = timeline.Timeline(step_stats).generate_chrome_trace_format(
        show_dataflow=self._show_dataflow, show_memory=self._show_memory)
    try:
      atomic.write_bytes(save_path, trace.encode('utf-8'))
    except OSError as e:
      logging.warning('the trace of step %d was not written: %s', step, e)
      return
    logging.info('wrote the trace of step %d to %s', step, save_path)


class ProgressHook(tf.train.SessionRunHook):
  """Logs step, loss, learning rate, images/s and ETA every `every_n_steps`.

  Also keeps the last loss and step for the run's result, whether the
  session started, and when the step under way began (`step_began`, None
  between steps: its other hooks' work is not in it). In a synchronous cluster two of a fast worker's steps
  can make one update of the global step: that step is logged once.
  """

  def __init__(self, fetches, batch_size, last_step, every_n_steps,
               log_fn=logging.info):
    """fetches: {'loss': T, 'learning_rate': T, 'step': T (after update)}."""
    self._fetches = fetches
    self._batch_size = batch_size
    self._last_step = last_step
    self._every = every_n_steps
    self._log = log_fn
    self._mark = None
    self.loss = None
    self.step = None
    self.seconds_per_step = None
    self.in_session = False
    self.step_began = None
    # The longest step this process made (warm-up included), or None.
    self.longest_step = None

  def after_create_session(self, session, coord):
    self.in_session = True

  def before_run(self, run_context):
    self.step_began = time.time()
    return tf.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    took = time.time() - self.step_began
    self.longest_step = max(took, self.longest_step or 0.0)
    self.step_began = None
    r = run_values.results
    previous = self.step
    self.loss, self.step = float(r['loss']), int(r['step'])
    now = time.time()
    if self._mark is None:
      # The first step includes graph warm-up: time from its end.
      self._mark = (self.step, now)
      self._log(self._line(r, None))
      return
    if self.step == previous:
      return
    if self.step % self._every == 0 or self.step >= self._last_step:
      steps = self.step - self._mark[0]
      if steps > 0:
        self.seconds_per_step = (now - self._mark[1]) / steps
      self._mark = (self.step, now)
      self._log(self._line(r, self.seconds_per_step))

  def _line(self, r, sec_per_step):
    parts = ['step %d/%d' % (self.step, self._last_step),
             'loss %.4f' % self.loss,
             'lr %.3g' % float(r['learning_rate'])]
    if sec_per_step:
      eta = max(self._last_step - self.step, 0) * sec_per_step
      parts += ['%.3g s/step' % sec_per_step,
                '%.3g images/s' % (self._batch_size / sec_per_step),
                'ETA %s' % datetime.timedelta(seconds=int(round(eta)))]
    return '  '.join(parts)
