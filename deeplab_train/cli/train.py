"""deeplab-train: train, resume or fine-tune DeepLab on TFRecords.

    deeplab-train --train_logdir=DIR --dataset_dir=TFRECORDS \\
        [--dataset=pascal_voc_seg] [--train_split=train] \\
        [--model_variant=mobilenet_v2] [--train_crop_size=513,513] \\
        [--train_batch_size=8] [--training_number_of_steps=30000] \\
        [--tf_initial_checkpoint=CKPT --initialize_last_layer=false]

The flags are the original DeepLab train.py's. A checkpoint already in
--train_logdir is resumed (it wins over --tf_initial_checkpoint); the model
options are saved there as deeplab_config.json for deeplab-eval, -vis and
-export, and a resumed run with contradicting model flags is refused.

Safe to run from cron: one run per logdir (a lock holding pid and host),
--max_run_seconds and SIGTERM/SIGINT stop with a final checkpoint,
--num_steps_more=N trains N more steps, a NaN/inf loss stops without writing
the broken weights, and the run ends with one JSON line on stdout (also
written to --result_json):

    {"event": "result", "status": ..., "stop_reason": ..., "global_step": ...,
     "loss": ..., "checkpoint": ..., "seconds": ..., "message": ...}

stop_reason: finished, num_steps_more, time_budget, signal:SIGTERM /
signal:SIGINT, early_stopping, nothing_to_do, input_exhausted,
chief_stopped (a cluster worker), bad_input, non_finite_loss,
checkpoint_not_saved, validation_not_saved, locked, error.

Validation during training (single machine only; refused on a cluster):

    deeplab-train ... --eval_interval_steps=500 [--eval_split=val] \\
        [--best_metric=miou|iou/CLASS] [--early_stopping_patience=5 \\
         --early_stopping_min_delta=0.001 --early_stopping_start_step=0]

every 500 steps (and at the end of a run that does not stop on a signal or
the time budget) a checkpoint is saved and scored on --eval_split as
deeplab-eval scores it by default (single scale, no flips). The mIoU is
logged and written to TensorBoard (eval/miou, eval/iou/CLASS) and, with the
per-class IoU, as one line {"step", "miou", "per_class_iou", "seconds"} of
TRAIN_LOGDIR/metrics_history.jsonl. The best checkpoint by --best_metric
is copied with deeplab_config.json to TRAIN_LOGDIR/best/ (best/best.json
names its step and value; deeplab-eval, -vis and -export take best/ as a
checkpoint directory). With --early_stopping_patience=K the run stops
(exit 0, stop_reason early_stopping, final checkpoint written) after K
evaluations in a row without an improvement of more than
--early_stopping_min_delta, counted from --early_stopping_start_step
(earlier evaluations are kept but neither counted nor compared with: with
batch norm trained from its initial moving averages the first thousands of
steps score near nothing). The history, the best and the count survive a
restart, also after kill -9; a logdir whose history already used up the
patience is not trained again (stop_reason early_stopping). A run with
nothing left to train scores the latest checkpoint when the run that saved
it did not (killed before, or stopped by a full disk), then exits 0.

Exit codes:
  0   finished (training_number_of_steps or --num_steps_more reached), time
      budget used up, stopped by SIGTERM/SIGINT (final checkpoint written),
      early stopping, or nothing to do (the logdir is already at
      training_number_of_steps)
  1   unexpected error; also a cluster task whose step still waits for
      another task (a dead worker, a ps gone) a grace period past
      --max_run_seconds: stopped at once without a final checkpoint
      (stop_reason time_budget; the last checkpoint written is intact)
  2   bad flags or input (one-line message; no traceback)
  3   non-finite loss (no checkpoint of the broken step is written)
  75  the logdir is locked by a live run (the message names its pid)
  143 / 130  a second SIGTERM / SIGINT (a second or more after the first;
      sooner, it is the same one sent twice): stopped at once, without a
      final checkpoint (status terminated / interrupted; the last
      checkpoint written is intact and the next run resumes from it)

A first SIGTERM/SIGINT is honoured from the first second (also while
TensorFlow loads). A checkpoint that cannot be saved (full disk) ends the run
with exit 1 and stop_reason checkpoint_not_saved; its partial files are
removed and the previous checkpoint stays the latest. An evaluation whose
best/ or history cannot be written ends it with exit 1 and stop_reason
validation_not_saved; the next run scores that checkpoint again.

On a cluster (TensorFlow's parameter servers and workers, see
docs/distributed.md) every task runs the same command with its own
--job_name and --task (or its own TF_CONFIG):

    deeplab-train ... --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 \\
        --job_name=worker --task=0 [--sync_replicas=false]

A ps task serves until SIGTERM/SIGINT (then prints its result line, exit 0)
or SIGKILL; worker 0 (the chief) initialises, writes the
checkpoints and summaries and holds the logdir lock; the other workers
report no checkpoint.
"""
import dataclasses
import functools
import os
import signal
import sys
import threading
import time
from typing import Any, Optional

