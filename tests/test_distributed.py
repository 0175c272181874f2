"""Training across machines: cluster parsing (fast) and real loopback clusters
of separate deeplab-train processes (slow).

The cluster tests start 1 ps + 2 workers on 127.0.0.1 ports chosen at run
time, train the tiny mobilenet_v2 on the sample records, and check what each
process did from its JSON result and its log. Every process runs in its own
process group and is killed by the fixture's finaliser, also when a test
fails; every wait has a timeout. Over 400 lines on purpose: parsing and
the loopback clusters describe one feature, and the clusters' helpers
(LocalCluster, the process fixture) are a third of the file.
"""
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import train as train_cli
from deeplab_train.runtime import cluster as cluster_lib
from deeplab_train.runtime import cluster_session
from deeplab_train.runtime import cluster_spec
from deeplab_train.train import graph as graph_lib
from deeplab_train.runtime import lock as lock_lib

import timeouts
import train_testing as tt

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
  assert cluster_spec.resolve(config.ClusterOptions()) is None
  assert cluster_spec.resolve(config.ClusterOptions(), '') is None
  # The original's defaults for its replica flags are a single machine too.
  assert cluster_spec.resolve(config.ClusterOptions(
      num_replicas=1, num_ps_tasks=0)) is None


def test_flags_describe_chief_worker_and_ps():
  chief = cluster_spec.resolve(_options())
  assert chief.is_chief and not chief.is_ps
  assert chief.num_workers == 2 and chief.num_ps == 1
  assert chief.spec() == {'worker': list(WORKERS), 'ps': list(PS)}
  assert chief.task_device == '/job:worker/task:0'
  assert chief.source == 'flags'
  worker = cluster_spec.resolve(_options(task=1))
  assert not worker.is_chief and worker.address == WORKERS[1]
  ps = cluster_spec.resolve(_options(job_name='ps'))
  assert ps.is_ps and not ps.is_chief and ps.address == PS[0]


def test_flag_hosts_are_stripped_and_empty_entries_dropped():
  c = cluster_spec.resolve(_options(worker_hosts=(' 127.0.0.1:2221', '',
                                                 '127.0.0.1:2222 ')))
  assert c.worker_hosts == WORKERS


def test_original_replica_flags_must_match_the_cluster():
  c = cluster_spec.resolve(_options(num_replicas=2, num_ps_tasks=1))
  assert c.num_workers == 2
  with pytest.raises(config.ConfigError, match='num_replicas=3 but the '
                     'cluster has 2 worker'):
    cluster_spec.resolve(_options(num_replicas=3))
  with pytest.raises(config.ConfigError, match='num_ps_tasks=2 but the '
                     'cluster has 1 ps'):
    cluster_spec.resolve(_options(num_ps_tasks=2))


@pytest.mark.parametrize('kw, message', [
    (dict(task=2), r'task=2 is out of range: the cluster has 2 worker '
     r'task\(s\) \(0\.\.1\)'),
    (dict(job_name='ps', task=1), r'task=1 is out of range: the cluster '
     r'has 1 ps task'),
    (dict(job_name='chief'), 'job_name must be "ps" or "worker"'),
    (dict(job_name=None), 'job_name must be "ps" or "worker"'),
    (dict(worker_hosts=()), 'worker_hosts is required'),
    (dict(worker_hosts=('127.0.0.1',)), r"worker_hosts: '127.0.0.1' is not "
     r"host:port"),
    (dict(ps_hosts=('127.0.0.1:99999',)), "ps_hosts: '127.0.0.1:99999' is "
     "not host:port"),
    # Taken before as one host '127.0.0.1:23002;127.0.0.1' (the task hung),
    # and as a port in use (exit 2 after the server's start failed).
    (dict(worker_hosts=('127.0.0.1:23002;127.0.0.1:23003',)),
     "worker_hosts: '127.0.0.1:23002;127.0.0.1:23003' is not one host:port "
     r".*separate the tasks with commas"),
    (dict(ps_hosts=('grpc://127.0.0.1:2223',)), "ps_hosts: "
     "'grpc://127.0.0.1:2223' is a URL; give host:port .* without grpc://"),
    (dict(ps_hosts=(WORKERS[1],)), 'address 127.0.0.1:2222 is given twice'),
    (dict(ps_hosts=()), 'a cluster of 2 workers needs at least one parameter '
     'server'),
    (dict(task=-1), 'task must be >= 0'),
    (dict(startup_delay_steps=-1), 'startup_delay_steps must be >= 0'),
])
def test_bad_flag_clusters_are_named(kw, message):
  with pytest.raises(config.ConfigError, match=message):
    cluster_spec.resolve(_options(**kw))


@pytest.mark.parametrize('kw, flag', [
    (dict(task=1), 'task=1'), (dict(num_replicas=2), 'num_replicas=2'),
    (dict(num_ps_tasks=1), 'num_ps_tasks=1')])
def test_replica_flags_without_a_cluster_are_refused(kw, flag):
  with pytest.raises(config.ConfigError, match=flag + ' needs a cluster'):
    cluster_spec.resolve(config.ClusterOptions(**kw))


def test_one_worker_without_ps_trains_locally():
  assert cluster_spec.resolve(_options(ps_hosts=(), worker_hosts=WORKERS[:1])
                             ) is None


def test_startup_delay_applies_to_asynchronous_workers_only():
  async_worker = cluster_spec.resolve(_options(task=1, sync_replicas=False,
                                              startup_delay_steps=15))
  assert async_worker.startup_step() == 15
  assert cluster_spec.resolve(_options(sync_replicas=False)).startup_step() == 0
  assert cluster_spec.resolve(_options(task=1)).startup_step() == 0


# ---------------------------------------------------------------------------
# Parsing: TF_CONFIG.
# ---------------------------------------------------------------------------
def test_tf_config_chief_is_worker_zero():
  none = config.ClusterOptions()
  chief = cluster_spec.resolve(none, _tf_config('chief', 0))
  assert chief.is_chief and chief.worker_hosts == WORKERS
  assert chief.source == 'TF_CONFIG'
  worker = cluster_spec.resolve(none, _tf_config('worker', 0))
  assert (worker.job_name, worker.task) == ('worker', 1)
  ps = cluster_spec.resolve(none, _tf_config('ps', 0))
  assert ps.is_ps and ps.task == 0
  # The older name of the chief.
  master = cluster_spec.resolve(none, _tf_config(
      'master', 0, {'master': [WORKERS[0]], 'worker': [WORKERS[1]],
                    'ps': list(PS)}))
  assert master.is_chief and master.worker_hosts == WORKERS


def test_tf_config_without_chief_makes_worker_zero_the_chief():
  cluster = {'worker': list(WORKERS), 'ps': list(PS)}
  c = cluster_spec.resolve(config.ClusterOptions(),
                          _tf_config('worker', 0, cluster))
  assert c.is_chief
  c = cluster_spec.resolve(config.ClusterOptions(),
                          _tf_config('worker', 1, cluster))
  assert c.task == 1 and not c.is_chief
  # Dense {index: address} maps are TensorFlow's other spelling.
  sparse = {'worker': {'1': WORKERS[1], '0': WORKERS[0]}, 'ps': list(PS)}
  c = cluster_spec.resolve(config.ClusterOptions(),
                          _tf_config('worker', 1, sparse))
  assert c.worker_hosts == WORKERS


