"""Which cluster this process belongs to: pure parsing and validation.

A cluster has parameter-server tasks (job 'ps') and worker tasks (job
'worker', task 0 the chief). It comes from the cluster options (ps_hosts,
worker_hosts, job_name, task: config.ClusterOptions) or from the TF_CONFIG environment
variable, whose conventions are:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"],
                 "ps": ["host2:2222"]},
     "task": {"type": "worker", "index": 0}}

A 'chief' (or its older name 'master') job becomes worker 0 here and the
'worker' tasks follow it (TF_CONFIG worker i is our worker i + 1); without a
'chief' job, worker 0 is the chief. `resolve` turns either source into a
`Cluster` (or None for a single-machine run) with every check done, so a bad
cluster fails before any graph or server exists. Nothing here starts a
server or touches TensorFlow (runtime/cluster.py does).
"""
import dataclasses
import json
import re
from typing import Tuple

from absl import logging

from deeplab_train.config import ConfigError

JOB_PS = 'ps'
JOB_WORKER = 'worker'
JOB_NAMES = (JOB_PS, JOB_WORKER)
TF_CONFIG = 'TF_CONFIG'
# TF_CONFIG task types and what they are here.
_CHIEF_TYPES = ('chief', 'master')
_EVALUATOR = 'evaluator'


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
    ConfigError: naming `where` (an option field or TF_CONFIG entry).
  """
  if not isinstance(value, str):
    raise ConfigError('%s: expected "host:port" strings, got %r' % (where, value))
  text = value.strip()
  if '://' in text:
    raise ConfigError('%s: %r is a URL; give host:port (e.g. 10.0.0.2:2222), '
                      'without %s' % (where, value, text.split('://')[0] +
                                      '://'))
  host, sep, port = text.rpartition(':')
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError('%s: %r is not host:port (e.g. 10.0.0.2:2222); every '
                      'task needs an address and a fixed port' % (where, value))
  if not _HOST.match(host):
    raise ConfigError('%s: %r is not one host:port (a host name, an IPv4 '
                      'address or an [IPv6] one); separate the tasks with '
                      'commas' % (where, value))
  return text


# A host name or IPv4 address, or an IPv6 address in brackets.
_HOST = re.compile(r'^([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])$')


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
  """(ps_hosts, worker_hosts, job_name, task) from the options, or None."""
  ps = _hosts(options.ps_hosts or (), '{ClusterOptions.ps_hosts}')
  workers = _hosts(options.worker_hosts or (), '{ClusterOptions.worker_hosts}')
  job = options.job_name or None
  if not (ps or workers or job):
    return None
  if not workers:
    raise ConfigError('{ClusterOptions.worker_hosts} is required for a '
                      'cluster (with {ClusterOptions.ps_hosts}, '
                      '{ClusterOptions.job_name} and {ClusterOptions.task}): '
                      'the host:port of every worker, the chief first')
  if job not in JOB_NAMES:
    raise ConfigError('{ClusterOptions.job_name} must be "ps" or "worker" in a '
                      'cluster, got %r' % job)
  return ps, workers, job, options.task


def _check(ps, workers, job, task, source):
  """Cross-checks of a cluster description; raises ConfigError."""
  hosts = ps if job == JOB_PS else workers
  where = ('{ClusterOptions.task}' if source == 'flags'
           else '%s task index' % TF_CONFIG)
  if not 0 <= task < len(hosts):
    raise ConfigError('%s=%d is out of range: the cluster has %d %s task(s) '
                      '(0..%d)' % (where, task, len(hosts), job, len(hosts) - 1))
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
                      'server ({ClusterOptions.ps_hosts}, or "ps" in %s) to '
                      'hold the shared '
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
      malformed addresses, options and TF_CONFIG disagreeing, num_replicas
      or num_ps_tasks contradicting the hosts, ...
  """
  options.validate()
  from_env = parse_tf_config(tf_config)
  if from_env and not (options.ps_hosts or options.worker_hosts):
    # The task's flags beside TF_CONFIG's cluster: --task=1 was ignored.
    _check_task_flags(options, from_env)
    from_flags = None
  else:
    from_flags = _from_flags(options)
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


def _check_task_flags(options, from_env):
  """Raises ConfigError when --job_name or --task (given without hosts)
  names another task than TF_CONFIG's."""
  _, _, job, task = from_env
  if ((options.job_name and options.job_name != job)
      or options.task not in (0, task)):
    raise ConfigError(
        '{ClusterOptions.job_name}=%s {ClusterOptions.task}=%d but %s says '
        'this is %s task %d; give one of them (or make them equal)'
        % (options.job_name or '(not given)', options.task, TF_CONFIG, job,
           task))


def _show(described):
  ps, workers, job, task = described
  return 'ps=%s worker=%s, this task %s %d' % (
      ','.join(ps) or '(none)', ','.join(workers), job, task)


def _check_without_cluster(options):
  need = ('needs a cluster: {ClusterOptions.worker_hosts}, '
          '{ClusterOptions.ps_hosts} and {ClusterOptions.job_name}, or the %s '
          'environment variable' % TF_CONFIG)
  for name, alone in (('task', (0,)), ('num_replicas', (None, 1)),
                      ('num_ps_tasks', (None, 0))):
    value = getattr(options, name)
    if value not in alone:
      raise ConfigError('{ClusterOptions.%s}=%d %s' % (name, value, need))


def _check_counts(options, ps, workers):
  for name, count, what in (('num_replicas', len(workers), 'worker(s)'),
                            ('num_ps_tasks', len(ps), 'ps task(s)')):
    value = getattr(options, name)
    if value is not None and value != count:
      raise ConfigError('{ClusterOptions.%s}=%d but the cluster has %d %s; '
                        'leave {ClusterOptions.%s} out (it follows the '
                        'cluster) or make them equal'
                        % (name, value, count, what, name))