from absl import flags
from absl import logging

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import launch
from deeplab_train.cli import train_flags
from deeplab_train.cli import output_paths
from deeplab_train.cli import signals
from deeplab_train.data import datasets
from deeplab_train.runtime import cluster_spec
from deeplab_train.runtime import result as result_lib
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS
COMMAND = launch.COMMAND
FLAG_NAMES = train_flags.FLAG_NAMES

# Clusters (TensorFlow's distributed runtime; or the TF_CONFIG variable).
_CLUSTER_TABLE = (
    ('list', 'ps_hosts', [],
     'host:port of each parameter-server task, comma-separated.'),
    ('list', 'worker_hosts', [],
     'host:port of each worker task, comma-separated; the first is the '
     'chief.'),
    ('string', 'job_name', None, 'This task\'s job: ps or worker.'),
    ('integer', 'task', 0, 'The task ID (index in its job).'),
    ('boolean', 'sync_replicas', True,
     'Cluster: synchronous updates (each averages a gradient of every '
     'worker); false: asynchronous.'),
    ('integer', 'num_replicas', 1,
     'Number of worker replicas (follows --worker_hosts or TF_CONFIG; a '
     'given value must match it).'),
    ('integer', 'num_ps_tasks', 0,
     'The number of parameter servers (follows --ps_hosts or TF_CONFIG; a '
     'given value must match it).'),
    ('integer', 'startup_delay_steps', 15,
     'Number of training steps between replicas startup (asynchronous mode: '
     'worker i starts at step i times this).'),
)

# Logging, checkpoints, stopping.
_RUN_TABLE = (
    ('string', 'train_logdir', None,
     'Where the checkpoints and logs are stored (required).'),
    ('integer', 'log_steps', 10,
     'Display logging information at every log_steps.'),
    ('integer', 'save_interval_secs', 1200,
     'How often, in seconds, we save the model to disk (0: not by time).'),
    ('integer', 'save_interval_steps', None,
     'Also save the model every this many steps.'),
    ('integer', 'keep_checkpoint_max', 5,
     'Number of recent checkpoints kept in train_logdir.'),
    ('integer', 'save_summaries_secs', 600,
     'How often, in seconds, we compute the summaries (0: never).'),
    ('string', 'profile_logdir', None,
     'Where Chrome traces (timeline-STEP.json) of one step in '
     'every %d are written, the first after %d steps.'
     % (config.PROFILE_STEPS, config.PROFILE_STEPS)),
    ('float', 'max_run_seconds', None,
     'Stop (with a final checkpoint, exit 0) after this many seconds of '
     'wall time.'),
    ('integer', 'num_steps_more', None,
     'Train this many steps past the checkpoint in train_logdir, then stop '
     '(never past training_number_of_steps).'),
    ('string', 'result_json', None,
     'Also write the final JSON result line to this file.'),
)