def test_task_flags_beside_tf_config_must_name_its_task():
  """--task=1 beside TF_CONFIG's chief was ignored (the process ran as the
  chief); --job_name and --task naming its own task are accepted."""
  with pytest.raises(config.ConfigError, match=(
      r'job_name=\(not given\) task=1 but TF_CONFIG says this is worker '
      r'task 0; give one of them')):
    cluster_spec.resolve(config.ClusterOptions(task=1),
                         _tf_config('chief', 0))
  with pytest.raises(config.ConfigError, match='job_name=ps task=0 but'):
    cluster_spec.resolve(config.ClusterOptions(job_name='ps'),
                         _tf_config('chief', 0))
  worker = cluster_spec.resolve(
      config.ClusterOptions(job_name='worker', task=1),
      _tf_config('worker', 0))
  assert (worker.job_name, worker.task) == ('worker', 1)


def test_tf_config_without_cluster_is_a_single_machine_run():
  assert cluster_spec.resolve(config.ClusterOptions(), '{}') is None
  assert cluster_spec.resolve(config.ClusterOptions(),
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
    cluster_spec.resolve(config.ClusterOptions(), text)


def test_flags_and_tf_config_must_agree():
  agreeing = cluster_spec.resolve(_options(task=1), _tf_config('worker', 0))
  assert agreeing.task == 1 and agreeing.source == 'flags and TF_CONFIG'
  with pytest.raises(config.ConfigError, match='the cluster flags and '
                     'TF_CONFIG disagree: flags say .*this task worker 0, '
                     'TF_CONFIG says .*this task worker 1'):
    cluster_spec.resolve(_options(task=0), _tf_config('worker', 0))
  with pytest.raises(config.ConfigError, match='disagree'):
    cluster_spec.resolve(_options(ps_hosts=('127.0.0.1:2229',)),
                        _tf_config('chief', 0))


def test_tf_config_counts_checked_against_replica_flags():
  with pytest.raises(config.ConfigError, match='num_replicas=3'):
    cluster_spec.resolve(config.ClusterOptions(num_replicas=3),
                        _tf_config('chief', 0))


def test_session_config_sees_only_ps_and_this_worker():
  c = cluster_spec.resolve(_options(task=1))
  base = tf.ConfigProto(allow_soft_placement=True)
  out = cluster_session.session_config(c, base)
  assert list(out.device_filters) == ['/job:ps', '/job:worker/task:1']
  assert out.allow_soft_placement
  assert not base.device_filters  # the base is left alone



def test_a_port_in_use_is_named_with_the_task_option():
  """The server cannot listen: the message names the option (a command
  shows it as its flag, --task), not a flag, from the library."""
  from deeplab_train.cli import app  # pylint: disable=g-import-not-at-top
  with socket.socket() as taken:
    taken.bind(('127.0.0.1', 0))
    taken.listen(1)
    address = '127.0.0.1:%d' % taken.getsockname()[1]
    cluster = cluster_spec.resolve(_options(worker_hosts=(address,
                                                          WORKERS[1])))
    with pytest.raises(config.ConfigError) as error:
      cluster_lib.start_server(cluster)
  assert str(error.value).startswith(
      'cannot start the worker task 0 server on %s (' % address)
  assert str(error.value).endswith(
      'is the port in use, maybe by another task started with the same '
      'task?')
  assert app.user_message(error.value).endswith('the same --task?')
  # Given by TF_CONFIG, the message named a flag that was not used.
  from_env = cluster_spec.resolve(config.ClusterOptions(), json.dumps({
      'cluster': {'worker': [address, WORKERS[1]], 'ps': list(PS)},
      'task': {'type': 'worker', 'index': 0}}))
  with socket.socket() as taken:
    taken.bind(('127.0.0.1', int(address.rsplit(':', 1)[1])))
    taken.listen(1)
    with pytest.raises(config.ConfigError) as error:
      cluster_lib.start_server(from_env)
  assert app.user_message(error.value).endswith(
      'started with the same task in TF_CONFIG?')

# ---------------------------------------------------------------------------
# Device placement of the training graph (no server needed).
# ---------------------------------------------------------------------------
def _cluster_graph(task, sync, num_ps=2):
  c = cluster_spec.resolve(_options(
      task=task, sync_replicas=sync,
      ps_hosts=tuple('127.0.0.1:%d' % (2230 + i) for i in range(num_ps))))
  images, labels = tt.synthetic_batch(2, 17)
  train = config.TrainOptions(train_batch_size=2, num_clones=2,
                              clone_on_cpu=True).validate()
  g = graph_lib.build_training_graph(
      tt.tiny_model_options(crop=17), train, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels),
      model_fn=tt.toy_model_fn(), last_layer_scopes=['logits'],
      graph_device=cluster_lib.variables_device(c),
      wrap_optimizer=lambda opt: cluster_lib.wrap_optimizer(opt, c))
  # No session runs it here.
  cluster_lib.without_steps(g.optimizer)
  return c, g


def _job_task(device):
  spec = tf.DeviceSpec.from_string(device)
  return spec.job, spec.task


def test_cluster_graph_puts_variables_on_ps_and_compute_on_the_worker():
  _, g = _cluster_graph(task=1, sync=True)
  variables = g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
  places = {v.op.name: _job_task(v.device) for v in variables}
  assert places['global_step'][0] == 'ps'
  # Weights, BN statistics and momentum slots all live on the ps tasks, and
  # round robin uses both of them.
  assert {job for job, _ in places.values()} == {'ps'}, places
  assert {task for _, task in places.values()} == {0, 1}
  # The sync optimizer's local step is this worker's own.
  local = g.graph.get_collection(tf.GraphKeys.LOCAL_VARIABLES)
  assert [_job_task(v.device) for v in local
          if 'local_step' in v.op.name] == [('worker', 1)]
  # Every computation (both towers, gradient averaging) runs on worker 1,
  # on the CPU devices the trainer asked for; so do the checkpoint writes
  # and reads (files on the chief's host).
  ops = g.graph.get_operations()
  compute = [op for op in ops
             if op.name.startswith(('tower_', 'average_gradients'))
             and op.colocation_groups() == [b'loc:@' + op.name.encode()]
             and op.type not in ('VarHandleOp', 'ReadVariableOp')]
  assert len(compute) > 100
  for op in compute:
    assert _job_task(op.device) == ('worker', 1), (op.name, op.device)
  saves = [op for op in ops if op.type in ('SaveV2', 'RestoreV2')]
  assert len(saves) == 2
  assert {_job_task(op.device) for op in saves} == {('worker', 1)}
  tower1 = [op for op in g.graph.get_operations()
            if op.name.startswith('tower_1/') and
            op.type in ('Conv2D', 'MatMul')]
  assert tower1 and all('CPU:0' in op.device for op in tower1)
  assert isinstance(g.optimizer, tf.train.SyncReplicasOptimizer)


def test_asynchronous_cluster_keeps_the_plain_optimizer():
  _, g = _cluster_graph(task=0, sync=False, num_ps=1)
  assert isinstance(g.optimizer, tf.train.MomentumOptimizer)
  variables = g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
  assert {_job_task(v.device) for v in variables} == {('ps', 0)}


