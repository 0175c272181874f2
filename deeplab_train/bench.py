"""Training speed benchmark behind `deeplab-bench`.

For one model config, crop and batch, `run_benchmark` measures in one
process:

  (a) the input pipeline alone: images/s of `pipeline.make_dataset`;
  (b) training: images/s and seconds/step after warm-up, for the graph of
      `build_training_graph` fed by that pipeline;
  (c) FLOPs of one training step and the FLOP/s achieved;
  (d) the machine's fp32 dense peak, measured by a square matmul in the same
      run, and the share of it that training achieves;
  (e) the process's peak resident memory (ru_maxrss);
  (f) the time the towers waited for input.

How (c) is counted: TensorFlow's profiler (`float_operation` options) sums
the FLOPs TensorFlow registers per op type on the static shapes of the
graph actually run: forward and backward of every tower, losses, optimizer.
It has no entry for the two depthwise-convolution gradients, which are
counted here from their shapes (2 * multiply-adds, as the profiler counts
convolutions). Counting the real graph, rather than an analytic formula of
the network, keeps the figure right for every backbone, decoder, tower
count and loss without a second model of the network to maintain.

How (f) is measured: a few extra steps are run with a full trace; the time
of the `IteratorGetNext` op of each traced step is the time the towers
waited for the pipeline (the op returns as soon as a prefetched batch is
ready), reported per step and as a share of the traced step's wall time.

The data is synthetic (VOC-sized JPEGs written to a temp folder), the
bundled sample dataset converted to a temp folder, or an existing TFRecord
folder; all go through the real input pipeline.
"""
import dataclasses
import io
import os
import resource
import time
from typing import Callable, Optional

import numpy as np
from PIL import Image
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train.config import ConfigError
from deeplab_train.data import datasets
from deeplab_train.data import pipeline
from deeplab_train.data import tfrecord

# Every key of the result dict (and of the JSON line), in table order.
RESULT_FIELDS = (
    'model_variant', 'output_stride', 'crop_size', 'batch_size',
    'num_clones', 'fine_tune_batch_norm', 'mixed_precision', 'use_xla',
    'data', 'input_images_per_sec', 'train_images_per_sec',
    'seconds_per_step', 'first_step_seconds', 'gflop_per_step',
    'flop_count_method', 'achieved_gflops', 'peak_gflops',
    'peak_bf16_gflops', 'peak_fraction', 'peak_rss_gib',
    'input_wait_seconds_per_step', 'input_wait_fraction', 'cores_used',
    'first_loss', 'last_loss', 'steps', 'warmup_steps', 'load_average',
    'cpu_count', 'tensorflow_version')

FLOP_COUNT_METHOD = ('tf.profiler float_operation on the training graph + '
                     'depthwise conv gradients from their shapes')

SYNTHETIC_CLASSES = 21
SYNTHETIC_SIZE = (375, 500)  # height, width of a typical PASCAL VOC image
SAMPLE_CLASSES = 5

_DEPTHWISE_GRADIENTS = ('DepthwiseConv2dNativeBackpropInput',
                        'DepthwiseConv2dNativeBackpropFilter')


@dataclasses.dataclass(frozen=True)
class BenchOptions:
  """How long each measurement runs.

  Attributes:
    warmup_steps: training steps before timing (graph rewrites, XLA
      compilation and allocator warm-up happen in the first ones).
    steps: timed training steps.
    trace_steps: extra fully traced steps measuring the input wait.
    input_batches: timed batches of the input pipeline alone.
    input_warmup_batches: batches before timing the pipeline.
    matmul_size: side of the square fp32 matmul measuring the peak.
    matmul_runs: timed matmuls (the fastest one gives the peak).
    bf16_peak: also measure the bfloat16 matmul peak.
  """
  warmup_steps: int = 3
  steps: int = 10
  trace_steps: int = 3
  input_batches: int = 50
  input_warmup_batches: int = 5
  matmul_size: int = 2048
  matmul_runs: int = 10
  bf16_peak: bool = True

  def validate(self):
    """Raises ConfigError naming the flag; returns self."""
    for name in ('warmup_steps', 'trace_steps', 'input_warmup_batches'):
      if getattr(self, name) < 0:
        raise ConfigError('--bench_%s must be >= 0' % name)
    for name in ('steps', 'input_batches', 'matmul_size', 'matmul_runs'):
      if getattr(self, name) < 1:
        raise ConfigError('--bench_%s must be >= 1' % name)
    return self


