"""How a cluster task gets its session.

The chief's session restores the last checkpoint of the logdir (or
initialises the variables and runs the init-fn), then publishes the chief's
options on ps task 0. Another worker's session waits until the chief has
made the model ready and checks its own options against the chief's: a
worker started with other model or training flags refuses to train (exit
2) instead of waiting for ever for variables the chief never made or
failing at its first step. Until its session exists, a task logs every 30
s which tasks it waits for.
"""
import contextlib
import json
import threading
import time

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import errors

# Seconds between two checks of a waiting non-chief worker (TensorFlow's
# default is 30, which makes every join slow).
RECOVERY_WAIT_SECS = 0.5


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


# ---------------------------------------------------------------------------
# The chief's options, which every other worker checks its own against.
# ---------------------------------------------------------------------------
# TrainOptions fields each machine may set for itself: its towers, its
# speed settings, its augmentation seed, and what only the chief reads.
PER_MACHINE_FIELDS = ('num_clones', 'clone_on_cpu', 'mixed_precision',
                      'use_xla', 'intra_op_parallelism_threads',
                      'inter_op_parallelism_threads', 'seed',
                      'tf_initial_checkpoint', 'initialize_last_layer',
                      'allow_partial_initial_checkpoint',
                      'save_summaries_images')
# Seconds a worker waits while the chief's options differ from its own
# before it refuses to train: ps tasks kept from an earlier run still hold
# that run's options until its restarted chief publishes its own.
MISMATCH_GRACE_SECS = 30
# Differing options a refusal lists.
_MISMATCHES_SHOWN = 6


def run_options_text(model_options, train_options, cluster):
  """The options every worker of a run must share, as JSON text keyed by
  'Owner.field' (the chief publishes it, see `ChiefOptions`)."""
  shared = {'ClusterOptions.sync_replicas': cluster.sync_replicas}
  for owner, options, skipped in (('ModelOptions', model_options, ()),
                                  ('TrainOptions', train_options,
                                   PER_MACHINE_FIELDS)):
    for name, value in options.to_dict().items():
      if name not in skipped:
        shared['%s.%s' % (owner, name)] = value
  return json.dumps(shared, sort_keys=True)


def _shown(value):
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    return ','.join(_shown(v) for v in value)
  return 'unset' if value is None else json.dumps(value)


class ChiefOptions:
  """The chief's options in a string variable on ps task 0.

  Outside every collection: no checkpoint, saver or readiness check sees
  it. The chief sets it once its session exists (`publish_op`); another
  worker reads it while it waits for the model and before its first step,
  and refuses to train with options that differ (a worker with another
  model variant waited for ever for variables the chief never made, and
  one with another depth multiplier failed in its first step).

  Args:
    text: this task's `run_options_text`.
  """

  def __init__(self, text):
    self.text = text
    with tf.device('/job:ps/task:0'):
      variable = tf.Variable(text, trainable=False, collections=[],
                             name='deeplab_train_chief_options')
      self.publish_op = variable.initializer
      self._published = variable.is_initialized()
      self._value = variable.read_value()

  def chief_text(self, session):
    """The chief's options text, or None before the chief published it."""
    if not session.run(self._published):
      return None
    return session.run(self._value).decode()

  def differences(self, chief_text):
    """[('Owner.field', this task's value, the chief's)] that differ."""
    mine, chief = json.loads(self.text), json.loads(chief_text)
    return [(key, mine.get(key), chief.get(key))
            for key in sorted(set(mine) | set(chief))
            if mine.get(key) != chief.get(key)]

  def mismatch_error(self, differences, task):
    """The ConfigError of a worker whose options differ from the chief's."""
    template, values = _listed(differences)
    return ConfigError(
        'worker task %d was started with options that differ from the '
        "chief's: " + template + ': start every worker with the flags of '
        'the chief (only {TrainOptions.num_clones}, '
        '{TrainOptions.mixed_precision} and the other per-machine settings '
        'may differ). If the ps tasks still held the options of an earlier '
        'run, start this worker again once the chief of this run trains',
        task, *values)


def _listed(differences):
  """(template, values) listing differing options, each as its field."""
  shown = differences[:_MISMATCHES_SHOWN]
  template = '; '.join('{%s}=%%s here, %%s on the chief' % key
                       for key, _, _ in shown)
  values = []
  for _, mine, chief in shown:
    values += [_shown(mine), _shown(chief)]
  if len(differences) > len(shown):
    template += '; and %d more' % (len(differences) - len(shown))
  return template, values


class _ChiefSessionCreator(tf.train.ChiefSessionCreator):
  """The chief's session (restored, initialised or init-fn'd as
  ChiefSessionCreator does), its options then published on the ps."""

  def __init__(self, options, **kwargs):
    super().__init__(**kwargs)
    self._options = options

  def create_session(self):
    session = super().create_session()
    session.run(self._options.publish_op)
    return session


