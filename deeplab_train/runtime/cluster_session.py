"""How a cluster task gets its session.

The chief's session restores the last checkpoint of the logdir (or
initialises the variables and runs the init-fn), then publishes the chief's
options on ps task 0 and beats there every few seconds. Another worker's
session waits until a beating chief has made the model ready and checks its
own options against the chief's: a worker started with other model,
training or input flags refuses to train (exit 2) instead of waiting for
ever for variables the chief never made, failing at its first step or
training on other input; the options a
stopped chief left on the ps neither refuse a worker nor let one in. A
training worker checks them again every few seconds (a chief restarted with
other options). Until its session exists, a task logs every 30 s what it
waits for.
"""
import contextlib
import json
import threading
import time

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.config import errors
from deeplab_train.model import registry

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
# Seconds between two heartbeats of the chief, written beside its options.
HEARTBEAT_SECS = 5
# A heartbeat older than this is a chief that stopped: its options are
# stale (ps tasks keep them after their chief ended). A worker refuses
# options that differ from its own once a live chief has held them this
# long (a chief stopped since cannot go on beating that long).
STALE_SECS = 3 * HEARTBEAT_SECS
# Differing options a refusal lists.
_MISMATCHES_SHOWN = 12


def run_options_text(model_options, train_options, cluster,
                     preprocess_options=None, dataset_name=None,
                     train_split=None):
  """The options every worker of a run must share, as JSON text keyed by
  'Owner.field' (the chief publishes it, see `ChiefOptions`); values that
  None leaves to a default are resolved.

  The input's options are shared too when given (`preprocess_options`, the
  dataset's name, the training split): a worker with another split or
  scale range trained on other input without a word. Not --dataset_dir,
  which may be each host's own copy.
  """
  # The host lists themselves: a worker given one host more than the chief
  # was told of --num_replicas, a flag it never gave.
  shared = {'ClusterOptions.sync_replicas': cluster.sync_replicas,
            'ClusterOptions.ps_hosts': list(cluster.ps_hosts),
            'ClusterOptions.worker_hosts': list(cluster.worker_hosts)}
  # The crop is the model's (ModelOptions.crop_size), listed once.
  for owner, options, skipped in (('ModelOptions', model_options, ()),
                                  ('TrainOptions', train_options,
                                   PER_MACHINE_FIELDS),
                                  ('PreprocessOptions', preprocess_options,
                                   ('crop_size',))):
    for name, value in (options.to_dict() if options else {}).items():
      if name not in skipped:
        shared['%s.%s' % (owner, name)] = value
  # Fields named as the command's messages name --dataset and --train_split.
  for key, value in (('load_dataset_info.name', dataset_name),
                     ('inputs.train_split', train_split)):
    if value is not None:
      shared[key] = value
  if train_options.weight_decay is None:
    shared['TrainOptions.weight_decay'] = registry.get(
        model_options.model_variant).default_weight_decay
  return json.dumps(shared, sort_keys=True)


def _shown(value):
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    return ','.join(_shown(v) for v in value)
  return 'unset' if value is None else json.dumps(value)


