"""Training across machines on TensorFlow's distributed runtime.

Parameter-server tasks hold the variables and serve until stopped; worker
tasks each build the same training graph, towers and all, and run it
against their own gRPC server. Worker 0 is the chief: it initialises the
variables (or restores the last checkpoint of the logdir, or runs the
init-fn), publishes its options on the ps, writes checkpoints and summaries
and holds the logdir lock; the other workers wait until the chief made the
model ready, check their options against its own, then train (the sessions:
cluster_session.py). Which
task this process is comes from runtime/cluster_spec.py.

Synchronous training wraps the optimizer in `SyncReplicasOptimizer`
(gradients of all workers averaged into each update); asynchronous training
(`sync_replicas=False`) lets each worker update the shared variables on its
own, and worker i waits for global step i * startup_delay_steps first, as
the original DeepLab did, so the replicas do not all start from the same
weights.
"""
import signal
import threading
import time

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.runtime import lock as lock_lib

# Seconds between two global-step reads while waiting for a start step.
_POLL_SECS = 0.5
# Lock file of a non-chief worker in a logdir it shares with the chief.
WORKER_LOCK_FILENAME = '.deeplab-train.worker-%d.lock'
# Seconds a closing cluster session gives the threads registered with its
# coordinator (TensorFlow's default is 120; none of ours should need any).
STOP_GRACE_SECS = 3


def lock_filename(cluster):
  """The logdir lock file of this task.

  The chief (and a single-machine run) takes the logdir lock: one run per
  logdir. Another worker takes a lock of its own task only, so workers can
  share the chief's logdir while two processes started as the same task
  still fail fast.
  """
  if cluster is None or cluster.is_chief:
    return lock_lib.LOCK_FILENAME
  return WORKER_LOCK_FILENAME % cluster.task


def start_server(cluster, config=None):
  """Starts this task's gRPC server.

  Args:
    cluster: a Cluster.
    config: tf.ConfigProto, default of the sessions the server runs.

  Returns:
    The started tf.train.Server (`server.target` is the session master).

  Raises:
    ConfigError: the server cannot listen on this task's port.
  """
  spec = tf.train.ClusterSpec(cluster.spec())
  try:
    server = tf.train.Server(spec, job_name=cluster.job_name,
                             task_index=cluster.task, config=config,
                             start=True)
  except (tf.errors.UnknownError, tf.errors.InvalidArgumentError) as e:
    given_by = ('{ClusterOptions.task}' if cluster.source == 'flags'
                else 'task in %s' % cluster.source)
    raise ConfigError(
        'cannot start the %s task %d server on %s (%s): is the port in use, '
        'maybe by another task started with the same ' + given_by + '?',
        cluster.job_name, cluster.task, cluster.address,
        e.message.strip().splitlines()[0]) from None
  logging.info('Started %s; server %s', cluster.describe(), server.target)
  return server


def serve(cluster, server=None):
  """Runs a parameter server: starts it (unless given) and never returns.

  The server's join never hands control back to Python, so a Python signal
  handler would never run: a caller that ends the process on a signal does
  so from another thread (deeplab-train's signals.py), and without one
  SIGINT ends the process at once.
  """
  server = server or start_server(cluster)
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
  logging.info('Parameter server %d serving on %s until stopped',
               cluster.task, cluster.address)
  server.join()


def variables_device(cluster):
  """Device function putting variables on the ps tasks, round robin."""
  return tf.train.replica_device_setter(
      ps_tasks=cluster.num_ps, ps_device='/job:ps',
      worker_device=cluster.task_device)


# ---------------------------------------------------------------------------
# Optimizer and hooks.
# ---------------------------------------------------------------------------
def wrap_optimizer(optimizer, cluster):
  """The optimizer of a cluster worker: SyncReplicasOptimizer around
  `optimizer` in synchronous mode (each update averages one gradient of
  every worker), `optimizer` itself in asynchronous mode."""
  if cluster is None or not cluster.sync_replicas:
    return optimizer
  return tf.train.SyncReplicasOptimizer(
      optimizer, replicas_to_aggregate=cluster.num_workers,
      total_num_replicas=cluster.num_workers)


def optimizer_hooks(optimizer, cluster, global_step, last_step):
  """Hooks a wrapped optimizer needs (see SyncReplicasHook)."""
  if isinstance(optimizer, tf.train.SyncReplicasOptimizer):
    return [SyncReplicasHook(optimizer, cluster.is_chief, global_step,
                             last_step)]
  return []


def without_steps(optimizer):
  """For a session of the training graph that runs no step (a chief with
  nothing to do): its synchronous set-up goes unused, which TensorFlow
  would log as an error ('Object was never used') when the graph goes."""
  if isinstance(optimizer, tf.train.SyncReplicasOptimizer):
    optimizer.ready_for_local_init_op.mark_used()