class _WorkerSessionCreator(tf.train.SessionCreator):
  """A non-chief worker's session: waits until the chief made the model
  ready and published options equal to this worker's, checking every
  `recovery_wait_secs` (SessionManager.wait_for_session's checks, without
  its log line of every missing variable at each check)."""

  def __init__(self, scaffold, master, config, options, task,
               max_wait_secs, recovery_wait_secs,
               mismatch_grace_secs=MISMATCH_GRACE_SECS):
    self._scaffold = scaffold
    self._master = master
    self._config = config
    self._options = options
    self._task = task
    self._max_wait_secs = max_wait_secs
    self._recovery_wait_secs = recovery_wait_secs
    self._grace_secs = mismatch_grace_secs

  def _model_ready(self, session):
    """Runs the local init once the shared variables are ready; true when
    the model is ready."""
    scaffold = self._scaffold
    if len(session.run(scaffold.ready_for_local_init_op)):  # pylint: disable=g-explicit-length-test
      return False
    session.run(scaffold.local_init_op,
                feed_dict=scaffold.local_init_feed_dict)
    return not len(session.run(scaffold.ready_op))  # pylint: disable=g-explicit-length-test

  def create_session(self):
    self._scaffold.finalize()
    graph = tf.get_default_graph()
    logging.info('Waiting for the chief to initialise the model')
    start = time.time()
    differing_since = None
    while True:
      session = tf.Session(self._master, graph=graph, config=self._config)
      try:
        chief = self._options.chief_text(session)
        differences = self._options.differences(chief) if chief else []
        if not differences and chief and self._model_ready(session):
          return session
      except BaseException:
        session.close()
        raise
      session.close()
      now = time.time()
      if not differences:
        differing_since = None
      elif differing_since is None:
        differing_since = now
        template, values = _listed(differences)
        logging.warning("The chief's options differ from this worker's (%s): "
                        'refusing to train in %d s unless they agree by then',
                        errors.render(template) % tuple(values),
                        self._grace_secs)
      elif now - differing_since >= self._grace_secs:
        raise self._options.mismatch_error(differences, self._task)
      if now - start > self._max_wait_secs:
        raise tf.errors.DeadlineExceededError(
            None, None, 'the model was not ready after %d s'
            % self._max_wait_secs)
      time.sleep(self._recovery_wait_secs)


# Seconds between two notices of a task still waiting for its session.
WAIT_NOTICE_SECS = 30


class _SessionCreated(tf.train.SessionRunHook):
  """Sets `event` once the session exists (the first hook to hear of it)."""

  def __init__(self, event):
    self._event = event

  def after_create_session(self, session, coord):
    self._event.set()


@contextlib.contextmanager
def noticing_waits(cluster, every=WAIT_NOTICE_SECS):
  """Yields a hook to put first in the session's hooks; until the session
  is created (or the block ends), logs every `every` seconds that this task
  is still waiting for the other tasks. A chief waiting for a ps that is not
  up said nothing (TensorFlow's own notice is an INFO line of its C++ log,
  which TF_CPP_MIN_LOG_LEVEL=2 hides). Nothing is logged for a
  single-machine run (`cluster` None)."""
  created = threading.Event()
  if cluster is not None:
    others = 'the ps task(s) at %s' % ', '.join(cluster.ps_hosts)
    if not cluster.is_chief:
      others += ' and the chief at %s' % cluster.worker_hosts[0]
    this = ('the chief' if cluster.is_chief
            else 'worker task %d' % cluster.task)

    def notice():
      start = time.time()
      while not created.wait(every):
        logging.warning('%s has waited %.0f s for %s: are they up and '
                        'reachable?', this, time.time() - start, others)
    threading.Thread(target=notice, name='wait-notice', daemon=True).start()
  try:
    yield _SessionCreated(created)
  finally:
    created.set()


def session_creator(cluster, scaffold, master, config, checkpoint_dir,
                    options, max_wait_secs=7200,
                    recovery_wait_secs=RECOVERY_WAIT_SECS,
                    mismatch_grace_secs=MISMATCH_GRACE_SECS):
  """The session creator of a worker (use in tf.train.MonitoredSession).

  The chief restores the last checkpoint of `checkpoint_dir` (or initialises
  the variables and runs the scaffold's init_fn), then publishes its
  options; the others wait for it, and refuse options that differ.

  Args:
    cluster: a Cluster (a worker).
    scaffold: the training graph's tf.train.Scaffold.
    master: the worker's `server.target`.
    config: its session ConfigProto (see `session_config`).
    checkpoint_dir: the train logdir.
    options: the ChiefOptions of this task, in the training graph.
    max_wait_secs: how long a non-chief waits for the chief.
    recovery_wait_secs: seconds between its checks.
    mismatch_grace_secs: how long a non-chief waits while the chief's
      options differ from its own before it raises ConfigError.
  """
  if cluster.is_chief:
    return _ChiefSessionCreator(
        options, scaffold=scaffold, master=master, config=config,
        checkpoint_dir=checkpoint_dir)
  return _WorkerSessionCreator(scaffold, master, config, options,
                               cluster.task, max_wait_secs,
                               recovery_wait_secs, mismatch_grace_secs)
