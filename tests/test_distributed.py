"""Training across machines: cluster parsing (fast) and real loopback clusters
of separate deeplab-train processes (slow).

The cluster tests start 1 ps + 2 workers on 127.0.0.1 ports chosen at run
time, train the tiny mobilenet_v2 on the sample records, and check what each
process did from its JSON result and its log. Every process runs in its own
process group and is killed by the fixture's finaliser, also when a test
fails; every wait has a timeout.
"""
import json

import pytest

from deeplab_train import config
from deeplab_train.train import cluster as cluster_lib

PS = ('127.0.0.1:2220',)
WORKERS = ('127.0.0.1:2221', '127.0.0.1:2222')


def _options(**kw):
  values = dict(ps_hosts=PS, worker_hosts=WORKERS, job_name='worker', task=0)
  values.update(kw)
  return config.ClusterOptions(**values)


def _tf_config(task_type, index, cluster=None):
  cluster = cluster or {'chief': [WORKERS[0]], 'worker': [WORKERS[1]],
                        'ps': list(PS)}
  return json.dumps({'cluster': cluster,
                     'task': {'type': task_type, 'index': index}})


# ---------------------------------------------------------------------------
# Parsing: flags.
# ---------------------------------------------------------------------------
def test_no_cluster_is_a_single_machine_run():
  assert cluster_lib.resolve(config.ClusterOptions()) is None
  assert cluster_lib.resolve(config.ClusterOptions(), '') is None
  # The original's defaults for its replica flags are a single machine too.
  assert cluster_lib.resolve(config.ClusterOptions(
      num_replicas=1, num_ps_tasks=0)) is None


def test_flags_describe_chief_worker_and_ps():
  chief = cluster_lib.resolve(_options())
  assert chief.is_chief and not chief.is_ps
  assert chief.num_workers == 2 and chief.num_ps == 1
  assert chief.spec() == {'worker': list(WORKERS), 'ps': list(PS)}
  assert chief.task_device == '/job:worker/task:0'
  assert chief.source == 'flags'
  worker = cluster_lib.resolve(_options(task=1))
  assert not worker.is_chief and worker.address == WORKERS[1]
  ps = cluster_lib.resolve(_options(job_name='ps'))
  assert ps.is_ps and not ps.is_chief and ps.address == PS[0]


def test_flag_hosts_are_stripped_and_empty_entries_dropped():
  c = cluster_lib.resolve(_options(worker_hosts=(' 127.0.0.1:2221', '',
                                                 '127.0.0.1:2222 ')))
  assert c.worker_hosts == WORKERS


def test_original_replica_flags_must_match_the_cluster():
  c = cluster_lib.resolve(_options(num_replicas=2, num_ps_tasks=1))
  assert c.num_workers == 2
  with pytest.raises(config.ConfigError, match='--num_replicas=3 but the '
                     'cluster has 2 worker'):
    cluster_lib.resolve(_options(num_replicas=3))
  with pytest.raises(config.ConfigError, match='--num_ps_tasks=2 but the '
                     'cluster has 1 ps'):
    cluster_lib.resolve(_options(num_ps_tasks=2))


@pytest.mark.parametrize('kw, message', [
    (dict(task=2), r'--task=2 is out of range: the cluster has 2 worker '
     r'task\(s\) \(0\.\.1\)'),
    (dict(job_name='ps', task=1), r'--task=1 is out of range: the cluster '
     r'has 1 ps task'),
    (dict(job_name='chief'), '--job_name must be "ps" or "worker"'),
    (dict(job_name=None), '--job_name must be "ps" or "worker"'),
    (dict(worker_hosts=()), '--worker_hosts is required'),
    (dict(worker_hosts=('127.0.0.1',)), r"--worker_hosts: '127.0.0.1' is not "
     r"host:port"),
    (dict(ps_hosts=('127.0.0.1:99999',)), "--ps_hosts: '127.0.0.1:99999' is "
     "not host:port"),
    (dict(ps_hosts=(WORKERS[1],)), 'address 127.0.0.1:2222 is given twice'),
    (dict(ps_hosts=()), 'a cluster of 2 workers needs at least one parameter '
     'server'),
    (dict(task=-1), '--task must be >= 0'),
    (dict(startup_delay_steps=-1), '--startup_delay_steps must be >= 0'),
])
def test_bad_flag_clusters_are_named(kw, message):
  with pytest.raises(config.ConfigError, match=message):
    cluster_lib.resolve(_options(**kw))


@pytest.mark.parametrize('kw, flag', [
    (dict(task=1), '--task=1'), (dict(num_replicas=2), '--num_replicas=2'),
    (dict(num_ps_tasks=1), '--num_ps_tasks=1')])
def test_replica_flags_without_a_cluster_are_refused(kw, flag):
  with pytest.raises(config.ConfigError, match=flag + ' needs a cluster'):
    cluster_lib.resolve(config.ClusterOptions(**kw))


def test_one_worker_without_ps_trains_locally():
  assert cluster_lib.resolve(_options(ps_hosts=(), worker_hosts=WORKERS[:1])
                             ) is None


def test_startup_delay_applies_to_asynchronous_workers_only():
  async_worker = cluster_lib.resolve(_options(task=1, sync_replicas=False,
                                              startup_delay_steps=15))
  assert async_worker.startup_step() == 15
  assert cluster_lib.resolve(_options(sync_replicas=False)).startup_step() == 0
  assert cluster_lib.resolve(_options(task=1)).startup_step() == 0