# Validation during training (runtime/validation.py).
_VALIDATION_TABLE = (
    ('integer', 'eval_interval_steps', None,
     'Evaluate the weights on --eval_split every this many steps (and at '
     'the end), keep the best checkpoint in TRAIN_LOGDIR/best and log the '
     'metrics to TRAIN_LOGDIR/metrics_history.jsonl (unset: no validation).'),
    # deeplab-eval's flag too: the same default, and either may define it
    # first when both commands are imported in one process.
    ('string', 'eval_split', 'val',
     'Which split of the dataset is used for evaluation (with '
     '--eval_interval_steps).', {'allow_override': True}),
    ('string', 'best_metric', 'miou',
     'What the best checkpoint is chosen by: miou, or iou/CLASS (a class '
     'name or id).'),
    ('integer', 'early_stopping_patience', 0,
     'Stop (exit 0, stop_reason early_stopping, final checkpoint) after this '
     'many evaluations in a row without an improvement of --best_metric by '
     'more than --early_stopping_min_delta (0: never).'),
    ('float', 'early_stopping_min_delta', 0.0,
     'The smallest change of --best_metric that counts as an improvement '
     'for early stopping.'),
    ('integer', 'early_stopping_start_step', 0,
     'Early stopping starts at this step: evaluations of earlier steps are '
     'kept (and may be the best) but not counted, e.g. while the batch norm '
     'moving averages of a network trained from scratch still hold their '
     'initial values.'),
)
flag_table.define(_CLUSTER_TABLE, _RUN_TABLE, _VALIDATION_TABLE)

# RunOptions and ClusterOptions fields are set by the flag of the same name.
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(config.RunOptions))
_CLUSTER_FIELDS = tuple(f.name for f in dataclasses.fields(
    config.ClusterOptions))
# Given only when set: they follow the cluster otherwise.
_CLUSTER_COUNTS = ('num_replicas', 'num_ps_tasks')

# Re-exported: the flags' TrainOptions.
train_options = train_flags.train_options


@dataclasses.dataclass(frozen=True)
class ServeJob:
  """A parameter-server task: serves its cluster until stopped."""
  cluster: Any


@dataclasses.dataclass(frozen=True)
class TrainJob:
  """Everything a training run needs, every option checked."""
  model_options: config.ModelOptions
  train_options: config.TrainOptions
  run_options: config.RunOptions
  preprocess_options: config.PreprocessOptions
  dataset_info: datasets.DatasetInfo
  dataset_dir: str
  split: str
  cluster: Optional[Any] = None
  master: str = ''


def run_options():
  """RunOptions from the flags, validated; --eval_split counts only when
  given or when --eval_interval_steps is (its default is deeplab-eval's)."""
  values = {name: FLAGS[name].value for name in _RUN_FIELDS}
  if not (common_flags.explicitly_set('eval_split')
          or FLAGS.eval_interval_steps is not None):
    values['eval_split'] = None
  return config.RunOptions(**values).validate()


def cluster_options():
  """ClusterOptions from the flags (the replica counts only when given)."""
  values = {name: FLAGS[name].value for name in _CLUSTER_FIELDS}
  for name in _CLUSTER_COUNTS:
    if not common_flags.explicitly_set(name):
      values[name] = None
  return config.ClusterOptions(**values).validate()