def test_worker_lock_files_are_per_task():
  assert cluster_lib.lock_filename(None) == lock_lib.LOCK_FILENAME
  assert cluster_lib.lock_filename(cluster_spec.resolve(_options())) == (
      lock_lib.LOCK_FILENAME)
  assert cluster_lib.lock_filename(cluster_spec.resolve(_options(task=1))) == (
      '.deeplab-train.worker-1.lock')


def test_cli_refuses_a_bad_cluster_with_exit_2(tmp_path):
  env = dict(tt.subprocess_env(), TF_CONFIG=_tf_config('worker', 0))
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.train',
       '--train_logdir=%s' % tmp_path, '--dataset_dir=%s' % tmp_path,
       '--ps_hosts=%s' % PS[0], '--worker_hosts=%s' % ','.join(WORKERS),
       '--job_name=worker', '--task=0'],
      capture_output=True, text=True, env=env, cwd=str(tt.REPO), timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['status'] == 'bad_input'
  assert 'the cluster flags and TF_CONFIG disagree' in result['message']
  assert 'Traceback' not in proc.stderr


# ---------------------------------------------------------------------------
# JoinHook: start-up delay and late joiners (a local session suffices).
# ---------------------------------------------------------------------------
def _join(start_at, last_step, start_step, later=None):
  """Runs JoinHook.after_create_session with the global step at `start_at`
  (set to `later` 0.3 s afterwards when given); returns (hook, stopped)."""
  graph = tf.Graph()
  with graph.as_default():
    step = tf.train.get_or_create_global_step()
    value = tf.placeholder(tf.int64)
    assign = step.assign(value)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(assign, {value: start_at})
      timer = None
      if later is not None:
        timer = threading.Timer(0.3, lambda: sess.run(assign, {value: later}))
        timer.start()
      hook = cluster_lib.JoinHook(step, last_step, start_step, poll_secs=0.05)
      coord = tf.train.Coordinator()
      started = time.time()
      hook.after_create_session(sess, coord)
      hook.waited = time.time() - started
      if timer is not None:
        # The hook can see the new step before the timer's run returns:
        # closing the session under that run would cancel it.
        timer.join()
      return hook, coord.should_stop()


def test_a_task_waiting_for_its_session_says_so_until_it_has_one(caplog):
  """A chief waiting for a ps that is not up logged nothing of its own."""
  chief = cluster_spec.resolve(_options())
  with caplog.at_level('WARNING'):
    with cluster_session.noticing_waits(chief, every=0.05) as created:
      time.sleep(0.3)
      created.after_create_session(None, None)
      waited = caplog.text.count('has waited')
      time.sleep(0.2)
  assert waited >= 2
  assert caplog.text.count('has waited') == waited   # none once created
  assert ('the chief has waited 0 s for the ps task(s) at 127.0.0.1:2220: '
          'are they up and reachable?') in caplog.text
  caplog.clear()
  worker = cluster_spec.resolve(_options(task=1))
  with caplog.at_level('WARNING'):
    with cluster_session.noticing_waits(worker, every=0.05):
      time.sleep(0.2)
  assert ('worker task 1 has waited 0 s for the ps task(s) at 127.0.0.1:2220 '
          'and the chief at 127.0.0.1:2221') in caplog.text