class SyncReplicasHook(tf.train.SessionRunHook):
  """Session set-up of synchronous training.

  Every worker initialises its local step; the chief also puts the first
  tokens in the queue and runs, in a thread, the op that waits for the
  workers' gradients, applies their average and hands out the tokens of the
  next step (what SyncReplicasOptimizer's own hook does with a queue runner,
  whose thread ends in a traceback at every normal exit).

  When the chief stops before the last step (time budget, signal), it closes
  the token queue: the workers waiting for their next token then stop too
  ('chief_stopped') instead of waiting for ever. A chief that finished keeps
  the queue open, so the same ps tasks can serve a longer run later.

  Args:
    optimizer: the SyncReplicasOptimizer (apply_gradients already called).
    is_chief: this worker is the chief.
    global_step: the global step variable.
    last_step: the step the run stops at.
  """

  def __init__(self, optimizer, is_chief, global_step, last_step):
    self._optimizer = optimizer
    self._is_chief = is_chief
    self._global_step = global_step
    self._last_step = last_step
    self._thread = None
    self._stopping = threading.Event()

  def begin(self):
    opt = self._optimizer
    self._not_ready_op = opt.ready_for_local_init_op
    if self._is_chief:
      runner = opt.get_chief_queue_runner()
      self._local_init_op = opt.chief_init_op
      self._init_tokens_op = opt.get_init_tokens_op()
      self._apply_op = runner.enqueue_ops[0]
      self._close_queue_op = runner.cancel_op
    else:
      self._local_init_op = opt.local_step_init_op

  def after_create_session(self, session, coord):
    # The session creators made the shared variables ready; a name listed
    # here would be a bug, not a user error.
    not_ready = session.run(self._not_ready_op)
    if len(not_ready):  # pylint: disable=g-explicit-length-test
      raise RuntimeError('variables not initialised before the synchronous '
                         'set-up: %s' % ', '.join(
                             n.decode() for n in not_ready[:5]))
    session.run(self._local_init_op)
    if not self._is_chief:
      return
    try:
      session.run(self._init_tokens_op)
    except tf.errors.CancelledError:
      raise ConfigError(
          'the parameter servers still hold a synchronous run that its chief '
          'stopped early (its token queue is closed): restart the ps tasks, '
          'then the workers; the run resumes from the last checkpoint'
      ) from None
    self._thread = threading.Thread(
        target=self._apply_loop, args=(session, coord), daemon=True,
        name='sync-replicas-apply')
    self._thread.start()

  def _apply_loop(self, session, coord):
    # No apply step starts once the chief stops. Closing the session
    # cancels the step waiting for gradients; but a step that has only just
    # reached the ps can miss that cancellation (TensorFlow's gRPC worker
    # service drops a cancellation that comes before the step's handler
    # listens for one), and the close would then wait for it for ever.
    while not coord.should_stop() and not self._stopping.is_set():
      try:
        session.run(self._apply_op)
      except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
        return  # the session or the queue was closed: the run is over
      except Exception as e:  # pylint: disable=broad-except
        coord.request_stop(e)
        return

  def after_run(self, run_context, run_values):
    # Stopping here (a signal, the time budget; this hook comes after
    # those): the queue is closed before the final checkpoint is saved
    # (CheckpointHook.end), so that the other workers' updates, which the
    # apply thread would go on making, do not move the step it saves.
    if self._is_chief and run_context.stop_requested:
      self._stop(run_context.session)

  def end(self, session):
    if self._is_chief:
      self._stop(session)

  def _stop(self, session):
    """Starts no more apply steps; before the last step, also stops the
    other workers. Once: the first call (at the last step's after_run, or
    at the end) decides."""
    if self._stopping.is_set():
      return
    self._stopping.set()
    step = int(session.run(self._global_step))
    if step < self._last_step:
      logging.info('Stopping before the last step: closing the token queue '
                   'so the other workers stop too')
      session.run(self._close_queue_op)


class JoinHook(tf.train.SessionRunHook):
  """Holds a worker back until its start step; stops it before its first
  step when the run is already finished.

  A non-chief worker that joins (or rejoins) after the chief reached the last
  step would otherwise run one more step, and in synchronous mode wait for
  ever for the other replicas' gradients.

  Args:
    global_step: the global step variable.
    last_step: the step the run stops at.
    start_step: wait until the global step reaches it (asynchronous
      start-up delay); 0 for none.
    poll_secs: seconds between two reads of the global step.
  """

  def __init__(self, global_step, last_step, start_step=0,
               poll_secs=_POLL_SECS):
    self._global_step = global_step
    self._last_step = last_step
    self._start_step = start_step
    self._poll_secs = poll_secs
    # The global step when the run was found finished at joining, or None.
    self.finished_step = None

  def after_create_session(self, session, coord):
    step = int(session.run(self._global_step))
    logged = None
    while step < min(self._start_step, self._last_step):
      if logged is None or time.time() - logged > 30:
        logging.info('Waiting for global step %d to start (now at %d)',
                     self._start_step, step)
        logged = time.time()
      time.sleep(self._poll_secs)
      step = int(session.run(self._global_step))
    if step >= self._last_step:
      logging.info('The run is already at step %d (last step %d): nothing '
                   'to do for this worker', step, self._last_step)
      self.finished_step = step
      coord.request_stop()
    else:
      logging.info('Joining the run at global step %d (last step %d)', step,
                   self._last_step)
