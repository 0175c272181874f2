"""Training across machines on TensorFlow's distributed runtime.

A cluster has parameter-server tasks (job 'ps': they hold the variables and
serve until killed) and worker tasks (job 'worker': each builds the same
training graph, towers and all, and runs it against its own gRPC server).
Worker 0 is the chief: it initialises the variables (or restores the last
checkpoint of the logdir, or runs the init-fn), writes checkpoints and
summaries and holds the logdir lock; the other workers wait until the chief
made the model ready, then train.

The cluster comes from flags (--ps_hosts, --worker_hosts, --job_name,
--task) or from the TF_CONFIG environment variable, whose conventions are:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"],
                 "ps": ["host2:2222"]},
     "task": {"type": "worker", "index": 0}}

A 'chief' (or its older name 'master') job becomes worker 0 here and the
'worker' tasks follow it (TF_CONFIG worker i is our worker i + 1); without a
'chief' job, worker 0 is the chief. `resolve` turns either source into a
`Cluster` (or None for a single-machine run) with every check done, so a bad
cluster fails before any graph or server exists.

Synchronous training wraps the optimizer in `SyncReplicasOptimizer`
(gradients of all workers averaged into each update); asynchronous training
(`sync_replicas=False`) lets each worker update the shared variables on its
own, and worker i waits for global step i * startup_delay_steps first, as
the original DeepLab did, so the replicas do not all start from the same
weights.
"""
import dataclasses
import json
import signal
import threading
import time
from typing import Optional, Tuple

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.train import lock as lock_lib

JOB_PS = 'ps'
JOB_WORKER = 'worker'
JOB_NAMES = (JOB_PS, JOB_WORKER)
TF_CONFIG = 'TF_CONFIG'
# TF_CONFIG task types and what they are here.
_CHIEF_TYPES = ('chief', 'master')
_EVALUATOR = 'evaluator'
# Seconds between two checks of a waiting non-chief worker (TensorFlow's
# default is 30, which makes every join slow).
RECOVERY_WAIT_SECS = 0.5
# Seconds between two global-step reads while waiting for a start step.
_POLL_SECS = 0.5
# Lock file of a non-chief worker in a logdir it shares with the chief.
WORKER_LOCK_FILENAME = '.deeplab-train.worker-%d.lock'
# Seconds a closing cluster session gives the threads registered with its
# coordinator (TensorFlow's default is 120; none of ours should need any).
STOP_GRACE_SECS = 3


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A validated cluster and this process's place in it.

  Attributes:
    ps_hosts: 'host:port' of each parameter-server task.
    worker_hosts: 'host:port' of each worker task (task 0: the chief).
    job_name: 'ps' or 'worker'.
    task: this process's index in its job.
    sync_replicas: synchronous updates (SyncReplicasOptimizer).
    startup_delay_steps: asynchronous mode: worker i starts training at
      global step i * startup_delay_steps.
    source: where the cluster came from ('flags', 'TF_CONFIG' or both).
  """
  ps_hosts: Tuple[str, ...]
  worker_hosts: Tuple[str, ...]
  job_name: str
  task: int
  sync_replicas: bool = True
  startup_delay_steps: int = 0
  source: str = 'flags'

  @property
  def num_workers(self):
    return len(self.worker_hosts)

  @property
  def num_ps(self):
    return len(self.ps_hosts)

  @property
  def is_ps(self):
    return self.job_name == JOB_PS

  @property
  def is_chief(self):
    return self.job_name == JOB_WORKER and self.task == 0

  @property
  def task_device(self):
    """This task's device prefix, e.g. '/job:worker/task:1'."""
    return '/job:%s/task:%d' % (self.job_name, self.task)

  @property
  def address(self):
    hosts = self.ps_hosts if self.is_ps else self.worker_hosts
    return hosts[self.task]

  def spec(self):
    """{'ps': [...], 'worker': [...]} (no 'ps' job without ps tasks)."""
    out = {JOB_WORKER: list(self.worker_hosts)}
    if self.ps_hosts:
      out[JOB_PS] = list(self.ps_hosts)
    return out

  def startup_step(self):
    """Global step this worker waits for before its first step."""
    if self.sync_replicas or self.is_ps:
      return 0
    return self.task * self.startup_delay_steps

  def describe(self):
    role = 'chief' if self.is_chief else self.job_name
    return ('%s task %d of %d ps + %d workers (%s, %s; from %s)'
            % (role, self.task, self.num_ps, self.num_workers, self.address,
               'synchronous' if self.sync_replicas else 'asynchronous',
               self.source))