def options_from_flags():
  """The job the flags describe: a ServeJob or a TrainJob.

  A ps task needs only the cluster flags, so they are resolved first.

  Raises:
    config.ConfigError: bad flags, cluster, dataset or saved config.
  """
  cluster = cluster_spec.resolve(cluster_options(),
                                 os.environ.get(cluster_spec.TF_CONFIG))
  if cluster is not None and cluster.is_ps:
    return ServeJob(cluster)
  if FLAGS.master and cluster is not None:
    raise config.ConfigError(
        '--master cannot be combined with a cluster (--ps_hosts/'
        '--worker_hosts or TF_CONFIG): the cluster names the servers')
  if FLAGS.master:
    # The original's way to join a cluster: with no server there, the
    # session waited for ever (and a first SIGTERM did not end it).
    raise config.ConfigError(
        '--master=%s: deeplab-train joins a cluster by its hosts, not by '
        '--master: give --ps_hosts, --worker_hosts, --job_name and --task '
        '(or TF_CONFIG) instead, the same on every task (see '
        'docs/distributed.md); without them it trains on this machine',
        FLAGS.master)
  common_flags.require(FLAGS.train_logdir, 'train_logdir',
                       ': the folder for checkpoints and summaries')
  output_paths.check_output_folder('train_logdir', FLAGS.train_logdir)
  output_paths.check_output_file('result_json', FLAGS.result_json)
  # Made at the first trace, after the graph is built (half a minute):
  # failed there with a traceback, exit 1.
  output_paths.check_output_folder('profile_logdir', FLAGS.profile_logdir)
  common_flags.require(FLAGS.dataset_dir, 'dataset_dir',
                       ': the folder of the TFRecords (see deeplab-build-data)')
  common_flags.refuse_quantisation('quantised training is not supported')
  crop = train_flags.train_crop()
  info = common_flags.dataset_info()
  # pylint: disable=g-import-not-at-top
  from deeplab_train.data import pipeline
  from deeplab_train.evaluation import eval_loop
  from deeplab_train.runtime import checkpoint_state
  from deeplab_train.runtime import validation
  from deeplab_train.train import towers as towers_lib
  # The saved options bind only once a checkpoint was written with them: a
  # run stopped before its first checkpoint may be started again otherwise.
  saved = (config.load_run_config(FLAGS.train_logdir)
           if checkpoint_state.complete_checkpoints(FLAGS.train_logdir)
           else None)
  saved_model, saved_pre, _ = saved or (None, None, None)
  model_options = common_flags.model_options(
      info.num_classes, crop, saved=saved_model,
      num_classes_from=common_flags.classes_source(FLAGS.dataset_dir))
  preprocess = train_flags.preprocess_options(crop, saved_pre)
  train = train_flags.train_options(dataset_info=info)
  if saved is not None:
    config.check_resumable(FLAGS.train_logdir, train)
  runs = run_options()
  towers_on_cpu = any(towers_lib.runs_on_cpu(device) for device in
                      towers_lib.tower_devices(train.num_clones,
                                               train.clone_on_cpu))
  for warning in config.check_training_setup(model_options, train,
                                             towers_on_cpu=towers_on_cpu):
    logging.warning('%s', app.user_message(warning, FLAG_NAMES))
  if train.save_summaries_images and not runs.save_summaries_secs:
    logging.warning('--save_summaries_images: no images are written, as '
                    '--save_summaries_secs=0 writes no summaries; give it a '
                    'number of seconds to see them')
  # Fails now, with the folder named, rather than inside the graph.
  pipeline.split_files(FLAGS.dataset_dir, FLAGS.train_split)
  if runs.validates:
    pipeline.split_files(FLAGS.dataset_dir, runs.eval_split)
    eval_loop.check_scorable(info, runs.eval_split)
    validation.metric_key(runs.best_metric, info)
  return TrainJob(model_options=model_options, train_options=train,
                  run_options=runs, preprocess_options=preprocess,
                  dataset_info=info, dataset_dir=FLAGS.dataset_dir,
                  split=FLAGS.train_split, cluster=cluster,
                  master=FLAGS.master)


def run_job(job, start_time, process_signals=None, result_json=None):
  """Serves (a ps task, until a signal) or trains; returns the RunResult.

  Args:
    job: a ServeJob or TrainJob.
    start_time: time.time() when the command started.
    process_signals: the process's signals.ProcessSignals: forwarded to the
      run (first: stop after the step; second: report and end at once).
    result_json: where the result is also written.
  """
  # Before a ps task gives up its signal handlers: a signal while
  # TensorFlow loads still ends in 'stopped before serving'.
  # pylint: disable=g-import-not-at-top
  from deeplab_train.model import registry
  from deeplab_train.runtime import cluster as cluster_lib
  from deeplab_train.runtime import run as run_lib
  from deeplab_train.runtime import validation
  from deeplab_train.train import inputs
  if isinstance(job, ServeJob):
    if process_signals is not None:
      if process_signals.pending:
        return result_lib.RunResult(
            'ok', result_lib.SIGNAL_PREFIX + process_signals.pending,
            seconds=time.time() - start_time,
            message='stopped before serving (%s)' % process_signals.pending)
      _end_serving_on_signals(process_signals, job.cluster, start_time,
                              result_json)
    cluster_lib.serve(job.cluster)  # until a signal ends the process
  backbone = registry.get(job.model_options.model_variant)
  input_fn = inputs.make_input_fn(
      job.dataset_dir, job.split, job.dataset_info, job.preprocess_options,
      job.train_options.train_batch_size, backbone.mean_pixel,
      seed=job.train_options.seed)
  return run_lib.train(
      job.model_options, job.train_options, job.run_options,
      ignore_label=job.dataset_info.ignore_label, input_fn=input_fn,
      preprocess_options=job.preprocess_options,
      dataset=job.dataset_info.to_dict(), train_split=job.split,
      start_time=start_time, cluster=job.cluster, master=job.master,
      eval_data=(validation.EvalData(job.dataset_dir, job.dataset_info)
                 if job.run_options.validates else None),
      handle_signals=process_signals is None,
      started=(None if process_signals is None else
               functools.partial(_forward_signals, process_signals,
                                 result_json=result_json)))