class ChiefOptions:
  """The chief's options and its heartbeat in variables on ps task 0.

  Outside every collection: no checkpoint, saver or readiness check sees
  them. The chief sets both once its session exists (`publish_op`), then
  beats every HEARTBEAT_SECS (`beat_op`, the ps task's clock). Another
  worker reads them while it waits for the model: it trains only with
  options equal to its own, published by a chief that beats, and refuses
  options that differ once a live chief held them for STALE_SECS. (A worker
  with another model variant waited for ever for variables the chief never
  made, one with another depth multiplier failed in its first step; the
  options of a chief that stopped, kept by the ps tasks, were neither to
  refuse a worker nor to let one in.)

  Args:
    text: this task's `run_options_text`.
  """

  def __init__(self, text):
    self.text = text
    with tf.device('/job:ps/task:0'):
      options = tf.Variable(text, trainable=False, collections=[],
                            name='deeplab_train_chief_options')
      beat = tf.Variable(tf.timestamp(), trainable=False, collections=[],
                         name='deeplab_train_chief_heartbeat')
      self.publish_op = tf.group(options.initializer, beat.initializer)
      self.beat_op = beat.assign(tf.timestamp()).op
      self._published = tf.logical_and(options.is_initialized(),
                                       beat.is_initialized())
      self._read = (options.read_value(), tf.timestamp() - beat.read_value())

  def chief(self, session):
    """(the chief's options text, seconds since its last heartbeat), or
    (None, None) before a chief published them."""
    if not session.run(self._published):
      return None, None
    text, age = session.run(self._read)
    return text.decode(), float(age)

  def differences(self, chief_text):
    """[('Owner.field', this task's value, the chief's)] that differ."""
    mine, chief = json.loads(self.text), json.loads(chief_text)
    return [(key, mine.get(key), chief.get(key))
            for key in sorted(set(mine) | set(chief))
            if mine.get(key) != chief.get(key)]

  def mismatch_error(self, differences, task, restarted=False):
    """The ConfigError of a worker whose options differ from the chief's
    (`restarted`: those of a chief restarted while the worker trained)."""
    template, values = _listed(differences)
    if restarted:
      what = ('the chief was restarted with options that differ from those '
              'of worker task %d, which trained beside it: ')
    else:
      what = ('worker task %d was started with options that differ from '
              'those of the chief, which trains: ')
    return ConfigError(
        what + template + ': start every worker with the flags of the chief, '
        'and those the deeplab_config.json of its logdir keeps from its first '
        'start (only {TrainOptions.num_clones}, '
        '{TrainOptions.mixed_precision} and the other per-machine settings '
        'may differ)', task, *values)


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
  ChiefSessionCreator does), its options then published on the ps, and its
  heartbeat written every `heartbeat_secs` by a thread until the session
  is closed."""

  def __init__(self, options, heartbeat_secs, **kwargs):
    super().__init__(**kwargs)
    self._options = options
    self._heartbeat_secs = heartbeat_secs

  def create_session(self):
    session = super().create_session()
    session.run(self._options.publish_op)
    threading.Thread(target=self._beat, args=(session,), daemon=True,
                     name='chief-heartbeat').start()
    return session

  def _beat(self, session):
    while True:
      time.sleep(self._heartbeat_secs)
      try:
        session.run(self._options.beat_op)
      except Exception:  # pylint: disable=broad-except
        return  # the session was closed (or the ps is gone): the run ended


class StoppedWhileWaiting(Exception):
  """A non-chief worker was asked to stop before its session existed: it
  had trained nothing and has nothing to save."""


class _WorkerSessionCreator(tf.train.SessionCreator):
  """A non-chief worker's session: waits until the chief made the model
  ready and, beating, published options equal to this worker's, checking
  every `recovery_wait_secs` in one session (SessionManager's
  wait_for_session opened a session at each check, and logged every missing
  variable each time). Sets `reached` once the ps answered; raises
  StoppedWhileWaiting when `should_stop()` turns true meanwhile."""

  def __init__(self, scaffold, master, config, options, task,
               max_wait_secs, recovery_wait_secs, stale_secs=STALE_SECS,
               reached=None, should_stop=None, finished=None):
    self._scaffold = scaffold
    self._finished = finished
    self._master = master
    self._config = config
    self._options = options
    self._task = task
    self._max_wait_secs = max_wait_secs
    self._recovery_wait_secs = recovery_wait_secs
    self._stale_secs = stale_secs
    self._reached = reached if reached is not None else threading.Event()
    self._should_stop = should_stop or (lambda: False)

  def _not_ready(self, session):
    """The variables not ready yet; runs the local init once the shared
    variables are."""
    scaffold = self._scaffold
    missing = session.run(scaffold.ready_for_local_init_op)
    if len(missing):  # pylint: disable=g-explicit-length-test
      return missing
    session.run(scaffold.local_init_op,
                feed_dict=scaffold.local_init_feed_dict)
    return session.run(scaffold.ready_op)

  def create_session(self):
    self._scaffold.finalize()
    logging.info('Waiting for the chief to initialise the model')
    session = tf.Session(self._master, graph=tf.get_default_graph(),
                         config=self._config)
    try:
      self._wait(session)
    except BaseException:
      session.close()
      raise
    return session

  def _wait(self, session):
    start = noticed = time.time()
    differing_since = None
    while True:
      if self._should_stop():
        raise StoppedWhileWaiting()
      text, age = self._options.chief(session)
      self._reached.set()
      live = age is not None and age < self._stale_secs
      differences = self._options.differences(text) if text else []
      missing = ()
      if text and not differences and (live or self._finished is not None):
        missing = self._not_ready(session)
        ready = not len(missing)  # pylint: disable=g-explicit-length-test
        # A stopped chief's model: only a finished run's is joined.
        if ready and (live or self._finished(session)):
          return
      now = time.time()
      if not (live and differences):
        differing_since = None
      elif differing_since is None:
        differing_since = now
        template, values = _listed(differences)
        logging.warning("The chief's options differ from this worker's (%s): "
                        'refusing to train in %g s if it still holds them',
                        errors.render(template) % tuple(values),
                        self._stale_secs)
      elif now - differing_since >= self._stale_secs:
        raise self._options.mismatch_error(differences, self._task)
      if now - noticed >= WAIT_NOTICE_SECS:
        noticed = now
        logging.info('Still waiting: %s', _waiting_for(text, age, live,
                                                       missing))
      if self._max_wait_secs is not None and now - start > self._max_wait_secs:
        raise tf.errors.DeadlineExceededError(
            None, None, 'the model was not ready after %d s'
            % self._max_wait_secs)
      time.sleep(self._recovery_wait_secs)


class ChiefOptionsHook(tf.train.SessionRunHook):
  """Keeps a training non-chief worker's options checked against the
  chief's, every `every_secs`: a chief restarted with other flags publishes
  other options, and the worker then raises the ConfigError of
  `ChiefOptions.mismatch_error` (it trained on, unchecked, beside the new
  chief). Options of a chief that stopped (no heartbeat for `stale_secs`)
  change nothing: the worker waits for the next chief as it did."""

  def __init__(self, options, task, every_secs=HEARTBEAT_SECS,
               stale_secs=STALE_SECS):
    self._options = options
    self._task = task
    self._every_secs = every_secs
    self._stale_secs = stale_secs
    self._checked = time.time()

  def after_run(self, run_context, run_values):
    if time.time() - self._checked < self._every_secs:
      return
    self._checked = time.time()
    text, age = self._options.chief(run_context.session)
    if text is None or age >= self._stale_secs:
      return
    differences = self._options.differences(text)
    if differences:
      raise self._options.mismatch_error(differences, self._task,
                                         restarted=True)


def _waiting_for(text, age, live, missing):
  """What a waiting worker waits for, in words."""
  if text is None:
    return 'no chief has published its options on the ps yet'
  if not live:
    return ('the options on the ps are those of a chief that stopped %.0f s '
            'ago; waiting for the chief of this run' % age)
  if len(missing):  # pylint: disable=g-explicit-length-test
    return ('the chief has not initialised %d variable(s) on the ps (e.g. %s)'
            % (len(missing), ', '.join(n.decode() for n in missing[:3])))
  return "the chief's options differ from this worker's"


# Seconds between two notices of a task still waiting for its session.
WAIT_NOTICE_SECS = 30


class _SessionCreated(tf.train.SessionRunHook):
  """Sets `event` once the session exists (the first hook to hear of it).

  Attributes:
    ps_reached: an Event a waiting worker's session creator sets once the
      ps answered (see `session_creator`): from then on the worker says
      itself what it waits for.
  """

  def __init__(self, event):
    self._event = event
    self.ps_reached = threading.Event()

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
  hook = _SessionCreated(created)
  if cluster is not None:
    others = 'the ps task(s) at %s' % ', '.join(cluster.ps_hosts)
    if not cluster.is_chief:
      others += ' and the chief at %s' % cluster.worker_hosts[0]
    this = ('the chief' if cluster.is_chief
            else 'worker task %d' % cluster.task)

    def notice():
      start = time.time()
      while not created.wait(every):
        if not hook.ps_reached.is_set():
          logging.warning('%s has waited %.0f s for %s: are they up and '
                          'reachable?', this, time.time() - start, others)
    threading.Thread(target=notice, name='wait-notice', daemon=True).start()
  try:
    yield hook
  finally:
    created.set()


def session_creator(cluster, scaffold, master, config, checkpoint_dir,
                    options, max_wait_secs=None,
                    recovery_wait_secs=RECOVERY_WAIT_SECS,
                    heartbeat_secs=HEARTBEAT_SECS, stale_secs=STALE_SECS,
                    waits=None, should_stop=None, finished=None):
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
    max_wait_secs: how long a non-chief waits for the chief (None: until
      `should_stop`, as a task waits for a ps that is gone; TensorFlow's
      SessionManager gave up after two hours with a traceback).
    recovery_wait_secs: seconds between its checks.
    heartbeat_secs: seconds between two heartbeats of the chief.
    stale_secs: a heartbeat older than this is a chief that stopped; a
      non-chief raises ConfigError once a live chief held options that
      differ from its own this long.
    waits: the hook `noticing_waits` yields, or None: a non-chief sets its
      `ps_reached` once the ps answered.
    should_stop: fn() -> true when the run is asked to stop: a non-chief
      still waiting then raises StoppedWhileWaiting.
    finished: fn(session) -> whether the run the ps hold is at its last
      step, or None: a non-chief then takes the model a stopped chief left
      with options equal to its own (its JoinHook ends it: nothing to do)
      rather than wait for a chief that will not come.
  """
  if cluster.is_chief:
    return _ChiefSessionCreator(
        options, heartbeat_secs, scaffold=scaffold, master=master,
        config=config, checkpoint_dir=checkpoint_dir)
  return _WorkerSessionCreator(
      scaffold, master, config, options, cluster.task, max_wait_secs,
      recovery_wait_secs, stale_secs,
      reached=waits.ps_reached if waits is not None else None,
      should_stop=should_stop, finished=finished)