# ---------------------------------------------------------------------------
# Parsing and validation.
# ---------------------------------------------------------------------------
def parse_host(value, where):
  """'host:port' with a port in 1..65535, returned stripped.

  Raises:
    ConfigError: naming `where` (a flag or TF_CONFIG entry).
  """
  if not isinstance(value, str):
    raise ConfigError('%s: expected "host:port" strings, got %r' % (where, value))
  text = value.strip()
  host, sep, port = text.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError('%s: %r is not host:port (e.g. 10.0.0.2:2222); every '
                      'task needs an address and a fixed port' % (where, value))
  return text


def _hosts(values, where):
  """Parsed 'host:port' entries of a list (empty entries dropped)."""
  return tuple(parse_host(v, where) for v in values if str(v).strip())


def _job_list(cluster, job):
  """The address list of `job` in a TF_CONFIG cluster dict."""
  value = cluster.get(job, [])
  where = '%s cluster.%s' % (TF_CONFIG, job)
  if isinstance(value, dict):
    # TensorFlow also accepts {index: address}; only dense ones make sense.
    try:
      items = sorted((int(k), v) for k, v in value.items())
    except ValueError:
      raise ConfigError('%s: task indices must be integers, got %s'
                        % (where, sorted(value))) from None
    if [k for k, _ in items] != list(range(len(items))):
      raise ConfigError('%s: task indices must be 0..%d without gaps, got %s'
                        % (where, len(items) - 1, [k for k, _ in items]))
    value = [v for _, v in items]
  if not isinstance(value, list):
    raise ConfigError('%s must be a list of "host:port", got %r'
                      % (where, value))
  return _hosts(value, where)


def parse_tf_config(text):
  """The cluster described by a TF_CONFIG value.

  Args:
    text: the JSON string of the TF_CONFIG environment variable.

  Returns:
    (ps_hosts, worker_hosts, job_name, task) in this module's terms (the
    chief is worker 0), or None when TF_CONFIG names no cluster.

  Raises:
    ConfigError: malformed JSON, unknown job or task type, index out of
      range, an evaluator task.
  """
  if text is None or not text.strip():
    return None
  try:
    payload = json.loads(text)
  except ValueError as e:
    raise ConfigError('%s is not valid JSON (%s): expected {"cluster": '
                      '{...}, "task": {"type": ..., "index": ...}}'
                      % (TF_CONFIG, e)) from None
  if not isinstance(payload, dict):
    raise ConfigError('%s must be a JSON object with "cluster" and "task"'
                      % TF_CONFIG)
  cluster = payload.get('cluster') or {}
  task = payload.get('task') or {}
  if not isinstance(cluster, dict) or not isinstance(task, dict):
    raise ConfigError('%s: "cluster" and "task" must be JSON objects'
                      % TF_CONFIG)
  task_type = task.get('type')
  if task_type == _EVALUATOR:
    raise ConfigError(
        '%s task type "evaluator": deeplab-train does not evaluate; run '
        'deeplab-eval --checkpoint_dir=TRAIN_LOGDIR --eval_interval_secs=... '
        'on that host instead' % TF_CONFIG)
  if not cluster:
    if task_type:
      raise ConfigError('%s has a task (%s) but no cluster: add "cluster": '
                        '{"worker": [...], "ps": [...]}' % (TF_CONFIG, task_type))
    return None
  known = set(_CHIEF_TYPES) | {JOB_WORKER, JOB_PS, _EVALUATOR}
  unknown = sorted(set(cluster) - known)
  if unknown:
    raise ConfigError('%s cluster has unknown job(s) %s: deeplab-train knows '
                      '"chief" (or "master"), "worker" and "ps"'
                      % (TF_CONFIG, unknown))
  chiefs = {t: _job_list(cluster, t) for t in _CHIEF_TYPES if t in cluster}
  if len(chiefs) > 1 or any(len(h) != 1 for h in chiefs.values()):
    raise ConfigError('%s cluster: give exactly one chief address, in "chief" '
                      '(or "master", not both)' % TF_CONFIG)
  chief_hosts = next(iter(chiefs.values()), ())
  workers = chief_hosts + _job_list(cluster, JOB_WORKER)
  ps = _job_list(cluster, JOB_PS)
  if not workers:
    raise ConfigError('%s cluster has no "worker" (or "chief") task'
                      % TF_CONFIG)
  if task_type is None:
    raise ConfigError('%s has a cluster but no "task": {"type": "worker", '
                      '"index": 0} says which task this process is'
                      % TF_CONFIG)
  index = task.get('index', 0)
  if not isinstance(index, int) or isinstance(index, bool):
    raise ConfigError('%s task index must be an integer, got %r'
                      % (TF_CONFIG, index))
  sizes = {t: len(h) for t, h in chiefs.items()}
  sizes[JOB_WORKER] = len(workers) - len(chief_hosts)
  sizes[JOB_PS] = len(ps)
  if task_type not in sizes:
    raise ConfigError('%s task type %r is not a job of its cluster (%s)'
                      % (TF_CONFIG, task_type, ', '.join(sorted(cluster))))
  if not 0 <= index < sizes[task_type]:
    raise ConfigError('%s task index %d is out of range: the cluster has %d '
                      '"%s" task(s) (indices 0..%d)'
                      % (TF_CONFIG, index, sizes[task_type], task_type,
                         sizes[task_type] - 1))
  if task_type in _CHIEF_TYPES:
    return ps, workers, JOB_WORKER, 0
  if task_type == JOB_WORKER:
    return ps, workers, JOB_WORKER, index + len(chief_hosts)
  return ps, workers, JOB_PS, index