# How long a cluster task's step may take to end after the first signal
# before the task stops at once: this much, and three times its usual step
# (also for its first step, which warms the graph up). Waiting for its
# session, it has nothing to save.
CLUSTER_STOP_GRACE_SECS = 30
CLUSTER_STOP_GRACE_BEFORE_THE_SESSION_SECS = 5
# A non-chief worker writes no checkpoint.
WORKER_FIRST_NOTICE = ('%s received: stopping after the current step (the '
                       'chief writes the checkpoints; send it again to stop '
                       'at once)')


def _end_serving_on_signals(process_signals, cluster, start_time,
                            result_json):
  """A ps task's SIGTERM/SIGINT, its normal end: the result line, exit 0.
  (Its server's join never hands control back to the main thread; the
  signals' watching thread ends the process.)"""
  def stopped(name):
    result = result_lib.RunResult(
        'ok', result_lib.SIGNAL_PREFIX + name,
        seconds=time.time() - start_time,
        message='parameter server %d (%s) stopped (%s); the chief\'s '
        'checkpoints hold the run' % (cluster.task, cluster.address, name))
    _ending_at_once(lambda: _reported(result, result_json))
  process_signals.connect(
      on_first=stopped, first_notice='%s received: the parameter server '
      'stops')


def _forward_signals(process_signals, run, result_json):
  """The first signal stops `run` after its step; a second one reports
  how far it got and ends the process (signals.py). A cluster task whose
  step does not end (it waits for a ps that is gone, for a synchronous
  step a dead worker holds up, or for the chief) stops at once after a
  grace period, as on a second signal: a batch system's SIGTERM then ends
  it before its SIGKILL. So does one whose step is still waiting a grace
  period past its --max_run_seconds (`_stop_when_stuck_past_budget`)."""
  def stop_now(signum, why=None):
    name = signals.signal_name(signum)
    report(run.stopped_now(result_lib.STOPPED_NOW[name],
                           result_lib.SIGNAL_PREFIX + name, why), result_json)

  def end_on_signal(name, why):
    signum = signal.Signals[name]
    _ending_at_once(lambda: stop_now(signum, why) or
                    signals.exit_code(signum))

  def end_past_budget(why):
    result = run.stopped_now('error', result_lib.TIME_BUDGET, why)
    _ending_at_once(lambda: _reported(result, result_json))

  def on_first(name):
    run.stop.request(result_lib.SIGNAL_PREFIX + name)
    if run.cluster is not None:
      threading.Thread(target=_stop_when_stuck,
                       args=(run, name, functools.partial(end_on_signal,
                                                          name)),
                       name='stop-when-stuck', daemon=True).start()
  process_signals.connect(
      on_first=on_first, on_stop_now=stop_now,
      first_notice=None if run.role.decides_weights else WORKER_FIRST_NOTICE)
  deadline = run.budget_deadline() if run.cluster is not None else None
  if deadline is not None:
    threading.Thread(target=_stop_when_stuck_past_budget,
                     args=(run, deadline, end_past_budget),
                     name='stop-when-stuck-past-budget', daemon=True).start()


def _ending_at_once(report_it):
  """Reports (`report_it()`, which returns the exit code) and ends the
  process with that code (1 when the report failed)."""
  code = app.EXIT_UNEXPECTED
  try:
    code = report_it()
  finally:
    signals.exit_now(code)


def _reported(result, result_json):
  """Reports `result`; its exit code, or 1 when --result_json could not be
  written (a ps stopped so exited 0, its result file missing)."""
  if not report(result, result_json) and result.exit_code == app.EXIT_OK:
    return app.EXIT_UNEXPECTED
  return result.exit_code


