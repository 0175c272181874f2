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

Exit codes:
  0   finished (training_number_of_steps or --num_steps_more reached), time
      budget used up, stopped by SIGTERM/SIGINT (final checkpoint written),
      or nothing to do (the logdir is already at training_number_of_steps)
  1   unexpected error
  2   bad flags or input (one-line message; no traceback)
  3   non-finite loss (no checkpoint of the broken step is written)
  75  the logdir is locked by a live run (the message names its pid)

On a cluster (TensorFlow's parameter servers and workers, see
docs/distributed.md) every task runs the same command with its own
--job_name and --task (or its own TF_CONFIG):

    deeplab-train ... --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 \\
        --job_name=worker --task=0 [--sync_replicas=false]

A ps task serves until killed; worker 0 (the chief) initialises, writes the
checkpoints and summaries and holds the logdir lock; the other workers
report no checkpoint.
"""
import os
import sys
import time

from absl import flags
from absl import logging

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.data import datasets
from deeplab_train.data import pipeline
from deeplab_train.model import registry
from deeplab_train.runtime import cluster as cluster_lib
from deeplab_train.runtime import cluster_spec
from deeplab_train.train import inputs
from deeplab_train.runtime import result as result_lib
from deeplab_train.runtime import run as run_lib

FLAGS = flags.FLAGS
COMMAND = 'deeplab-train'

# Towers.
flags.DEFINE_integer('num_clones', 1, 'Number of clones (towers) to deploy; '
                     'the batch is split evenly between them.')
flags.DEFINE_boolean('clone_on_cpu', False, 'Use CPUs to deploy clones.')

# Clusters (TensorFlow's distributed runtime; or the TF_CONFIG variable).
flags.DEFINE_list('ps_hosts', [],
                  'host:port of each parameter-server task, comma-separated.')
flags.DEFINE_list('worker_hosts', [],
                  'host:port of each worker task, comma-separated; the first '
                  'is the chief.')
flags.DEFINE_string('master', '',
                    'Address of a TensorFlow server to run the session on '
                    '(the original\'s flag; leave empty for in-process, and '
                    'use --ps_hosts/--worker_hosts or TF_CONFIG for clusters).')
flags.DEFINE_string('job_name', None, 'This task\'s job: ps or worker.')
flags.DEFINE_integer('task', 0, 'The task ID (index in its job).')
flags.DEFINE_boolean('sync_replicas', True,
                     'Cluster: synchronous updates (each averages a gradient '
                     'of every worker); false: asynchronous.')
flags.DEFINE_integer('num_replicas', 1,
                     'Number of worker replicas (follows --worker_hosts or '
                     'TF_CONFIG; a given value must match it).')
flags.DEFINE_integer('num_ps_tasks', 0,
                     'The number of parameter servers (follows --ps_hosts or '
                     'TF_CONFIG; a given value must match it).')
flags.DEFINE_integer('startup_delay_steps', 15,
                     'Number of training steps between replicas startup '
                     '(asynchronous mode: worker i starts at step i times '
                     'this).')

# Logging, checkpoints, stopping.
flags.DEFINE_string('train_logdir', None,
                    'Where the checkpoints and logs are stored (required).')
flags.DEFINE_integer('log_steps', 10,
                     'Display logging information at every log_steps.')
flags.DEFINE_integer('save_interval_secs', 1200,
                     'How often, in seconds, we save the model to disk '
                     '(0: not by time).')
flags.DEFINE_integer('save_interval_steps', None,
                     'Also save the model every this many steps.')
flags.DEFINE_integer('keep_checkpoint_max', 5,
                     'Number of recent checkpoints kept in train_logdir.')
flags.DEFINE_integer('save_summaries_secs', 600,
                     'How often, in seconds, we compute the summaries '
                     '(0: never).')
flags.DEFINE_boolean('save_summaries_images', False,
                     'Save sample inputs, labels, and semantic predictions as '
                     'images to summary.')
flags.DEFINE_string('profile_logdir', None,
                    'Where Chrome traces (timeline-STEP.json) of one step in '
                    'every %d are written, the first after %d steps.'
                    % (run_lib.PROFILE_STEPS, run_lib.PROFILE_STEPS))
flags.DEFINE_float('max_run_seconds', None,
                   'Stop (with a final checkpoint, exit 0) after this many '
                   'seconds of wall time.')
flags.DEFINE_integer('num_steps_more', None,
                     'Train this many steps past the checkpoint in '
                     'train_logdir, then stop (never past '
                     'training_number_of_steps).')
flags.DEFINE_string('result_json', None,
                    'Also write the final JSON result line to this file.')

# Optimisation.
flags.DEFINE_enum('learning_policy', 'poly', ['poly', 'step', 'cosine'],
                  'Learning rate policy for training.')
flags.DEFINE_float('base_learning_rate', .0001,
                   'The base learning rate for model training.')
flags.DEFINE_float('learning_rate_decay_factor', 0.1,
                   'The rate to decay the base learning rate.')
flags.DEFINE_integer('learning_rate_decay_step', 2000,
                     'Decay the base learning rate at a fixed step.')
flags.DEFINE_float('learning_power', 0.9,
                   'The power value used in the poly learning policy.')
flags.DEFINE_float('decay_steps', 0.0,
                   'Decay steps of the poly learning rate (0: the steps '
                   'after the slow start).')
flags.DEFINE_float('end_learning_rate', 0.0,
                   'The poly learning rate\'s value at the end of its decay.')
flags.DEFINE_enum('optimizer', 'momentum', ['momentum', 'adam'],
                  'Which optimizer to use.')
flags.DEFINE_float('adam_learning_rate', 0.001,
                   'Adam\'s (constant) learning rate.')
flags.DEFINE_float('adam_epsilon', 1e-08, 'Adam optimizer epsilon.')
flags.DEFINE_integer('seed', None,
                     'Random seed of the initialisation, input order and '
                     'augmentation (unset: random).')
flags.DEFINE_integer('training_number_of_steps', 30000,
                     'The number of steps used for training.')
flags.DEFINE_float('momentum', 0.9, 'The momentum value to use.')
flags.DEFINE_integer('train_batch_size', 8,
                     'The number of images in each batch during training '
                     '(all clones together).')
flags.DEFINE_float('weight_decay', None,
                   'The value of the weight decay for training (default: '
                   'the backbone family\'s, 0.00004 for every built-in one, '
                   'as the original).')
flags.DEFINE_list('train_crop_size', '513,513',
                  'Image crop size [height, width] during training; each a '
                  'multiple of output_stride plus 1.')
flags.DEFINE_float('last_layer_gradient_multiplier', 1.0,
                   'The gradient multiplier for last layers, which is used to '
                   'boost the gradient of last layers if the value > 1.')
flags.DEFINE_boolean('upsample_logits', True,
                     'Upsample logits during training.')
flags.DEFINE_multi_float('label_weights', None,
                         'One loss weight per class (repeat the flag); unset: '
                         'all 1.')
flags.DEFINE_integer('slow_start_step', 0,
                     'Training model with small learning rate for few steps.')
flags.DEFINE_float('slow_start_learning_rate', 1e-4,
                   'Learning rate employed during slow start.')
flags.DEFINE_boolean('fine_tune_batch_norm', True,
                     'Fine tune the batch norm parameters or not (needs 12 or '
                     'more images per clone).')
flags.DEFINE_integer('hard_example_mining_step', 0,
                     'The training step in which exact hard example mining '
                     'kicks off; the mining percent shrinks from 100% to '
                     'top_k_percent_pixels until then.')
flags.DEFINE_float('top_k_percent_pixels', 1.0,
                   'The top k percent pixels (in terms of the loss values) '
                   'used to compute loss during training.')
flags.DEFINE_float('drop_path_keep_prob', 1.0,
                   'NAS drop path (NAS backbones are not supported: only 1.0 '
                   'is accepted).')
flags.DEFINE_integer('quantize_delay_step', -1,
                     'Quantised training (not supported: only -1 is '
                     'accepted).')

# Speed (see deeplab-bench to measure them).
flags.DEFINE_enum('mixed_precision', 'none',
                  list(config.MIXED_PRECISION_MODES),
                  'Low-precision compute with fp32 variables, logits and '
                  'loss: bf16 (CPUs with AVX512_BF16/AMX; oneDNN rewrite) or '
                  'fp16 (GPUs; with dynamic loss scaling).')
flags.DEFINE_boolean('use_xla', False,
                     'Compile the network and its gradients with XLA (for '
                     'GPUs; on CPUs XLA is about 10x slower here).')
flags.DEFINE_integer('intra_op_parallelism_threads', None,
                     'Threads inside one op (unset: every usable core; 0: '
                     'TensorFlow decides).')
flags.DEFINE_integer('inter_op_parallelism_threads', None,
                     'Ops run at once (unset: every usable core; 0: '
                     'TensorFlow decides).')

# Fine-tuning.
flags.DEFINE_string('tf_initial_checkpoint', None,
                    'The initial checkpoint (a prefix, or a directory: its '
                    'latest checkpoint); ignored when train_logdir already '
                    'holds one.')
flags.DEFINE_boolean('initialize_last_layer', True,
                     'Initialize the last layer from tf_initial_checkpoint.')
flags.DEFINE_boolean('last_layers_contain_logits_only', False,
                     'Only consider logits as last layers or not.')

# Dataset and augmentation.
flags.DEFINE_string('train_split', 'train',
                    'Which split of the dataset to be used for training.')
flags.DEFINE_float('min_scale_factor', 0.5,
                   'Mininum scale factor for data augmentation.')
flags.DEFINE_float('max_scale_factor', 2.,
                   'Maximum scale factor for data augmentation.')
flags.DEFINE_float('scale_factor_step_size', 0.25,
                   'Scale factor step size for data augmentation.')


def _require(value, flag, what):
  if not value:
    raise config.ConfigError('--%s is required: %s' % (flag, what))


def _check_unsupported():
  if FLAGS.drop_path_keep_prob != 1.0:
    raise config.ConfigError('--drop_path_keep_prob is for NAS backbones, '
                             'which deeplab-train does not support')
  if FLAGS.quantize_delay_step >= 0:
    raise config.ConfigError('--quantize_delay_step: quantised training is '
                             'not supported')


def train_options():
  """TrainOptions from the flags."""
  return config.TrainOptions(
      train_batch_size=FLAGS.train_batch_size,
      num_clones=FLAGS.num_clones, clone_on_cpu=FLAGS.clone_on_cpu,
      weight_decay=FLAGS.weight_decay, momentum=FLAGS.momentum,
      fine_tune_batch_norm=FLAGS.fine_tune_batch_norm,
      image_pyramid=FLAGS.image_pyramid,
      upsample_logits=FLAGS.upsample_logits,
      label_weights=FLAGS.label_weights,
      top_k_percent_pixels=FLAGS.top_k_percent_pixels,
      hard_example_mining_step=FLAGS.hard_example_mining_step,
      learning_policy=FLAGS.learning_policy,
      base_learning_rate=FLAGS.base_learning_rate,
      learning_rate_decay_factor=FLAGS.learning_rate_decay_factor,
      learning_rate_decay_step=FLAGS.learning_rate_decay_step,
      learning_power=FLAGS.learning_power,
      training_number_of_steps=FLAGS.training_number_of_steps,
      slow_start_step=FLAGS.slow_start_step,
      slow_start_learning_rate=FLAGS.slow_start_learning_rate,
      decay_steps=FLAGS.decay_steps,
      end_learning_rate=FLAGS.end_learning_rate,
      optimizer=FLAGS.optimizer, adam_learning_rate=FLAGS.adam_learning_rate,
      adam_epsilon=FLAGS.adam_epsilon, seed=FLAGS.seed,
      last_layer_gradient_multiplier=FLAGS.last_layer_gradient_multiplier,
      last_layers_contain_logits_only=FLAGS.last_layers_contain_logits_only,
      tf_initial_checkpoint=FLAGS.tf_initial_checkpoint,
      initialize_last_layer=FLAGS.initialize_last_layer,
      save_summaries_images=FLAGS.save_summaries_images,
      mixed_precision=FLAGS.mixed_precision, use_xla=FLAGS.use_xla,
      intra_op_parallelism_threads=FLAGS.intra_op_parallelism_threads,
      inter_op_parallelism_threads=(
          FLAGS.inter_op_parallelism_threads)).validate()


def run_options():
  """RunOptions from the flags."""
  return config.RunOptions(
      train_logdir=FLAGS.train_logdir, log_steps=FLAGS.log_steps,
      save_interval_secs=FLAGS.save_interval_secs,
      save_interval_steps=FLAGS.save_interval_steps,
      save_summaries_secs=FLAGS.save_summaries_secs,
      keep_checkpoint_max=FLAGS.keep_checkpoint_max,
      max_run_seconds=FLAGS.max_run_seconds,
      num_steps_more=FLAGS.num_steps_more,
      profile_logdir=FLAGS.profile_logdir,
      result_json=FLAGS.result_json).validate()


def cluster_options():
  """ClusterOptions from the flags (the replica counts only when given)."""
  given = lambda name: (FLAGS[name].value
                        if common_flags.explicitly_set(name) else None)
  return config.ClusterOptions(
      ps_hosts=FLAGS.ps_hosts, worker_hosts=FLAGS.worker_hosts,
      job_name=FLAGS.job_name, task=FLAGS.task,
      sync_replicas=FLAGS.sync_replicas,
      num_replicas=given('num_replicas'), num_ps_tasks=given('num_ps_tasks'),
      startup_delay_steps=FLAGS.startup_delay_steps).validate()


def build_job():
  """Every option checked, before any graph: a dict for run_lib.train.

  Raises:
    config.ConfigError: bad flags, dataset or saved config.
  """
  _require(FLAGS.train_logdir, 'train_logdir',
           'the folder for checkpoints and summaries')
  _require(FLAGS.dataset_dir, 'dataset_dir',
           'the folder of the TFRecords (see deeplab-build-data)')
  _check_unsupported()
  crop = common_flags.parse_int_list(FLAGS.train_crop_size, 'train_crop_size')
  if len(crop) != 2 or min(crop) < 1:
    raise config.ConfigError('--train_crop_size must be HEIGHT,WIDTH, got %s'
                             % ','.join(FLAGS.train_crop_size))
  info = datasets.load_dataset_info(FLAGS.dataset, FLAGS.dataset_dir)
  saved = config.load_run_config(FLAGS.train_logdir)
  model_options = common_flags.model_options(
      info.num_classes, crop, saved=saved[0] if saved else None)
  preprocess = config.PreprocessOptions(
      crop_size=crop, min_scale_factor=FLAGS.min_scale_factor,
      max_scale_factor=FLAGS.max_scale_factor,
      scale_factor_step_size=FLAGS.scale_factor_step_size,
      **common_flags.resize_values(saved[1] if saved else None)).validate()
  train = train_options()
  runs = run_options()
  for warning in config.check_training_setup(model_options, train):
    logging.warning('%s', warning)
  # Fails now, with the folder named, rather than inside the graph.
  pipeline.split_files(FLAGS.dataset_dir, FLAGS.train_split)
  backbone = registry.get(model_options.model_variant)
  input_fn = inputs.make_input_fn(
      FLAGS.dataset_dir, FLAGS.train_split, info, preprocess,
      train.train_batch_size, backbone.mean_pixel, seed=train.seed)
  return dict(model_options=model_options, train_options=train,
              run_options=runs, ignore_label=info.ignore_label,
              input_fn=input_fn, preprocess_options=preprocess,
              dataset=info.to_dict())


def report(result, result_json=None):
  """Prints the JSON result line (and the error line); writes result_json."""
  if result.status != 'ok':
    sys.stderr.write('%s: %s\n' % (COMMAND, result.message))
  print(result.to_json(), flush=True)
  if result_json:
    try:
      result_lib.write_result_json(result, result_json)
    except OSError as e:
      logging.error('cannot write --result_json=%s: %s', result_json, e)


def main(argv):
  start = time.time()
  logging.set_verbosity(logging.INFO)
  try:
    if len(argv) > 1:
      raise config.ConfigError('unexpected arguments %s (flags are written '
                               '--name=value)' % ' '.join(argv[1:]))
    cluster = cluster_spec.resolve(cluster_options(),
                                  os.environ.get(cluster_spec.TF_CONFIG))
    if cluster is not None and cluster.is_ps:
      cluster_lib.serve(cluster)  # until killed
    if FLAGS.master and cluster is not None:
      raise config.ConfigError(
          '--master cannot be combined with a cluster (--ps_hosts/'
          '--worker_hosts or TF_CONFIG): the cluster names the servers')
    job = build_job()
    result = run_lib.train(start_time=start, cluster=cluster,
                           master=FLAGS.master, **job)
  except config.ConfigError as e:
    result = result_lib.RunResult('bad_input', 'bad_input',
                               seconds=time.time() - start, message=str(e))
  except Exception as e:  # pylint: disable=broad-except
    logging.exception('%s failed', COMMAND)
    result = result_lib.RunResult('error', 'error', seconds=time.time() - start,
                               message='%s: %s' % (type(e).__name__, e))
  report(result, FLAGS.result_json)
  return result.exit_code


def _print_bad_flags(message):
  print(result_lib.RunResult('bad_input', 'bad_input',
                          message=message).to_json(), flush=True)


_parse_flags = app.flag_parser(COMMAND, on_bad_flags=_print_bad_flags)


def run():
  app.start(COMMAND, main, __doc__, (__name__, common_flags.__name__),
            on_bad_flags=_print_bad_flags)


if __name__ == '__main__':
  run()