def _options_graph(cluster, names, model=None, **train):
  """A graph of float variables `names` placed as a cluster task places
  them, its Scaffold, and the ChiefOptions of `model` / TrainOptions."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.device(cluster_lib.variables_device(cluster)):
      for name in names:
        tf.Variable(1.0, name=name)
    options = cluster_session.ChiefOptions(cluster_session.run_options_text(
        model or tt.tiny_model_options(),
        config.TrainOptions(**dict({'train_batch_size': 2}, **train)), cluster))
    return graph, tf.train.Scaffold(), options


def _first_variable(graph):
  return graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)[0]


def test_a_worker_with_options_other_than_the_chiefs_refuses_to_train(
    tmp_path):
  """In-process ps, chief and worker servers. Before, a worker with another
  model variant waited for ever for variables the chief never made, and one
  with another depth multiplier failed in its first step with a shape
  error; one with another batch size trained. The options a stopped chief
  left on the ps must neither refuse a worker nor let one in."""
  from deeplab_train.cli import app  # pylint: disable=g-import-not-at-top
  hosts = ['127.0.0.1:%d' % port for port in free_ports(3)]
  tasks = [cluster_spec.resolve(_options(ps_hosts=hosts[:1],
                                         worker_hosts=hosts[1:], **kw))
           for kw in ({'job_name': 'ps'}, {'task': 0}, {'task': 1})]
  servers = [cluster_lib.start_server(task) for task in tasks]
  _, chief, worker = tasks
  stale = 0.6

  def create(task, graph, scaffold, options, **waiting):
    creator = cluster_session.session_creator(
        task, scaffold, servers[tasks.index(task)].target,
        cluster_session.session_config(task), str(tmp_path), options,
        max_wait_secs=timeouts.HANG_SECONDS, recovery_wait_secs=0.05,
        heartbeat_secs=0.1, stale_secs=stale, **waiting)
    with graph.as_default():
      return creator.create_session()

  def start_worker(waiting=None, **train):
    """Creates a worker's session in a thread: {'session' or 'error'}."""
    graph, scaffold, options = _options_graph(worker, ['w'], **train)
    out = {'graph': graph, 'options': options}

    def run():
      try:
        out['session'] = create(worker, graph, scaffold, options,
                                **(waiting or {}))
      except (config.ConfigError, cluster_session.StoppedWhileWaiting) as e:
        out['error'] = e
    out['thread'] = threading.Thread(target=run, daemon=True)
    out['thread'].start()
    return out

  # A worker that starts first waits for the chief to publish its options.
  # Asked to stop meanwhile, it stops (a SIGTERM ended it only after a 5 s
  # grace, exit 143, its result speaking of checkpoints). Once the ps
  # answered, the worker says itself what it waits for: 'are they up and
  # reachable?' came every 30 s beside it.
  stop = threading.Event()
  with cluster_session.noticing_waits(worker) as waits:
    stopping = start_worker({'waits': waits, 'should_stop': stop.is_set})
    early = start_worker()
    # (A fixed 0.5 s sleep was too short on a loaded machine.)
    assert waits.ps_reached.wait(timeout=timeouts.HANG_SECONDS)
    stop.set()
    stopping['thread'].join(timeout=timeouts.HANG_SECONDS)
  assert isinstance(stopping.get('error'),
                    cluster_session.StoppedWhileWaiting)
  assert 'session' not in early
  chief_session = create(chief, *_options_graph(chief, ['w']))
  early['thread'].join(timeout=timeouts.HANG_SECONDS)
  assert early['session'].run(_first_variable(early['graph'])) == 1.0
  # While it trains, it checks the chief's options again after its steps.
  check = cluster_session.ChiefOptionsHook(early['options'], 1, every_secs=0,
                                           stale_secs=stale)
  step_ended = tf.train.SessionRunContext(None, early['session'])
  check.after_run(step_ended, None)

  # Per-machine settings may differ.
  graph, scaffold, options = _options_graph(
      worker, ['w'], num_clones=2, mixed_precision='bf16', seed=3)
  session = create(worker, graph, scaffold, options)
  assert session.run(_first_variable(graph)) == 1.0

  # Another batch size: the model is ready, and still refused.
  start = time.time()
  with pytest.raises(config.ConfigError) as error:
    create(worker, *_options_graph(worker, ['w'], train_batch_size=4))
  assert time.time() - start >= stale  # what a chief stopped cannot beat
  assert app.user_message(error.value) == (
      'worker task 1 was started with options that differ from those of the '
      "chief, which trains: --train_batch_size=4 here, 2 on the chief: start "
      'every worker with the flags of the chief, and those the '
      'deeplab_config.json of its logdir keeps from its first start (only '
      '--num_clones, '
      '--mixed_precision and the other per-machine settings may differ)')

  # Another model: variables the chief never made.
  other = config.ModelOptions(
      num_classes=tt.NUM_CLASSES, model_variant='xception_65',
      crop_size=(33, 33), output_stride=16, depth_multiplier=0.5).validate()
  with pytest.raises(config.ConfigError) as error:
    create(worker, *_options_graph(worker, ['w', 'entry_flow/w'], other))
  assert ('--depth_multiplier=0.5 here, 0.25 on the chief; '
          '--model_variant=xception_65 here, mobilenet_v2 on the chief: '
          in app.user_message(error.value))
  # A value given that the chief left to its default is no difference; the
  # cluster's shape is one (a worker listing fewer ps tasks waited for
  # variables placed on the others).
  model = tt.tiny_model_options()
  assert cluster_session.run_options_text(
      model, config.TrainOptions(weight_decay=4e-5), worker
  ) == cluster_session.run_options_text(model, config.TrainOptions(), worker)
  one_ps = cluster_spec.resolve(_options(task=1))
  two_ps = cluster_spec.resolve(_options(task=1, ps_hosts=PS + ('h:1',)))
  assert json.loads(cluster_session.run_options_text(
      model, config.TrainOptions(), one_ps))['ClusterOptions.ps_hosts'] == list(
          PS)
  assert json.loads(cluster_session.run_options_text(
      model, config.TrainOptions(), two_ps))['ClusterOptions.ps_hosts'] == list(
          PS + ('h:1',))
  # One worker more than the chief knows is named by its flag (it read
  # '--num_replicas=3 here, 2 on the chief', a flag never given).
  three = cluster_spec.resolve(_options(
      task=1, ps_hosts=hosts[:1], worker_hosts=hosts[1:] + ['h:2']))
  with tf.Graph().as_default():
    mine = cluster_session.ChiefOptions(cluster_session.run_options_text(
        model, config.TrainOptions(), three))
  differences = mine.differences(cluster_session.run_options_text(
      model, config.TrainOptions(), worker))
  assert app.user_message(mine.mismatch_error(differences, 1)).startswith(
      'worker task 1 was started with options that differ from those of the '
      'chief, which trains: --worker_hosts=%s,%s,h:2 here, %s,%s on the '
      'chief: ' % (hosts[1], hosts[2], hosts[1], hosts[2]))

  # The input is compared too: a worker with another split or scale range
  # trained on other input without a word. Not the dataset's folder, which
  # may be each host's own copy.
  chief_input = cluster_session.run_options_text(
      model, config.TrainOptions(), worker,
      config.PreprocessOptions(crop_size=(33, 33)), 'pascal_voc_seg', 'train')
  worker_input = cluster_session.run_options_text(
      model, config.TrainOptions(), worker,
      config.PreprocessOptions(crop_size=(33, 33), max_scale_factor=2.0),
      'pascal_voc_seg', 'trainval')
  with tf.Graph().as_default():
    mine = cluster_session.ChiefOptions(worker_input)
  assert app.user_message(mine.mismatch_error(
      mine.differences(chief_input), 1)).startswith(
          'worker task 1 was started with options that differ from those of '
          'the chief, which trains: --max_scale_factor=2.0 here, 1.0 on the '
          'chief; --train_split=trainval here, train on the chief: ')

  # The chief stops; the ps keeps its options. A worker of the next run,
  # with other options, waits for that run's chief (it was refused), and a
  # worker with the stopped chief's options waits too (it trained on).
  chief_session.close()
  time.sleep(2 * stale)
  next_run = start_worker(train_batch_size=4)
  old_run = start_worker()
  time.sleep(4 * stale)
  for waiting in (next_run, old_run):
    assert 'error' not in waiting and 'session' not in waiting
  create(chief, *_options_graph(chief, ['w'], train_batch_size=4))
  next_run['thread'].join(timeout=timeouts.HANG_SECONDS)
  assert next_run['session'].run(_first_variable(next_run['graph'])) == 1.0
  old_run['thread'].join(timeout=timeouts.HANG_SECONDS)
  assert 'train_batch_size=2 here, 4 on the chief' in str(old_run['error'])
  # The early worker, still training, learns of the new chief after its
  # next step (it trained on, unchecked, beside it).
  with pytest.raises(config.ConfigError) as error:
    check.after_run(step_ended, None)
  assert app.user_message(error.value).startswith(
      'the chief was restarted with options that differ from those of worker '
      'task 1, which trained beside it: --train_batch_size=2 here, 4 on the '
      'chief: ')


def test_join_hook_stops_a_worker_joining_a_finished_run():
  hook, stopped = _join(start_at=30, last_step=30, start_step=0)
  assert stopped and hook.finished_step == 30


def test_join_hook_lets_a_worker_start_at_once_or_after_its_delay(caplog):
  with caplog.at_level('INFO', logger='absl'):
    hook, stopped = _join(start_at=5, last_step=30, start_step=0)
  assert not stopped and hook.finished_step is None
  # Its log names the step it starts from (the run's, not 0).
  assert 'Joining the run at global step 5 (last step 30)' in caplog.text
  hook, stopped = _join(start_at=0, last_step=30, start_step=4, later=4)
  assert not stopped and hook.waited >= 0.25
  # A start step past the end: it waits for the end only, then stops.
  hook, stopped = _join(start_at=0, last_step=3, start_step=15, later=3)
  assert stopped and hook.finished_step == 3


def test_a_task_in_its_session_gets_the_full_stop_grace(monkeypatch):
  """A SIGTERM in a chief's first step (seconds of graph warm-up on a loaded
  machine) ended it after the 5 s grace of a task waiting for its session,
  exit 143, when the step would have ended with a final checkpoint."""
  monkeypatch.setattr(train_cli, 'CLUSTER_STOP_GRACE_SECS', 1)
  monkeypatch.setattr(train_cli, 'CLUSTER_STOP_GRACE_BEFORE_THE_SESSION_SECS',
                      0)

  class Run:
    def __init__(self, in_session):
      self.in_session = in_session

    def session_progress(self):
      return self.in_session, None

  for in_session, grace in ((False, 0), (True, 1)):
    why = []
    start = time.time()
    train_cli._stop_when_stuck(  # pylint: disable=protected-access
        Run(in_session), 'SIGTERM', why.append)
    assert grace <= time.time() - start < grace + 5
    assert why == ['SIGTERM, and no step ended within %d s: waiting for '
                   'another task of the cluster' % grace]


class _StepClock:
  """A run whose steps begin and end as the test says (step_began), its
  longest step 0.1 s once one ended (None before)."""

  def __init__(self):
    self.began = None
    self.longest = 0.1

  def step_began(self):
    return self.began

  def longest_step(self):
    return self.longest


