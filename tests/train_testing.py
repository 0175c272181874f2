"""Helpers for the trainer tests: tiny models and inputs, sample TFRecords,
running deeplab-train in a subprocess, reading checkpoints."""
import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import time

from absl import flags
import numpy as np
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.data import build
from deeplab_train.model import layers
import timeouts

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / 'data'
NUM_CLASSES = 5


def tiny_model_options(num_classes=NUM_CLASSES, crop=33, output_stride=16,
                       decoder=None):
  """mobilenet_v2 at depth 0.25: the smallest real DeepLab."""
  return config.ModelOptions(
      num_classes=num_classes, model_variant='mobilenet_v2',
      crop_size=(crop, crop), output_stride=output_stride,
      decoder_output_stride=decoder, depth_multiplier=0.25).validate()


def toy_model_fn(num_classes=NUM_CLASSES, weight_decay=1e-4, extra=None):
  """A two-conv stand-in for DeepLab with slim names ('features' with BN,
  'logits/semantic' with biases); `extra(logits)` may modify the logits."""
  def model_fn(images):
    conv = layers.ConvParams(weight_decay=weight_decay, weights_stddev=0.1)
    x = images / 127.5 - 1.0
    x = layers.conv2d(x, 8, 3, conv, 'features', stride=2)
    with tf.variable_scope('logits'):
      logits = layers.conv2d(x, num_classes, 1,
                             conv.replace(batch_norm=None), 'semantic',
                             activation=None)
    if extra is not None:
      logits = extra(logits)
    return {'merged_logits': logits}
  return model_fn


