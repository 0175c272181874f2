"""One benchmark run: the options, the job, and `run_benchmark`."""
import contextlib
import dataclasses
import os
from typing import Callable

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train.bench import measure
from deeplab_train.config import check
from deeplab_train.config import errors
from deeplab_train.data import pipeline
from deeplab_train.runtime import cpu as cpu_lib

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
    """Raises ConfigError naming the offending field; returns self."""
    for minimum, names in (
        (0, ('warmup_steps', 'trace_steps', 'input_warmup_batches')),
        (1, ('steps', 'input_batches', 'matmul_size', 'matmul_runs'))):
      for name in names:
        check(getattr(self, name) >= minimum, '%s must be >= %d'
              % (errors.field_ref(self, name), minimum))
    return self



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


def _matmul_peaks(job, options):
  """(fp32, bf16 or None) matmul peaks in GFLOP/s. No bf16 peak where a
  bfloat16 matmul would abort the process (cpu.bf16_abort: oneDNN
  capped below AVX512_CORE on an AVX-512 CPU), so that fp32 can still be
  measured there."""
  def peak(dtype):
    return measure.matmul_peak_gflops(options.matmul_size, options.matmul_runs,
                                      dtype, job.peak_session_config)
  bf16 = options.bf16_peak
  if bf16:
    refusal = cpu_lib.bf16_abort(cpu_lib.machine_cpu())
    if refusal:
      logging.info('No bf16 matmul peak: %s', refusal)
      bf16 = False
  return peak(tf.float32), peak(tf.bfloat16) if bf16 else None


@contextlib.contextmanager
def _data_errors_named(job):
  """A read of bad records raises ConfigError naming the file and record
  (as deeplab-train says it), not TensorFlow's graph error."""
  try:
    yield
  except tf.errors.OpError as e:
    files = (pipeline.split_files(job.dataset_dir, job.split)
             if job.dataset_dir and os.path.isdir(job.dataset_dir) else None)
    message = pipeline.data_error_message(e, files)
    if message is None:
      raise
    raise errors.ConfigError('%s', message) from None


def run_benchmark(job, options):
  """Measures (a)-(f) of the package docstring for one job.

  Args:
    job: BenchJob.
    options: BenchOptions.

  Returns:
    A dict with every key of RESULT_FIELDS (None where not measured).
  """
  options.validate()
  batch = job.train_options.train_batch_size
  load_start = os.getloadavg()[0]
  peak, peak_bf16 = _matmul_peaks(job, options)

  def dataset_fn():
    return pipeline.make_dataset(
        job.dataset_dir, job.split, job.dataset_info, job.preprocess_options,
        batch, is_training=True, mean_pixel=job.mean_pixel)

  with _data_errors_named(job):
    input_rate = measure.input_pipeline_rate(
        dataset_fn, batch, options.input_batches,
        options.input_warmup_batches, job.peak_session_config)

  def input_fn():
    return tf.data.make_one_shot_iterator(dataset_fn()).get_next()

  built = job.build_graph(input_fn)
  flops = measure.graph_flops(built.graph)
  init_fn = None
  scaffold = built.scaffold
  if scaffold is not None and scaffold.init_fn is not None:
    init_fn = lambda sess: scaffold.init_fn(scaffold, sess)
  with _data_errors_named(job):
    times = measure.time_training(built.graph, built.train_op,
                                  built.total_loss, job.session_config,
                                  options, init_fn)
  # Measured again after the steps, the faster figure kept: another load
  # on a shared machine during one measurement lowers it (an xception_65
  # run once reported 86 GFLOP/s where lone measurements gave 114-155).
  peak_after, bf16_after = _matmul_peaks(job, options)
  peak = max(peak, peak_after)
  if peak_bf16 is not None:
    peak_bf16 = max(peak_bf16, bf16_after)
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
      'peak_rss_gib': measure.peak_rss_gib(),
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