def _from_flags(options):
  """(ps_hosts, worker_hosts, job_name, task) from the flags, or None."""
  ps = _hosts(options.ps_hosts or (), '--ps_hosts')
  workers = _hosts(options.worker_hosts or (), '--worker_hosts')
  job = options.job_name or None
  if not (ps or workers or job):
    return None
  if not workers:
    raise ConfigError('--worker_hosts is required for a cluster (with '
                      '--ps_hosts, --job_name and --task): the host:port of '
                      'every worker, the chief first')
  if job not in JOB_NAMES:
    raise ConfigError('--job_name must be "ps" or "worker" in a cluster, got '
                      '%r' % job)
  return ps, workers, job, options.task


def _check(ps, workers, job, task, source):
  """Cross-checks of a cluster description; raises ConfigError."""
  hosts = ps if job == JOB_PS else workers
  flag = ('--task' if source == 'flags'
          else '%s task index' % TF_CONFIG)
  if not 0 <= task < len(hosts):
    raise ConfigError('%s=%d is out of range: the cluster has %d %s task(s) '
                      '(0..%d)' % (flag, task, len(hosts), job, len(hosts) - 1))
  seen = {}
  for name, group in ((JOB_PS, ps), (JOB_WORKER, workers)):
    for i, host in enumerate(group):
      if host in seen:
        raise ConfigError('%s: address %s is given twice (%s and %s task %d);'
                          ' every task needs its own port'
                          % (source, host, seen[host], name, i))
      seen[host] = '%s task %d' % (name, i)
  if len(workers) > 1 and not ps:
    raise ConfigError('a cluster of %d workers needs at least one parameter '
                      'server (--ps_hosts, or "ps" in %s) to hold the shared '
                      'variables' % (len(workers), TF_CONFIG))


def resolve(options, tf_config=None):
  """The cluster of this run from its options and TF_CONFIG.

  Args:
    options: config.ClusterOptions (the flags).
    tf_config: the TF_CONFIG environment variable's value, or None.

  Returns:
    A `Cluster`, or None when this is a single-machine run (no cluster flags
    and no cluster in TF_CONFIG, or a cluster of one worker and no ps).

  Raises:
    ConfigError: a bad cluster: task index out of range, unknown job name,
      malformed addresses, flags and TF_CONFIG disagreeing, --num_replicas
      or --num_ps_tasks contradicting the hosts, ...
  """
  options.validate()
  from_flags = _from_flags(options)
  from_env = parse_tf_config(tf_config)
  if from_flags and from_env and from_flags != from_env:
    raise ConfigError(
        'the cluster flags and %s disagree: flags say %s, %s says %s; give '
        'one of them (or make them equal)'
        % (TF_CONFIG, _show(from_flags), TF_CONFIG, _show(from_env)))
  if from_flags and from_env:
    source = 'flags and %s' % TF_CONFIG
  else:
    source = 'flags' if from_flags else TF_CONFIG
  described = from_flags or from_env
  if described is None:
    _check_without_cluster(options)
    return None
  ps, workers, job, task = described
  _check(ps, workers, job, task, source)
  _check_counts(options, ps, workers)
  if len(workers) == 1 and not ps:
    logging.info('The cluster (%s) is one worker without parameter servers: '
                 'training on this machine alone', source)
    return None
  return Cluster(ps_hosts=ps, worker_hosts=workers, job_name=job, task=task,
                 sync_replicas=options.sync_replicas,
                 startup_delay_steps=options.startup_delay_steps,
                 source=source)


def _show(described):
  ps, workers, job, task = described
  return 'ps=%s worker=%s, this task %s %d' % (
      ','.join(ps) or '(none)', ','.join(workers), job, task)