# ---------------------------------------------------------------------------
# Parsing: TF_CONFIG.
# ---------------------------------------------------------------------------
def test_tf_config_chief_is_worker_zero():
  none = config.ClusterOptions()
  chief = cluster_lib.resolve(none, _tf_config('chief', 0))
  assert chief.is_chief and chief.worker_hosts == WORKERS
  assert chief.source == 'TF_CONFIG'
  worker = cluster_lib.resolve(none, _tf_config('worker', 0))
  assert (worker.job_name, worker.task) == ('worker', 1)
  ps = cluster_lib.resolve(none, _tf_config('ps', 0))
  assert ps.is_ps and ps.task == 0
  # The older name of the chief.
  master = cluster_lib.resolve(none, _tf_config(
      'master', 0, {'master': [WORKERS[0]], 'worker': [WORKERS[1]],
                    'ps': list(PS)}))
  assert master.is_chief and master.worker_hosts == WORKERS


def test_tf_config_without_chief_makes_worker_zero_the_chief():
  cluster = {'worker': list(WORKERS), 'ps': list(PS)}
  c = cluster_lib.resolve(config.ClusterOptions(),
                          _tf_config('worker', 0, cluster))
  assert c.is_chief
  c = cluster_lib.resolve(config.ClusterOptions(),
                          _tf_config('worker', 1, cluster))
  assert c.task == 1 and not c.is_chief
  # Dense {index: address} maps are TensorFlow's other spelling.
  sparse = {'worker': {'1': WORKERS[1], '0': WORKERS[0]}, 'ps': list(PS)}
  c = cluster_lib.resolve(config.ClusterOptions(),
                          _tf_config('worker', 1, sparse))
  assert c.worker_hosts == WORKERS


def test_tf_config_without_cluster_is_a_single_machine_run():
  assert cluster_lib.resolve(config.ClusterOptions(), '{}') is None
  assert cluster_lib.resolve(config.ClusterOptions(),
                             json.dumps({'cluster': {}})) is None


@pytest.mark.parametrize('text, message', [
    ('{not json', 'TF_CONFIG is not valid JSON'),
    ('[1, 2]', 'TF_CONFIG must be a JSON object'),
    (_tf_config('worker', 1), r'TF_CONFIG task index 1 is out of range: the '
     r'cluster has 1 "worker" task\(s\) \(indices 0\.\.0\)'),
    (_tf_config('chief', 1), 'TF_CONFIG task index 1 is out of range'),
    (_tf_config('worker', -1), 'TF_CONFIG task index -1 is out of range'),
    (_tf_config('worker', '0'), 'TF_CONFIG task index must be an integer'),
    (_tf_config('boss', 0), "TF_CONFIG task type 'boss' is not a job of its "
     "cluster"),
    (_tf_config('evaluator', 0), 'run deeplab-eval'),
    (_tf_config('worker', 0, {'worker': list(WORKERS), 'ps': list(PS),
                              'trainer': ['127.0.0.1:1']}),
     r"unknown job\(s\) \['trainer'\]"),
    (_tf_config('chief', 0, {'chief': list(WORKERS), 'ps': list(PS)}),
     'exactly one chief address'),
    (_tf_config('ps', 0, {'ps': list(PS)}), 'no "worker" \\(or "chief"\\) '
     'task'),
    (_tf_config('worker', 0, {'worker': ['127.0.0.1'], 'ps': list(PS)}),
     "TF_CONFIG cluster.worker: '127.0.0.1' is not host:port"),
    (_tf_config('worker', 0, {'worker': '127.0.0.1:1', 'ps': list(PS)}),
     'TF_CONFIG cluster.worker must be a list'),
    (_tf_config('worker', 0, {'worker': {'0': WORKERS[0], '2': WORKERS[1]},
                              'ps': list(PS)}), 'without gaps'),
    (json.dumps({'cluster': {'worker': list(WORKERS), 'ps': list(PS)}}),
     'has a cluster but no "task"'),
    (json.dumps({'task': {'type': 'worker', 'index': 0}}),
     'has a task \\(worker\\) but no cluster'),
])
def test_bad_tf_config_is_named(text, message):
  with pytest.raises(config.ConfigError, match=message):
    cluster_lib.resolve(config.ClusterOptions(), text)


def test_flags_and_tf_config_must_agree():
  agreeing = cluster_lib.resolve(_options(task=1), _tf_config('worker', 0))
  assert agreeing.task == 1 and agreeing.source == 'flags and TF_CONFIG'
  with pytest.raises(config.ConfigError, match='the cluster flags and '
                     'TF_CONFIG disagree: flags say .*this task worker 0, '
                     'TF_CONFIG says .*this task worker 1'):
    cluster_lib.resolve(_options(task=0), _tf_config('worker', 0))
  with pytest.raises(config.ConfigError, match='disagree'):
    cluster_lib.resolve(_options(ps_hosts=('127.0.0.1:2229',)),
                        _tf_config('chief', 0))


def test_tf_config_counts_checked_against_replica_flags():
  with pytest.raises(config.ConfigError, match='--num_replicas=3'):
    cluster_lib.resolve(config.ClusterOptions(num_replicas=3),
                        _tf_config('chief', 0))


def test_session_config_sees_only_ps_and_this_worker():
  c = cluster_lib.resolve(_options(task=1))
  base = cluster_lib.tf.ConfigProto(allow_soft_placement=True)
  out = cluster_lib.session_config(c, base)
  assert list(out.device_filters) == ['/job:ps', '/job:worker/task:1']
  assert out.allow_soft_placement
  assert not base.device_filters  # the base is left alone
