"""The benchmark's measurements: matmul peak, FLOPs of a graph, input
pipeline rate, timed and traced training steps, peak memory (see the
package docstring for how each is counted)."""
import dataclasses
import resource
import time
from typing import Callable, Optional

import numpy as np
import tensorflow.compat.v1 as tf

_DEPTHWISE_GRADIENTS = ('DepthwiseConv2dNativeBackpropInput',
                        'DepthwiseConv2dNativeBackpropFilter')


def peak_rss_gib():
  """Peak resident memory of this process so far, GiB (Linux: KiB units)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2.0 ** 20


def _cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def matmul_peak_gflops(size=2048, runs=10, dtype=tf.float32,
                       session_config=None):
  """GFLOP/s of the fastest of `runs` [size, size] x [size, size] matmuls.

  Args:
    size: matrix side.
    runs: timed runs (after two untimed ones).
    dtype: tf.float32 or tf.bfloat16.
    session_config: ConfigProto (threads); must not enable a precision
      rewrite, or the fp32 figure would be a bf16 one.

  Returns:
    float GFLOP/s (2 * size**3 FLOPs per matmul).
  """
  graph = tf.Graph()
  with graph.as_default():
    init = tf.random.uniform([size, size], seed=1)
    a = tf.Variable(tf.cast(init, dtype), name='a')
    b = tf.Variable(tf.cast(tf.transpose(init), dtype), name='b')
    product = tf.matmul(a, b)
    init_op = tf.global_variables_initializer()
  with tf.Session(graph=graph, config=session_config) as sess:
    sess.run(init_op)
    for _ in range(2):
      sess.run(product.op)
    best = float('inf')
    for _ in range(runs):
      start = time.perf_counter()
      sess.run(product.op)  # no fetch: the copy out would be timed too
      best = min(best, time.perf_counter() - start)
  return 2.0 * size ** 3 / best / 1e9


def _static_shape(tensor):
  shape = tensor.shape
  if shape.rank is None or not shape.is_fully_defined():
    return None
  return shape.as_list()


def depthwise_gradient_flops(graph):
  """FLOPs of the depthwise-convolution gradients, which tf.profiler skips.

  Each costs what the forward depthwise convolution costs: two FLOPs per
  multiply-add, one multiply-add per output-gradient element and filter
  tap. Ops with unknown shapes count 0.
  """
  total = 0
  for op in graph.get_operations():
    if op.type not in _DEPTHWISE_GRADIENTS:
      continue
    out_grad = _static_shape(op.inputs[2])
    if op.type == 'DepthwiseConv2dNativeBackpropInput':
      filter_shape = _static_shape(op.inputs[1])
    else:
      filter_shape = _static_shape(op.outputs[0])
    if out_grad is None or filter_shape is None:
      continue
    total += 2 * int(np.prod(out_grad)) * filter_shape[0] * filter_shape[1]
  return total


def graph_flops(graph):
  """FLOPs of one run of everything in `graph` (see the package docstring)."""
  builder = tf.profiler.ProfileOptionBuilder
  options = builder(builder.float_operation()).with_empty_output().build()
  profile = tf.profiler.profile(graph, options=options)
  return int(profile.total_float_ops) + depthwise_gradient_flops(graph)


def input_pipeline_rate(dataset_fn, batch_size, batches, warmup_batches,
                        session_config=None):
  """Images/s of the input pipeline alone.

  Args:
    dataset_fn: fn() -> tf.data.Dataset of training batches (called in a
      new graph).
    batch_size: images per batch.
    batches: timed batches.
    warmup_batches: untimed batches first (fills the prefetch buffers).
    session_config: ConfigProto.

  Returns:
    float images/s.
  """
  graph = tf.Graph()
  with graph.as_default():
    samples = tf.data.make_one_shot_iterator(dataset_fn()).get_next()
    # Run the op without fetching: copying the batch out to numpy is not
    # part of training.
    next_op = samples['image'].op
  with tf.Session(graph=graph, config=session_config) as sess:
    for _ in range(warmup_batches):
      sess.run(next_op)
    start = time.perf_counter()
    for _ in range(batches):
      sess.run(next_op)
    seconds = time.perf_counter() - start
  return batches * batch_size / seconds


def input_wait_seconds(run_metadata):
  """Seconds the step spent in IteratorGetNext (waiting for a batch)."""
  total = 0
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      name = node.node_name.split(':')[0]
      if name.endswith('IteratorGetNext'):
        total += node.all_end_rel_micros
  return total / 1e6


@dataclasses.dataclass
class TrainingTimes:
  """What `time_training` measured."""
  seconds_per_step: float
  first_step_seconds: float
  cores_used: float
  input_wait_seconds_per_step: Optional[float]
  input_wait_fraction: Optional[float]
  first_loss: float
  last_loss: float


def time_training(graph, train_op, loss, session_config, options,
                  init_fn: Optional[Callable] = None):
  """Runs warm-up, timed and traced training steps.

  Args:
    graph: the training tf.Graph.
    train_op: the op of one step.
    loss: scalar loss tensor (fetched every step, as the trainer's hooks
      do).
    session_config: ConfigProto of the session.
    options: BenchOptions.
    init_fn: fn(session) run after variable initialisation, or None.

  Returns:
    TrainingTimes.
  """
  with graph.as_default():
    init_ops = [tf.global_variables_initializer(),
                tf.local_variables_initializer(), tf.tables_initializer()]
  with tf.Session(graph=graph, config=session_config) as sess:
    sess.run(init_ops)
    if init_fn is not None:
      init_fn(sess)
    start = time.perf_counter()
    first_loss = sess.run([train_op, loss])[1]
    first_step = time.perf_counter() - start
    for _ in range(max(0, options.warmup_steps - 1)):
      sess.run(train_op)
    cpu_start, start = _cpu_seconds(), time.perf_counter()
    for _ in range(options.steps):
      last_loss = sess.run([train_op, loss])[1]
    seconds = time.perf_counter() - start
    cores = (_cpu_seconds() - cpu_start) / seconds
    wait = 0.0
    trace = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
    for _ in range(options.trace_steps):
      metadata = tf.RunMetadata()
      sess.run(train_op, options=trace, run_metadata=metadata)
      wait += input_wait_seconds(metadata)
  n = options.trace_steps
  step = seconds / options.steps
  # The share of the untimed step the table shows beside it, not of the
  # traced steps: a full trace makes a step 2 to 40 times slower.
  wait_per_step = wait / n if n else None
  return TrainingTimes(
      seconds_per_step=step, first_step_seconds=first_step, cores_used=cores,
      input_wait_seconds_per_step=wait_per_step,
      input_wait_fraction=(min(1., wait_per_step / step) if n else None),
      first_loss=float(first_loss), last_loss=float(last_loss))