def test_a_step_stuck_past_the_time_budget_ends_the_task(monkeypatch):
  """A synchronous chief whose worker died (or any task whose ps is gone)
  waited in its step past --max_run_seconds until a signal came: the time
  budget stops a run between steps only. The step waiting a grace period
  past the budget now ends the task at once; time between steps (the
  final save, a validation) and a step that began before the budget but
  is still within its grace do not."""
  monkeypatch.setattr(train_cli, 'CLUSTER_STOP_GRACE_SECS', 1)
  run = _StepClock()
  ended = []
  now = time.time()
  deadline = now + 1.0
  run.began = now - 100    # long under way, but within the budget until
  watcher = threading.Thread(
      target=train_cli._stop_when_stuck_past_budget,  # pylint: disable=protected-access
      args=(run, deadline, ended.append, 0.05), daemon=True)
  watcher.start()
  time.sleep(1.6)     # the deadline, then 0.6 s of the 1.3 s grace
  assert not ended
  run.began = None    # the step ended; the run saves between steps
  time.sleep(1.5)
  assert not ended
  run.began = time.time()   # a step that waits for ever
  watcher.join(timeout=10)
  assert not watcher.is_alive()
  waited = time.time() - run.began
  assert 1.3 <= waited < 3, waited
  why, = ended
  assert why.startswith('--max_run_seconds passed ')
  assert 'waited since for another task of the cluster' in why


def test_a_synchronous_worker_stops_waiting_on_its_budget_only_before_it_trained():
  """Its session re-created after a chief or ps restart (the run's steps
  then wait for it again), a synchronous worker that trained left once its
  own budget had passed."""
  import types  # pylint: disable=g-import-not-at-top
  from deeplab_train.runtime import run as run_lib  # pylint: disable=g-import-not-at-top
  spec = types.SimpleNamespace(run_options=types.SimpleNamespace(
      max_run_seconds=45))

  def stops(sync, trained):
    run = run_lib.TrainingRun(
        spec, types.SimpleNamespace(is_chief=False, sync_replicas=sync),
        start_time=time.time() - 60)
    run._hooks_now = types.SimpleNamespace(  # pylint: disable=protected-access
        progress=types.SimpleNamespace(in_session=trained))
    return run._stops_waiting()  # pylint: disable=protected-access
  assert stops(sync=True, trained=False)
  assert not stops(sync=True, trained=True)
  assert stops(sync=False, trained=True)


def test_a_first_step_past_the_time_budget_gets_a_longer_grace(monkeypatch):
  """Before any step ended the grace was the signal's 30 s: a healthy first
  step past the budget (warm-up; xception on a CPU) ended the task with
  exit 1 and no final checkpoint."""
  monkeypatch.setattr(train_cli, 'CLUSTER_STOP_GRACE_SECS', 1)
  monkeypatch.setattr(train_cli, 'FIRST_STEP_GRACE_SECS', 2)
  run = _StepClock()
  run.longest = None
  assert train_cli._budget_grace(run) == 2  # pylint: disable=protected-access
  run.longest = 4.0
  assert train_cli._budget_grace(run) == 13  # pylint: disable=protected-access


def test_only_a_task_keeping_its_own_time_budget_has_a_deadline():
  import types  # pylint: disable=g-import-not-at-top
  from deeplab_train.runtime import run as run_lib  # pylint: disable=g-import-not-at-top
  spec = types.SimpleNamespace(run_options=types.SimpleNamespace(
      max_run_seconds=45))
  deadline = lambda cluster: run_lib.TrainingRun(
      spec, cluster, start_time=1000.0).budget_deadline()
  worker = types.SimpleNamespace(is_chief=False, sync_replicas=True)
  assert deadline(worker) is None
  assert deadline(types.SimpleNamespace(is_chief=True,
                                        sync_replicas=True)) == 1045.0
  spec.run_options.max_run_seconds = 0
  assert deadline(None) is None


class _StopAt(tf.train.SessionRunHook):
  """Requests a stop once the global step reaches `step` (as a signal or
  the time budget would); at `end`, notes whether the token queue was
  already closed (a hook before SyncReplicasHook, as CheckpointHook is)."""

  def __init__(self, global_step, step, queue_closed):
    self._global_step = global_step
    self._step = step
    self._queue_closed = queue_closed
    self.closed_at_end = None

  def after_run(self, run_context, run_values):
    if run_context.session.run(self._global_step) >= self._step:
      run_context.request_stop()

  def end(self, session):
    self.closed_at_end = bool(session.run(self._queue_closed))


def _lone_sync_chief():
  """(global step, SyncReplicasOptimizer of a chief alone, its train op)."""
  global_step = tf.train.get_or_create_global_step()
  weight = tf.Variable(1.0)
  # One replica's gradients make an update.
  opt = tf.train.SyncReplicasOptimizer(
      tf.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=1,
      total_num_replicas=1)
  return global_step, opt, opt.minimize(tf.square(weight),
                                        global_step=global_step)


def test_a_chief_stopping_early_closes_the_token_queue_before_its_last_save():
  """Before, the queue was closed at the very end: the final checkpoint's
  save then chased the updates the other workers' gradients kept making,
  and the stop-when-stuck grace could end the chief during it."""
  with tf.Graph().as_default():
    global_step, opt, train_op = _lone_sync_chief()
    queue_closed = opt._sync_token_queue.is_closed()  # pylint: disable=protected-access
    probe = _StopAt(global_step, 3, queue_closed)
    hooks = [probe, cluster_lib.SyncReplicasHook(opt, True, global_step, 100)]
    with tf.train.MonitoredSession(hooks=hooks) as sess:
      while not sess.should_stop():
        sess.run(train_op)
  assert probe.closed_at_end is True


class _RecordingSession:
  """Answers 0 for any fetch but the apply op (cancelled, as by a closed
  session); records what was run."""

  def __init__(self, apply_op):
    self.ran = []
    self._apply_op = apply_op

  def run(self, fetches):
    self.ran.append(fetches)
    if fetches is self._apply_op:
      raise tf.errors.CancelledError(None, None, 'session closed')
    return 0


def test_a_stopped_chief_starts_no_apply_step():
  """An apply step started as the session closes can miss its cancellation
  on the ps and hold the close for ever: none starts once the chief stops."""
  with tf.Graph().as_default():
    global_step, opt, _ = _lone_sync_chief()
    cluster_lib.without_steps(opt)  # no real session here
    hook = cluster_lib.SyncReplicasHook(opt, True, global_step, 100)
    hook.begin()
    runner = opt.get_chief_queue_runner()
    apply_op = runner.enqueue_ops[0]
    session = _RecordingSession(apply_op)
    context = tf.train.SessionRunContext(None, session)
    context.request_stop()
    hook.after_run(context, None)
    ran_at_stop = list(session.ran)
    hook._apply_loop(session, tf.train.Coordinator())  # pylint: disable=protected-access
  # The token queue was closed (the run stopped before its last step), and
  # no apply step ran after the stop.
  assert any(op is runner.cancel_op for op in ran_at_stop)
  assert not any(op is apply_op for op in session.ran)