def _stuck_grace(run):
  """How long a cluster task's step may wait before it is taken as stuck
  (see CLUSTER_STOP_GRACE_SECS)."""
  in_session, seconds_per_step = run.session_progress()
  return (CLUSTER_STOP_GRACE_SECS + 3 * (seconds_per_step or 0)
          if in_session else CLUSTER_STOP_GRACE_BEFORE_THE_SESSION_SECS)


def _stop_when_stuck(run, name, end):
  """Calls end(why), which ends the process, if it is still running after
  the grace period."""
  start = time.time()
  while True:
    time.sleep(0.5)
    grace = _stuck_grace(run)
    if time.time() - start >= grace:
      break
  why = ('%s, and no step ended within %.0f s: waiting for another task of '
         'the cluster' % (name, grace))
  logging.warning('stopping at once: %s', why)
  end(why)


# Before any step ended, how long one may take past the time budget
# (graph warm-up, a synchronous chief waiting for a worker still starting;
# xception's first step on a CPU) before it is taken as stuck.
FIRST_STEP_GRACE_SECS = 300


def _budget_grace(run):
  """How long a step may wait past the time budget: the signal's grace,
  with three of the longest step so far (FIRST_STEP_GRACE_SECS before
  the first ended: the usual step time is known only from log lines)."""
  longest = run.longest_step()
  if longest is None:
    return FIRST_STEP_GRACE_SECS
  return CLUSTER_STOP_GRACE_SECS + 3 * longest


def _stop_when_stuck_past_budget(run, deadline, end, poll_secs=0.5):
  """Calls end(why), which ends the process, when a training step has
  waited a grace period past the `deadline` of --max_run_seconds (a
  synchronous chief's step held up by a dead worker, any task's by a ps
  that is gone). The time budget stops a run only between steps: such a
  task ran past its budget until a signal came. The final checkpoint is
  not written (the step holds the session); the last one written stands.
  Work between steps (a validation, the final save) is not a stuck step."""
  while True:
    time.sleep(poll_secs)
    now = time.time()
    began = run.step_began()
    if now < deadline or began is None:
      continue
    waited = now - max(began, deadline)
    if waited >= _budget_grace(run):
      break
  why = ('--max_run_seconds passed %.0f s ago, and the step under way has '
         'waited since for another task of the cluster (a worker or ps '
         'gone?)' % (now - deadline))
  logging.warning('stopping at once: %s', why)
  end(why)


def report(result, result_json=None):
  """Prints the JSON result line (and the error line); writes result_json.

  Returns:
    False when result_json could not be written (see app.report_result).
  """
  return app.report_result(COMMAND, result, result_json, FLAG_NAMES)


def main(argv):
  start = time.time()
  logging.set_verbosity(logging.INFO)
  # Read before anything can fail: a bad-input result is written there too.
  result_json = FLAGS.result_json
  # Set by run() (the command), not when main() is called in-process.
  process_signals = signals.current()
  try:
    if len(argv) > 1:
      raise config.ConfigError('unexpected arguments %s (flags are written '
                               '--name=value)' % ' '.join(argv[1:]))
    with app.flag_terms_in_logs(FLAG_NAMES):
      result = run_job(options_from_flags(), start, process_signals,
                       result_json)
  except config.ConfigError as e:
    result = result_lib.RunResult('bad_input', 'bad_input',
                                  seconds=time.time() - start,
                                  message=str(e), detail=e)
  except atomic.OutputNotWrittenError as e:
    # A full disk (or the like) before or outside a checkpoint: no traceback.
    result = result_lib.RunResult('error', 'error',
                                  seconds=time.time() - start, message=str(e))
  except Exception as e:  # pylint: disable=broad-except
    logging.exception('%s failed', COMMAND)
    result = result_lib.RunResult('error', 'error',
                                  seconds=time.time() - start,
                                  message='%s: %s' % (type(e).__name__, e))
  return _reported(result, result_json)


def _print_bad_flags(message):
  print(result_lib.RunResult('bad_input', 'bad_input',
                             message=message).to_json(), flush=True)


_parse_flags = app.flag_parser(COMMAND, on_bad_flags=_print_bad_flags)


def run():
  # Done already when started by the console script.
  launch.install_signals(sys.argv)
  app.start(COMMAND, main, __doc__,
            (__name__, train_flags.__name__, common_flags.__name__),
            on_bad_flags=_print_bad_flags)


if __name__ == '__main__':
  run()