def synthetic_batch(batch, size, num_classes=NUM_CLASSES, seed=0,
                    ignore_label=None):
  """(images float32 [B,S,S,3] in 0..255, labels int32 [B,S,S,1])."""
  rng = np.random.RandomState(seed)
  images = rng.uniform(0, 255, (batch, size, size, 3)).astype(np.float32)
  tiles = rng.randint(0, num_classes, (batch, size // 8 + 1, size // 8 + 1))
  labels = np.kron(tiles, np.ones((1, 8, 8), np.int64))[:, :size, :size]
  if ignore_label is not None:
    labels[:, :2, :] = ignore_label
  return images, labels[..., None].astype(np.int32)


def constant_input_fn(images, labels):
  """input_fn giving the same batch at every step."""
  def input_fn():
    return {'image': tf.constant(images), 'label': tf.constant(labels)}
  return input_fn


def train_steps(options, watched, steps=2, batch=2, train_options=None):
  """Trains `options` (crop_size set, square) `steps` steps on CPU from a
  fresh initialisation (seed 0, batch norm trained) on a constant synthetic
  batch.

  Returns:
    (the total loss of each step, the global step after them, the values of
    variable `watched` (an op name) before and after).
  """
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.train import graph as graph_lib
  size = options.crop_size[0]
  train = train_options or config.TrainOptions(
      train_batch_size=batch, fine_tune_batch_norm=True, seed=0).validate()
  images, labels = synthetic_batch(batch, size,
                                   num_classes=options.num_classes)
  g = graph_lib.build_training_graph(
      options, train, ignore_label=255,
      input_fn=constant_input_fn(images, labels), device_pattern='/cpu:%d')
  variables = g.graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
  (weights,) = [v for v in variables if v.op.name == watched]
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.variables_initializer(variables))
    before = sess.run(weights)
    losses = [sess.run([g.train_op, g.total_loss])[1] for _ in range(steps)]
    return losses, int(sess.run(g.global_step)), (before, sess.run(weights))


def make_tfrecords(out_dir, count=4, split='train', num_classes=NUM_CLASSES):
  """A few sample images converted with the data package's converter."""
  entries = [build.Entry('train_%04d' % i,
                         str(SAMPLE / 'JPEGImages' / ('train_%04d.jpg' % i)),
                         str(SAMPLE / 'SegmentationClass'
                             / ('train_%04d.png' % i)))
             for i in range(count)]
  options = build.BuildOptions(num_classes=num_classes, ignore_label=255,
                               dataset_name='shapes', num_shards=1,
                               num_workers=1)
  return build.convert({split: entries}, str(out_dir), options)


def subprocess_env():
  env = dict(os.environ)
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env['PYTHONPATH'] = str(REPO) + os.pathsep + env.get('PYTHONPATH', '')
  return env


def tiny_cli_args(logdir, dataset_dir, steps, *extra):
  """deeplab-train flags for the tiny model on the sample records."""
  return ['--train_logdir=%s' % logdir, '--dataset_dir=%s' % dataset_dir,
          '--dataset=shapes', '--train_crop_size=33,33',
          '--train_batch_size=2', '--depth_multiplier=0.25',
          '--output_stride=16', '--fine_tune_batch_norm=false',
          '--min_scale_factor=1', '--max_scale_factor=1',
          '--scale_factor_step_size=0', '--base_learning_rate=0.003',
          '--training_number_of_steps=%d' % steps, '--log_steps=1',
          '--save_summaries_secs=0'] + list(extra)


# What the deeplab-train console script runs (setup.cfg), without needing
# the script installed: signal handlers first, then the command.
LAUNCH = 'from deeplab_train.cli import launch; launch.train()'


def start_cli(args, log_dir, launch=LAUNCH):
  """Starts deeplab-train ARGS as its console script does (cli/launch.py),
  its stdout and stderr going to files in `log_dir` (a pipe could fill up
  and block it). `launch`: the Python code run, LAUNCH or a variant."""
  log_dir = pathlib.Path(log_dir)
  log_dir.mkdir(parents=True, exist_ok=True)
  out = open(log_dir / 'stdout.txt', 'w')
  err = open(log_dir / 'stderr.txt', 'w')
  proc = subprocess.Popen(
      [sys.executable, '-c', launch] + list(args),
      stdout=out, stderr=err, text=True, env=subprocess_env(), cwd=str(REPO))
  proc.log_dir = log_dir
  out.close()
  err.close()
  return proc


def finish(proc, timeout=timeouts.HANG_SECONDS):
  """(exit code, result dict or None, stderr text) of a started run."""
  proc.wait(timeout=timeout)
  out = (proc.log_dir / 'stdout.txt').read_text()
  err = (proc.log_dir / 'stderr.txt').read_text()
  result = None
  for line in out.splitlines():
    if line.startswith('{') and '"event": "result"' in line:
      result = json.loads(line)
  return proc.returncode, result, err


def dead_pid():
  """The pid of a process of this host that has ended."""
  process = subprocess.Popen([sys.executable, '-c', 'pass'])
  process.wait()
  return process.pid


def main_in_process(command, main, args):
  """Runs a command's main() in this process on the flags `args` (parsed
  anew, reset after): (exit code, stdout text, last JSON line as a dict)."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS([command] + list(args))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      code = main([command])
  finally:
    flags.FLAGS.unparse_flags()
  text = stdout.getvalue()
  lines = [l for l in text.splitlines() if l.startswith('{')]
  return code, text, json.loads(lines[-1])


def run_cli(args, log_dir, timeout=timeouts.HANG_SECONDS):
  return finish(start_cli(args, log_dir), timeout)


def wait_for(predicate, timeout=timeouts.HANG_SECONDS, interval=0.1,
             proc=None):
  """Polls until predicate() is true; fails on timeout or if proc exits."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    if proc is not None and proc.poll() is not None:
      raise AssertionError('process exited early:\n%s' % (
          proc.log_dir / 'stderr.txt').read_text()[-3000:])
    time.sleep(interval)
  raise AssertionError('timed out waiting')


def checkpoint_steps(logdir):
  """Steps of the checkpoints listed in the logdir's state file."""
  state = tf.train.get_checkpoint_state(str(logdir))
  if state is None:
    return []
  return sorted(int(p.rsplit('-', 1)[1])
                for p in state.all_model_checkpoint_paths)


def latest_step(logdir):
  prefix = tf.train.latest_checkpoint(str(logdir))
  return None if prefix is None else int(prefix.rsplit('-', 1)[1])


def assign_from_values(graph, variables, value_fn):
  """(op, feeds): running op with feeds sets each variable to
  value_fn(variable); build it once to set the same values many times."""
  with graph.as_default():
    feeds, assigns = {}, []
    for var in variables:
      ph = tf.placeholder(var.dtype.base_dtype, var.shape)
      assigns.append(tf.assign(var, ph))
      feeds[ph] = value_fn(var)
    return tf.group(*assigns), feeds


def load_values(session, variables, value_fn):
  """Sets each variable to value_fn(variable) in one run (Variable.load
  would add an op per call)."""
  session.run(*assign_from_values(session.graph, variables, value_fn))


def read_checkpoint(prefix):
  """{name: value} of every tensor in a checkpoint."""
  reader = tf.train.NewCheckpointReader(str(prefix))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}