# ---------------------------------------------------------------------------
# Real clusters of separate processes on 127.0.0.1.
# ---------------------------------------------------------------------------
# Seconds any one process may take (TensorFlow start-up, graph, steps).
PROCESS_TIMEOUT = timeouts.HANG_SECONDS
STEP_LINE = re.compile(r'\] step (\d+)/(\d+)')


def free_ports(count):
  """`count` distinct free ports on 127.0.0.1 (held together until known)."""
  socks = [socket.socket() for _ in range(count)]
  try:
    for s in socks:
      s.bind(('127.0.0.1', 0))
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  folder = tmp_path_factory.mktemp('records')
  tt.make_tfrecords(folder, count=4)
  return folder


@pytest.fixture
def processes():
  """A list the test appends its Popen objects to; every one still alive is
  killed with its process group at teardown, also when the test failed."""
  started = []
  yield started
  for proc in started:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  for proc in started:
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass


class LocalCluster:
  """1 ps + 2 workers of deeplab-train on free 127.0.0.1 ports."""

  def __init__(self, root, records, processes, steps, *extra):
    ps_port, w0_port, w1_port = free_ports(3)
    self.root = pathlib.Path(root)
    self.logdir = self.root / 'train'
    self._processes = processes
    self._runs = {}
    self.args = tt.tiny_cli_args(self.logdir, records, steps) + [
        '--ps_hosts=127.0.0.1:%d' % ps_port,
        '--worker_hosts=127.0.0.1:%d,127.0.0.1:%d' % (w0_port, w1_port),
        '--save_interval_secs=0'] + list(extra)

  def start(self, job, task, name=None):
    """Starts a task in its own process group; returns its Popen."""
    name = name or '%s%d' % (job, task)
    out = open(self.root / (name + '.out'), 'w')
    err = open(self.root / (name + '.err'), 'w')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'deeplab_train.cli.train'] + self.args
        + ['--job_name=%s' % job, '--task=%d' % task],
        stdout=out, stderr=err, env=tt.subprocess_env(), cwd=str(tt.REPO),
        start_new_session=True)
    out.close()
    err.close()
    self._processes.append(proc)
    self._runs[name] = proc
    return proc

  def start_all(self):
    self.start('ps', 0)
    return self.start('worker', 0), self.start('worker', 1)

  def log(self, name):
    return (self.root / (name + '.err')).read_text()

  def steps(self, name):
    """Global steps in the progress lines a task logged."""
    return [int(m.group(1)) for m in STEP_LINE.finditer(self.log(name))]

  def finish(self, name, timeout=PROCESS_TIMEOUT):
    """(exit code, JSON result) of a worker, which must end in time."""
    proc = self._runs[name]
    try:
      proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      pytest.fail('%s did not finish in %d s; its log ends:\n%s'
                  % (name, timeout, self.log(name)[-3000:]))
    result = None
    for line in (self.root / (name + '.out')).read_text().splitlines():
      if line.startswith('{') and '"event": "result"' in line:
        result = json.loads(line)
    assert result is not None, self.log(name)[-3000:]
    return proc.returncode, result

  def wait_for_steps(self, name, count, timeout=PROCESS_TIMEOUT):
    """Waits until task `name` logged `count` steps; returns the last."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      steps = self.steps(name)
      if len(steps) >= count:
        return steps[-1]
      if self._runs[name].poll() is not None:
        pytest.fail('%s exited early:\n%s' % (name, self.log(name)[-3000:]))
      time.sleep(0.2)
    pytest.fail('%s logged no %d steps in %d s' % (name, count, timeout))

  def wait_for_line(self, name, text, timeout=PROCESS_TIMEOUT):
    deadline = time.time() + timeout
    while time.time() < deadline:
      if text in self.log(name):
        return
      if self._runs[name].poll() is not None:
        pytest.fail('%s exited early:\n%s' % (name, self.log(name)[-3000:]))
      time.sleep(0.2)
    pytest.fail('%s did not log %r in %d s' % (name, text, timeout))


def _check_chief(cluster, result, steps):
  assert result['status'] == 'ok', result
  assert result['stop_reason'] == 'finished'
  assert result['checkpoint'] == str(
      cluster.logdir / ('model.ckpt-%d' % result['global_step']))
  assert tt.latest_step(cluster.logdir) == result['global_step']
  values = tt.read_checkpoint(result['checkpoint'])
  assert int(values['global_step']) == result['global_step']
  assert 'logits/semantic/weights' in values
  assert (cluster.logdir / config.RUN_CONFIG_FILENAME).is_file()


def _check_worker(result, steps):
  assert result['status'] == 'ok', result
  assert result['stop_reason'] == 'finished'
  assert result['checkpoint'] is None  # the chief writes them
  assert result['global_step'] >= steps


def _eval_checkpoint(cluster, records):
  """deeplab-eval on the cluster's logdir: (exit code, JSON result)."""
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.eval',
       '--checkpoint_dir=%s' % cluster.logdir, '--dataset_dir=%s' % records,
       '--dataset=shapes', '--eval_split=train',
       '--eval_logdir=%s' % (cluster.root / 'eval')],
      capture_output=True, text=True, env=tt.subprocess_env(),
      cwd=str(tt.REPO), timeout=PROCESS_TIMEOUT)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('{')]
  return proc.returncode, json.loads(lines[-1]) if lines else proc.stderr


@pytest.mark.parametrize('extra, message', [
    (['--mixed_precision=fp16'],
     '--mixed_precision=fp16 is not supported on a cluster (its loss scaling '
     'may skip a step, which replicas cannot agree on): give '
     '--mixed_precision=bf16, auto or none'),
    (['--num_steps_more=2'], '--num_steps_more is not supported on a cluster'),
])
def test_what_a_cluster_task_cannot_train_with_is_refused_first(
    tmp_path, records, extra, message):
  """fp16 was refused once the task's server ran and its graph was half
  built, without saying what to give instead, and both left an empty
  logdir behind."""
  logdir = tmp_path / 'log'
  code, _, result = tt.main_in_process('deeplab-train', train_cli.main, (
      tt.tiny_cli_args(logdir, records, 2, '--ps_hosts=localhost:1',
                       '--worker_hosts=localhost:2', '--job_name=worker',
                       '--task=0', *extra)))
  assert code == 2 and result['status'] == 'bad_input'
  assert message in result['message']
  assert not logdir.exists()