# ---------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------
def _smooth_noise(rng, height, width, cell=32):
  grid = rng.randint(0, 256, (height // cell + 2, width // cell + 2, 3))
  coarse = Image.fromarray(grid.astype(np.uint8))
  return np.array(coarse.resize((width, height), Image.BILINEAR))


def synthetic_example(rng, index, num_classes, size):
  """One VOC-like record: a smooth image with class rectangles.

  Returns:
    A tf.train.Example in the project's TFRecord schema.
  """
  height, width = size
  if rng.rand() < 0.5:
    height, width = width, height
  image = _smooth_noise(rng, height, width)
  label = np.zeros((height, width), np.uint8)
  for _ in range(rng.randint(1, 4)):
    top, left = rng.randint(0, height // 2), rng.randint(0, width // 2)
    bottom = top + rng.randint(height // 8, height // 2)
    right = left + rng.randint(width // 8, width // 2)
    class_id = rng.randint(1, num_classes)
    label[top:bottom, left:right] = 255  # an ignore border, as in VOC
    label[top + 2:bottom - 2, left + 2:right - 2] = class_id
    image[top + 2:bottom - 2, left + 2:right - 2] = (class_id * 37) % 256
  jpeg, png = io.BytesIO(), io.BytesIO()
  Image.fromarray(image).save(jpeg, format='JPEG', quality=90)
  Image.fromarray(label).save(png, format='PNG')
  return tfrecord.encode_example(jpeg.getvalue(), 'synthetic_%06d' % index,
                                 'jpeg', height, width, png.getvalue())


def write_synthetic_dataset(output_dir, num_images=64, num_shards=4,
                            num_classes=SYNTHETIC_CLASSES,
                            size=SYNTHETIC_SIZE, seed=0, split='train'):
  """Writes `num_images` synthetic records as `split` shards.

  Returns:
    The DatasetInfo of the written data.
  """
  rng = np.random.RandomState(seed)
  for shard in range(num_shards):
    path = os.path.join(output_dir, tfrecord.shard_filename(
        split, shard, num_shards))
    with atomic.writing(path) as tmp:
      with tf.io.TFRecordWriter(tmp) as writer:
        for index in range(shard, num_images, num_shards):
          writer.write(synthetic_example(rng, index, num_classes,
                                         size).SerializeToString())
  return datasets.DatasetInfo(name='synthetic', num_classes=num_classes,
                              ignore_label=255,
                              splits_to_sizes={split: num_images})


def sample_data_folder():
  """The bundled sample dataset (VOC layout) of the source tree.

  Raises:
    ConfigError: not found (e.g. an installed package without the sources).
  """
  package = os.path.dirname(os.path.abspath(__file__))
  folder = os.path.join(os.path.dirname(package), 'data')
  if not os.path.isdir(os.path.join(folder, 'JPEGImages')):
    raise ConfigError('the sample dataset %s is missing (it ships with the '
                      'source tree; make it with scripts/make_sample_data.py)'
                      ' or use synthetic data' % folder)
  return folder


def convert_sample_dataset(output_dir, split='train'):
  """Converts the bundled sample dataset's `split` into `output_dir`.

  Returns:
    The DatasetInfo written.
  """
  from deeplab_train.data import build  # pylint: disable=g-import-not-at-top
  data = sample_data_folder()
  options = build.BuildOptions(num_classes=SAMPLE_CLASSES,
                               dataset_name='sample')
  return build.build_voc(os.path.join(data, 'JPEGImages'),
                         os.path.join(data, 'SegmentationClass'),
                         os.path.join(data, 'ImageSets', 'Segmentation'),
                         output_dir, options, split_name=split)


# ---------------------------------------------------------------------------
# Measurements.
# ---------------------------------------------------------------------------
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
  """FLOPs of one run of everything in `graph` (see the module docstring)."""
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
    wait, traced = 0.0, 0.0
    trace = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
    for _ in range(options.trace_steps):
      metadata = tf.RunMetadata()
      step_start = time.perf_counter()
      sess.run(train_op, options=trace, run_metadata=metadata)
      traced += time.perf_counter() - step_start
      wait += input_wait_seconds(metadata)
  n = options.trace_steps
  return TrainingTimes(
      seconds_per_step=seconds / options.steps,
      first_step_seconds=first_step, cores_used=cores,
      input_wait_seconds_per_step=wait / n if n else None,
      input_wait_fraction=wait / traced if n else None,
      first_loss=float(first_loss), last_loss=float(last_loss))


# ---------------------------------------------------------------------------
# The whole benchmark.
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BenchJob:
  """One benchmark: what to build and how to run it.

  Attributes:
    model_options: ModelOptions (crop_size = the training crop).
    train_options: TrainOptions (batch, towers, BN fine-tuning, ...).
    preprocess_options: PreprocessOptions of the training pipeline.
    dataset_dir: TFRecord folder; dataset_info: its DatasetInfo.
    split: split to read.
    data: label of the data for the report ('synthetic', 'sample', path).
    mixed_precision / use_xla: the settings measured (for the report).
    session_config: ConfigProto of the training session.
    peak_session_config: ConfigProto of the matmul peak and of the input
      pipeline (threads only: no precision rewrite, no XLA).
    build_graph: fn(input_fn) -> the `TrainingGraph` of `build_training_graph`.
    mean_pixel: padding value of the images.
  """
  model_options: object
  train_options: object
  preprocess_options: object
  dataset_dir: str
  dataset_info: object
  split: str
  data: str
  mixed_precision: str
  use_xla: bool
  session_config: object
  peak_session_config: object
  build_graph: Callable
  mean_pixel: tuple = (127.5, 127.5, 127.5)


def run_benchmark(job, options):
  """Measures (a)-(f) of the module docstring for one job.

  Args:
    job: BenchJob.
    options: BenchOptions.

  Returns:
    A dict with every key of RESULT_FIELDS (None where not measured).
  """
  options.validate()
  batch = job.train_options.train_batch_size
  load_start = os.getloadavg()[0]
  peak = matmul_peak_gflops(options.matmul_size, options.matmul_runs,
                            tf.float32, job.peak_session_config)
  peak_bf16 = None
  if options.bf16_peak:
    peak_bf16 = matmul_peak_gflops(options.matmul_size, options.matmul_runs,
                                   tf.bfloat16, job.peak_session_config)

  def dataset_fn():
    return pipeline.make_dataset(
        job.dataset_dir, job.split, job.dataset_info, job.preprocess_options,
        batch, is_training=True, mean_pixel=job.mean_pixel)

  input_rate = input_pipeline_rate(dataset_fn, batch, options.input_batches,
                                   options.input_warmup_batches,
                                   job.peak_session_config)

  def input_fn():
    return tf.data.make_one_shot_iterator(dataset_fn()).get_next()

  built = job.build_graph(input_fn)
  flops = graph_flops(built.graph)
  init_fn = None
  scaffold = built.scaffold
  if scaffold is not None and scaffold.init_fn is not None:
    init_fn = lambda sess: scaffold.init_fn(scaffold, sess)
  times = time_training(built.graph, built.train_op,
                        built.total_loss, job.session_config, options,
                        init_fn)
  achieved = flops / times.seconds_per_step / 1e9
  result = {
      'model_variant': job.model_options.model_variant,
      'output_stride': job.model_options.output_stride,
      'crop_size': list(job.model_options.crop_size),
      'batch_size': batch,
      'num_clones': job.train_options.num_clones,
      'fine_tune_batch_norm': job.train_options.fine_tune_batch_norm,
      'mixed_precision': job.mixed_precision,
      'use_xla': job.use_xla,
      'data': job.data,
      'input_images_per_sec': input_rate,
      'train_images_per_sec': batch / times.seconds_per_step,
      'seconds_per_step': times.seconds_per_step,
      'first_step_seconds': times.first_step_seconds,
      'gflop_per_step': flops / 1e9,
      'flop_count_method': FLOP_COUNT_METHOD,
      'achieved_gflops': achieved,
      'peak_gflops': peak,
      'peak_bf16_gflops': peak_bf16,
      'peak_fraction': achieved / peak,
      'peak_rss_gib': peak_rss_gib(),
      'input_wait_seconds_per_step': times.input_wait_seconds_per_step,
      'input_wait_fraction': times.input_wait_fraction,
      'cores_used': times.cores_used,
      'first_loss': times.first_loss,
      'last_loss': times.last_loss,
      'steps': options.steps,
      'warmup_steps': options.warmup_steps,
      'load_average': [round(load_start, 2),
                       round(os.getloadavg()[0], 2)],
      'cpu_count': os.cpu_count(),
      'tensorflow_version': tf.__version__,
  }
  assert set(result) == set(RESULT_FIELDS)
  return result


# ---------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------
_TABLE_ROWS = (
    ('input pipeline', 'input_images_per_sec', '%.1f img/s'),
    ('training', 'train_images_per_sec', '%.3f img/s'),
    ('step', 'seconds_per_step', '%.3f s'),
    ('first step', 'first_step_seconds', '%.1f s'),
    ('FLOPs / step', 'gflop_per_step', '%.1f GFLOP'),
    ('achieved', 'achieved_gflops', '%.1f GFLOP/s'),
    ('fp32 matmul peak', 'peak_gflops', '%.1f GFLOP/s'),
    ('bf16 matmul peak', 'peak_bf16_gflops', '%.1f GFLOP/s'),
    ('share of fp32 peak', 'peak_fraction', '%.1%%'),
    ('peak RSS', 'peak_rss_gib', '%.2f GiB'),
    ('input wait / step', 'input_wait_seconds_per_step', '%.4f s'),
    ('input wait share', 'input_wait_fraction', '%.2%%'),
    ('cores used', 'cores_used', '%.2f'),
    ('loss first -> last', None, None),
    ('load average', 'load_average', '%s'),
)


def _format(fmt, value):
  if value is None:
    return '-'
  if fmt.endswith('%%'):
    return (fmt[:-2] + 'f %%') % (100.0 * value)
  return fmt % (value,)


def variant_name(result):
  """'fp32', 'bf16', 'bf16+xla', ... for a result dict."""
  name = {'none': 'fp32'}.get(result['mixed_precision'],
                                result['mixed_precision'])
  return name + ('+xla' if result['use_xla'] else '')


def format_table(results):
  """A text table: one column per result, a ratio row against the first.

  Args:
    results: list of result dicts of the same config (settings differ).

  Returns:
    str.
  """
  first = results[0]
  title = ('%s OS%d crop %s batch %d, %d tower(s), fine_tune_batch_norm=%s,'
           ' data %s' % (first['model_variant'], first['output_stride'],
                         'x'.join(map(str, first['crop_size'])),
                         first['batch_size'], first['num_clones'],
                         first['fine_tune_batch_norm'], first['data']))
  rows = [[''] + [variant_name(r) for r in results]]
  for label, key, fmt in _TABLE_ROWS:
    if key is None:
      rows.append([label] + ['%.3f -> %.3f' % (r['first_loss'], r['last_loss'])
                             for r in results])
    else:
      rows.append([label] + [_format(fmt, r[key]) for r in results])
  if len(results) > 1:
    rows.append(['training vs %s' % variant_name(first)] + [
        '%.2fx' % (r['train_images_per_sec'] / first['train_images_per_sec'])
        for r in results])
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = [title]
  for row in rows:
    lines.append('  '.join(cell.ljust(w) if i == 0 else cell.rjust(w)
                           for i, (cell, w) in enumerate(zip(row, widths))))
  return '\n'.join(lines)


def rounded(result, digits=4):
  """The result with floats rounded, for a compact JSON line."""
  out = {}
  for key, value in result.items():
    out[key] = round(value, digits) if isinstance(value, float) else value
  return out