def _check_without_cluster(options):
  need = ('needs a cluster: --worker_hosts, --ps_hosts and --job_name, or the '
          '%s environment variable' % TF_CONFIG)
  if options.task:
    raise ConfigError('--task=%d %s' % (options.task, need))
  if options.num_replicas not in (None, 1):
    raise ConfigError('--num_replicas=%d %s' % (options.num_replicas, need))
  if options.num_ps_tasks not in (None, 0):
    raise ConfigError('--num_ps_tasks=%d %s' % (options.num_ps_tasks, need))


def _check_counts(options, ps, workers):
  if options.num_replicas is not None and options.num_replicas != len(workers):
    raise ConfigError('--num_replicas=%d but the cluster has %d worker(s); '
                      'leave --num_replicas out (it follows the cluster) or '
                      'make them equal' % (options.num_replicas, len(workers)))
  if options.num_ps_tasks is not None and options.num_ps_tasks != len(ps):
    raise ConfigError('--num_ps_tasks=%d but the cluster has %d ps task(s); '
                      'leave --num_ps_tasks out (it follows the cluster) or '
                      'make them equal' % (options.num_ps_tasks, len(ps)))


# ---------------------------------------------------------------------------
# Servers, devices, sessions.
# ---------------------------------------------------------------------------
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
    raise ConfigError(
        'cannot start the %s task %d server on %s (%s): is the port in use, '
        'maybe by another task started with the same --task?'
        % (cluster.job_name, cluster.task, cluster.address,
           e.message.strip().splitlines()[0])) from None
  logging.info('Started %s; server %s', cluster.describe(), server.target)
  return server


def serve(cluster, server=None):
  """Runs a parameter server: starts it (unless given) and never returns.

  Call from the main thread: Ctrl-C then ends the process at once (the
  server's join never hands control back to Python, so a Python handler
  would never run).
  """
  server = server or start_server(cluster)
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  logging.info('Parameter server %d serving on %s until killed',
               cluster.task, cluster.address)
  server.join()


def variables_device(cluster):
  """Device function putting variables on the ps tasks, round robin."""
  return tf.train.replica_device_setter(
      ps_tasks=cluster.num_ps, ps_device='/job:ps',
      worker_device=cluster.task_device)


def session_config(cluster, base=None):
  """`base` (a ConfigProto) restricted to this worker and the ps tasks.

  Without the filter a session would wait for every task of the cluster to
  be up, and a worker could not (re)join once another worker has exited.
  """
  config = tf.ConfigProto()
  if base is not None:
    config.CopyFrom(base)
  del config.device_filters[:]
  config.device_filters.extend(['/job:ps', cluster.task_device])
  return config


class _WorkerSessionCreator(tf.train.SessionCreator):
  """A non-chief worker's session: waits until the chief made the model
  ready, checking every `recovery_wait_secs`."""

  def __init__(self, scaffold, master, config, max_wait_secs,
               recovery_wait_secs):
    self._scaffold = scaffold
    self._master = master
    self._config = config
    self._max_wait_secs = max_wait_secs
    self._recovery_wait_secs = recovery_wait_secs

  def create_session(self):
    self._scaffold.finalize()
    manager = tf.train.SessionManager(
        local_init_op=self._scaffold.local_init_op,
        local_init_feed_dict=self._scaffold.local_init_feed_dict,
        ready_op=self._scaffold.ready_op,
        ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
        graph=tf.get_default_graph(),
        recovery_wait_secs=self._recovery_wait_secs)
    logging.info('Waiting for the chief to initialise the model')
    return manager.wait_for_session(self._master, config=self._config,
                                    max_wait_secs=self._max_wait_secs)


def session_creator(cluster, scaffold, master, config, checkpoint_dir,
                    max_wait_secs=7200, recovery_wait_secs=RECOVERY_WAIT_SECS):
  """The session creator of a worker (use in tf.train.MonitoredSession).

  The chief restores the last checkpoint of `checkpoint_dir` (or initialises
  the variables and runs the scaffold's init_fn); the others wait for it.

  Args:
    cluster: a Cluster (a worker).
    scaffold: the training graph's tf.train.Scaffold.
    master: the worker's `server.target`.
    config: its session ConfigProto (see `session_config`).
    checkpoint_dir: the train logdir.
    max_wait_secs: how long a non-chief waits for the chief.
    recovery_wait_secs: seconds between its checks.
  """
  if cluster.is_chief:
    return tf.train.ChiefSessionCreator(
        scaffold=scaffold, master=master, config=config,
        checkpoint_dir=checkpoint_dir)
  return _WorkerSessionCreator(scaffold, master, config, max_wait_secs,
                               recovery_wait_secs)


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
    while not coord.should_stop():
      try:
        session.run(self._apply_op)
      except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
        return  # the session or the queue was closed: the run is over
      except Exception as e:  # pylint: disable=broad-except
        coord.request_stop(e)
        return

  def end(self, session):
    if not self._is_chief:
      return
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