@pytest.mark.slow
def test_synchronous_cluster_trains_and_the_chief_checkpoint_evaluates(
    tmp_path, records, processes):
  # Enough steps for worker 1 to join before the chief could finish alone.
  steps = 16
  cluster = LocalCluster(tmp_path, records, processes, steps)
  cluster.start_all()
  code0, chief = cluster.finish('worker0')
  code1, worker = cluster.finish('worker1')
  assert (code0, code1) == (0, 0), (chief, worker)
  _check_chief(cluster, chief, steps)
  assert chief['global_step'] == steps
  _check_worker(worker, steps)
  assert worker['global_step'] == steps
  # Both replicas ran training steps (a progress line per step).
  assert cluster.steps('worker0') and cluster.steps('worker1')
  assert 'SyncReplicas' in cluster.log('worker1')
  # A worker knows its first step once it joins, not before.
  assert ('Training mobilenet_v2 up to step 16, from the step the chief '
          'reached' in cluster.log('worker1'))
  assert 'Joining the run at global step' in cluster.log('worker1')
  code, evaluated = _eval_checkpoint(cluster, records)
  assert code == 0, evaluated
  assert evaluated['global_step'] == steps
  assert 0.0 <= evaluated['miou'] <= 1.0

  # The same cluster started again on a restarted ps: the chief has nothing
  # to do, and still loads the checkpoint into the ps, so worker 1 sees the
  # run finished (before, it waited for the model for up to two hours).
  ps = [p for p in processes if p.poll() is None]
  for proc in ps:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
  cluster.start('ps', 0, name='ps0_again')
  cluster.start('worker', 0, name='worker0_again')
  cluster.start('worker', 1, name='worker1_again')
  code0, chief = cluster.finish('worker0_again')
  code1, worker = cluster.finish('worker1_again', timeout=120)
  assert (code0, code1) == (0, 0), (chief, worker)
  assert chief['stop_reason'] == worker['stop_reason'] == 'nothing_to_do'
  # Its graph's synchronous set-up, which no step needed, is no error.
  assert 'never used' not in cluster.log('worker0_again')
  assert worker['global_step'] == steps


@pytest.mark.slow
def test_asynchronous_cluster_with_startup_delay(tmp_path, records,
                                                 processes):
  steps = 60
  cluster = LocalCluster(tmp_path, records, processes, steps,
                         '--sync_replicas=false', '--startup_delay_steps=3')
  chief_proc, _ = cluster.start_all()
  # The chief is paused at its first checkpoint until worker 1 waits for
  # step 3, so that it does wait. Its first step then takes seconds (its
  # graph is registered with the ps) while the chief alone does a step in a
  # tenth of one: the chief is paused again from its step 3 until worker 1
  # made a step, so that worker 1 trains within the run.
  cluster.wait_for_line('worker0', 'Saved checkpoint')
  os.kill(chief_proc.pid, signal.SIGSTOP)
  try:
    cluster.wait_for_line('worker1', 'Waiting for global step 3')
  finally:
    os.kill(chief_proc.pid, signal.SIGCONT)
  cluster.wait_for_steps('worker0', 3)
  os.kill(chief_proc.pid, signal.SIGSTOP)
  try:
    cluster.wait_for_steps('worker1', 1)
  finally:
    os.kill(chief_proc.pid, signal.SIGCONT)
  code0, chief = cluster.finish('worker0')
  code1, worker = cluster.finish('worker1')
  assert (code0, code1) == (0, 0), (chief, worker)
  _check_chief(cluster, chief, steps)
  _check_worker(worker, steps)
  # Each worker updates on its own: an update of each may be under way when
  # the last step is reached, and land after it.
  assert steps <= chief['global_step'] <= steps + 2
  assert 'SyncReplicas' not in cluster.log('worker1')
  # Its first step came after the global step 1 * 3 it waited for.
  assert 3 < min(cluster.steps('worker1')) < steps


@pytest.mark.slow
def test_killed_worker_rejoins_and_the_run_goes_on(tmp_path, records,
                                                  processes):
  # More steps than the run makes: it ends when the chief is stopped, after
  # the restarted worker's first step. (A chief alone can make every step;
  # a short run could end before the restarted worker's first.)
  cluster = LocalCluster(tmp_path, records, processes, 1000)
  chief_proc, worker_proc = cluster.start_all()
  killed_at = cluster.wait_for_steps('worker1', 2)
  os.killpg(worker_proc.pid, signal.SIGKILL)
  worker_proc.wait(timeout=10)
  # The chief is paused while worker 1 restarts (a restart takes
  # TensorFlow's start-up time).
  os.kill(chief_proc.pid, signal.SIGSTOP)
  try:
    cluster.start('worker', 1, name='worker1_restarted')
    cluster.wait_for_line('worker1_restarted',
                          'Waiting for the chief to initialise')
  finally:
    os.kill(chief_proc.pid, signal.SIGCONT)
  cluster.wait_for_steps('worker1_restarted', 2)
  chief_proc.send_signal(signal.SIGTERM)
  code0, chief = cluster.finish('worker0')
  code1, worker = cluster.finish('worker1_restarted')
  assert (code0, code1) == (0, 0), (chief, worker)
  assert chief['stop_reason'] == 'signal:SIGTERM', chief
  assert tt.latest_step(cluster.logdir) == chief['global_step'] < 1000
  assert worker['stop_reason'] == 'chief_stopped', worker
  # It continued from the shared state, not from step 0.
  rejoined = cluster.steps('worker1_restarted')
  assert rejoined and min(rejoined) > killed_at, (killed_at, rejoined)


@pytest.mark.slow
def test_killed_chief_restarts_from_the_last_checkpoint(tmp_path, records,
                                                       processes):
  steps = 30
  cluster = LocalCluster(tmp_path, records, processes, steps,
                         '--save_interval_steps=3')
  chief_proc, _ = cluster.start_all()
  cluster.wait_for_steps('worker0', 7)
  os.killpg(chief_proc.pid, signal.SIGKILL)
  chief_proc.wait(timeout=10)
  # Read after the kill: a step's line is logged before its checkpoint.
  killed_at = cluster.steps('worker0')[-1]
  # Without the chief no update happens: worker 1 waits for it.
  last = tt.latest_step(cluster.logdir)
  assert 3 <= last <= killed_at
  cluster.start('worker', 0, name='worker0_restarted')
  code0, chief = cluster.finish('worker0_restarted')
  code1, worker = cluster.finish('worker1')
  assert (code0, code1) == (0, 0), (chief, worker)
  _check_chief(cluster, chief, steps)
  assert chief['global_step'] == steps
  _check_worker(worker, steps)
  log = cluster.log('worker0_restarted')
  assert 'Restoring parameters from %s' % (
      cluster.logdir / ('model.ckpt-%d' % last)) in log
  # The restarted chief took over the dead one's logdir lock.
  assert 'Taking over the stale lock' in log
  # It went on from the checkpoint's step, not from scratch. Worker 1, back
  # at work as soon as the chief handed out tokens, can make updates while
  # the chief's first step runs (the chief's queue runner applies them): on a
  # slow machine it made all the remaining ones, and the chief's only
  # progress line was the last step's.
  logged = cluster.steps('worker0_restarted')
  assert logged and last <= min(logged) <= steps, logged


def test_a_task_waiting_for_the_cluster_stops_on_the_first_sigterm(
    tmp_path, records, processes):
  """A chief whose ps never comes up waits for it; a SIGTERM (a batch
  system's, before its SIGKILL) was not honoured while it waited (still
  running 660 s after it, in an audit). It stops at once now, as on a
  second signal, once the grace period of a task without a step is over.
  A worker waiting for the chief (the ps is up) has nothing to save: it
  stops at once with exit 0 (before, the same grace, then exit 143 and a
  result saying training resumes from the last checkpoint)."""
  cluster = LocalCluster(tmp_path, records, processes, 10)
  chief_proc = cluster.start('worker', 0)   # no ps started
  cluster.wait_for_line('worker0', 'Training mobilenet_v2 from step 0')
  time.sleep(1)
  chief_proc.send_signal(signal.SIGTERM)
  code, chief = cluster.finish('worker0', timeout=60)
  assert code == 143, chief
  assert (chief['status'], chief['stop_reason']) == ('terminated',
                                                     'signal:SIGTERM')
  assert re.search(r'SIGTERM, and no step ended within \d+ s: waiting for '
                   r'another task of the cluster', chief['message']), chief
  assert tt.latest_step(cluster.logdir) is None

  cluster.start('ps', 0)
  worker_proc = cluster.start('worker', 1)   # no chief
  cluster.wait_for_line('worker1', 'Waiting for the chief')
  time.sleep(1)
  worker_proc.send_signal(signal.SIGTERM)
  code, worker = cluster.finish('worker1', timeout=30)
  assert code == 0, worker
  assert worker == dict(worker, status='ok', stop_reason='signal:SIGTERM',
                        checkpoint=None, message=(
                            'stopped before any step (signal:SIGTERM), while '
                            'waiting for the chief; the chief writes the '
                            'checkpoints'))
  assert ('SIGTERM received: stopping after the current step (the chief '
          'writes the checkpoints; send it again to stop at once)'
          in cluster.log('worker1'))


@pytest.mark.slow
def test_chief_stopped_early_stops_the_workers(tmp_path, records, processes):
  cluster = LocalCluster(tmp_path, records, processes, 1000)
  chief_proc, _ = cluster.start_all()
  cluster.wait_for_steps('worker1', 3)
  chief_proc.send_signal(signal.SIGTERM)
  code0, chief = cluster.finish('worker0')
  code1, worker = cluster.finish('worker1', timeout=30)
  assert (code0, code1) == (0, 0), (chief, worker)
  assert chief['stop_reason'] == 'signal:SIGTERM'
  assert tt.latest_step(cluster.logdir) == chief['global_step'] < 1000
  # The chief closed the token queue: worker 1 did not wait for ever.
  assert worker['stop_reason'] == 'chief_stopped', worker
  # Those ps tasks cannot serve that synchronous run again: a new chief
  # says so (exit 2) instead of hanging.
  cluster.start('worker', 0, name='worker0_again')
  code, again = cluster.finish('worker0_again')
  assert code == 2 and 'restart the ps tasks' in again['message'], again


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_a_parameter_server_ends_on_a_signal_with_its_result_line(
    tmp_path, records, processes, sig):
  """A ps ended on SIGTERM with 143 and no result line, the one task
  without one; it stops now with its line and exit 0, its normal end."""
  cluster = LocalCluster(tmp_path, records, processes, 10,
                         '--result_json=%s' % (tmp_path / 'ps.json'))
  proc = cluster.start('ps', 0)
  cluster.wait_for_line('ps0', 'serving on')
  proc.send_signal(sig)
  code, result = cluster.finish('ps0', timeout=30)
  name = signal.Signals(sig).name
  assert code == 0, result
  assert result['status'] == 'ok'
  assert result['stop_reason'] == 'signal:' + name
  assert result['message'].startswith('parameter server 0 (127.0.0.1:')
  assert json.loads((tmp_path / 'ps.json').read_text()) == result


def test_a_parameter_server_whose_result_file_fails_exits_1(tmp_path,
                                                            records,
                                                            processes):
  """Its --result_json not written (a full disk, a folder in its way), a
  ps stopped by a signal exited 0 all the same."""
  (tmp_path / 'ps.json').mkdir()
  cluster = LocalCluster(tmp_path, records, processes, 10,
                         '--result_json=%s' % (tmp_path / 'ps.json'))
  proc = cluster.start('ps', 0)
  cluster.wait_for_line('ps0', 'serving on')
  proc.send_signal(signal.SIGTERM)
  code, result = cluster.finish('ps0', timeout=30)
  assert (code, result['status']) == (1, 'ok'), result
  assert 'cannot write --result_json' in cluster.log('ps0')


def test_a_worker_waiting_for_a_chief_that_never_comes_stops_on_its_budget(
    tmp_path, records, processes):
  """A synchronous worker leaves its --max_run_seconds to the chief, and so
  waited for ever for a chief that was never started (or without a budget
  for two hours, then a traceback). Before its session it has no share in
  a step: it stops on its own budget, having trained nothing."""
  cluster = LocalCluster(tmp_path, records, processes, 10,
                         '--max_run_seconds=6')
  cluster.start('ps', 0)
  cluster.start('worker', 1)
  code, result = cluster.finish('worker1', timeout=120)
  assert code == 0, result
  assert result['stop_reason'] == 'time_budget'
  assert result['global_step'] is None and result['checkpoint'] is None
  assert 'while waiting for the chief' in result['message']
  assert 6 <= result['seconds'] < 60
  assert 'Waiting for the chief to initialise' in cluster.log('worker1')


def test_launch_script_is_shellcheck_clean(repo_dir):
  script = repo_dir / 'scripts' / 'launch_local_cluster.sh'
  assert os.access(script, os.X_OK)
  subprocess.run(['bash', '-n', str(script)], check=True)
  if shutil.which('shellcheck') is None:
    pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
  proc = subprocess.run(['shellcheck', '-x', str(script)], capture_output=True,
                        text=True, cwd=str(repo_dir))
  assert proc.returncode == 0, proc.stdout


def test_a_synchronous_worker_leaves_the_time_budget_to_the_chief():
  """Every task given the same --max_run_seconds (the docs' 'same
  command'): worker 1 stopped on its budget first, and the chief's step
  waited for its gradients for ever, past its own budget, with no final
  checkpoint written."""
  import types  # pylint: disable=g-import-not-at-top
  from deeplab_train.runtime import run as run_lib  # pylint: disable=g-import-not-at-top
  spec = types.SimpleNamespace(run_options=types.SimpleNamespace(
      max_run_seconds=45))
  keeps = lambda is_chief, sync: run_lib.TrainingRun(
      spec, types.SimpleNamespace(is_chief=is_chief, sync_replicas=sync)
  )._keeps_its_own_budget()
  assert not keeps(is_chief=False, sync=True)
  assert keeps(is_chief=True, sync=True)
  # Asynchronous: each worker stops on its own (docs/distributed.md).
  assert keeps(is_chief=False, sync=False)
  assert run_lib.TrainingRun(spec)._keeps_its_own_budget()


def test_a_worker_joins_a_finished_run_whose_chief_has_stopped():
  """A worker (re)started more than 15 s after the chief finished waited
  'for the chief of this run' until SIGTERM (or 2 h), where the docs say it
  stops at once with nothing_to_do: it took only a live chief's model."""
  polls = []

  class Options:
    def chief(self, session):
      polls.append(1)
      return 'the same options', 100.0   # a heartbeat 100 s old

    def differences(self, text):
      return []

  def waits(finished):
    del polls[:]
    creator = cluster_session._WorkerSessionCreator(  # pylint: disable=protected-access
        None, '', None, Options(), 1, max_wait_secs=60,
        recovery_wait_secs=0.01, finished=finished,
        should_stop=lambda: len(polls) > 5)
    creator._not_ready = lambda session: []  # pylint: disable=protected-access
    try:
      creator._wait(None)  # pylint: disable=protected-access
    except cluster_session.StoppedWhileWaiting:
      return 'waited'
    return 'joined'
  assert waits(lambda session: True) == 'joined'
  # A run a chief stopped early: the next chief is waited for.
  assert waits(lambda session: False) == 'waited'
  assert waits(None) == 'waited'
