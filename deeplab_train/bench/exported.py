"""Inference speed of exported models: `deeplab-bench --exported_model`.

Each exported file (a frozen .pb, a SavedModel folder or a .tflite file, see
export/loaded.py) is measured once per thread count, each time in a child
process of its own, so that its peak memory is its own and TensorFlow's CPU
thread pools (made once per process, at the first session) have the count
asked for. The child opens the model with `loaded.open_exported`, as
deeplab-eval does, and after warm-up times `predict` on random uint8 images:

  batch 1: one image per call; latency per image (median, p90 of the
    calls) and images/s (images over the summed time of the calls);
  batch N: N images per call; latency per image is the call's time / N.
    The SavedModel runs them in one network run; the frozen graph
    (ImageTensor:0 is [1, H, W, 3]) and deeplab-export's .tflite files (one
    image per invoke) make N single calls, which the result says
    ('batch_runs': 'single calls').

Also reported: the file's size (a SavedModel: its folder's), the time to
open the model and of its first call, the CPU cores the timed calls kept
busy (CPU time / wall time: shows the thread count took effect), and the
child's peak resident memory (VmHWM: read by the child at its end and by
the parent while it runs, as bench/compare.py does for the trainers; it
includes TensorFlow itself, a few hundred MiB).

Images have the model's fixed input size (.tflite), else
`ExportedBenchOptions.image_size`, else the input size of the .tflite files
measured alongside (so all formats run on the same images).
"""
import dataclasses
import json
import os
import resource
import tempfile
import time
from typing import Callable, List, Optional, Tuple

from absl import logging
import numpy as np

from deeplab_train import config
from deeplab_train.bench import compare
from deeplab_train.bench import report
from deeplab_train.config import errors
from deeplab_train.export import loaded
from deeplab_train.export import tflite
from deeplab_train.runtime import cpu as cpu_lib

MODE = 'exported'
# How a batch of N images is run: one network run, or N calls of one image.
ONE_RUN = 'one run'
SINGLE_CALLS = 'single calls'
# Padding of a .tflite file that does not record its mean pixel. The
# benchmark's images fill the model's input, so the value is never used.
_UNUSED_MEAN_PIXEL = (127.5, 127.5, 127.5)
_IMAGE_SEED = 0

# Every key of a result dict (and of the JSON line).
RESULT_FIELDS = (
    'path', 'name', 'format', 'label', 'quantize', 'model_bytes',
    'image_size', 'threads', 'batch_size', 'batch_runs', 'runs',
    'warmup_runs', 'load_seconds', 'first_call_seconds',
    'batch1_ms_median', 'batch1_ms_p90', 'batch1_images_per_sec',
    'batchn_ms_median', 'batchn_ms_p90', 'batchn_images_per_sec',
    'cores_used', 'peak_rss_mib', 'load_average', 'cpu_count',
    'tensorflow_version')


@dataclasses.dataclass(frozen=True)
class ExportedBenchOptions:
  """How the exported models are measured.

  Attributes:
    batch_size: images per call of the batch-N measurement.
    threads: thread counts, one child process each (TensorFlow's intra-
      and inter-op threads; the TFLite interpreter's threads).
    image_size: (height, width) of the images of models that take any
      size; None: the input size of the .tflite files measured with them.
    runs: timed calls of each batch size.
    warmup_runs: calls before timing (graph rewrites, allocations).
  """
  batch_size: int = 8
  threads: Tuple[int, ...] = (1,)
  image_size: Optional[Tuple[int, int]] = None
  runs: int = 20
  warmup_runs: int = 3

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    for name, minimum in (('batch_size', 1), ('runs', 1),
                          ('warmup_runs', 0)):
      errors.check(getattr(self, name) >= minimum, '%s must be >= %d, got %d'
                   % (errors.field_ref(self, name), minimum,
                      getattr(self, name)))
    errors.check(bool(self.threads) and min(self.threads) >= 1,
                 '%s must be thread counts >= 1, got %s'
                 % (errors.field_ref(self, 'threads'), list(self.threads)))
    errors.check(errors.is_crop(self.image_size),
                 '%s must be HEIGHT,WIDTH with positive values, got %s'
                 % (errors.field_ref(self, 'image_size'), self.image_size))
    return self


@dataclasses.dataclass(frozen=True)
class ModelFacts:
  """What the parent process learns about a file before measuring it.

  Attributes:
    path: the file or folder.
    kind: one of loaded.KINDS.
    input_size: (height, width) the model's input is fixed to, or None.
  """
  path: str
  kind: str
  input_size: Optional[Tuple[int, int]]


def model_bytes(path):
  """Size of a file, or of every file under a folder (a SavedModel)."""
  if not os.path.isdir(path):
    return os.path.getsize(path)
  total = 0
  for folder, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
  return total


def tflite_quantize(path):
  """The quantize mode a .tflite file of deeplab-export records, or None."""
  with open(path, 'rb') as f:
    metadata = tflite.read_metadata(f.read())
  return (metadata or {}).get('quantize')


def format_label(kind, quantize=None):
  """'.pb', 'SavedModel', '.tflite float32', '.tflite int8', ..."""
  if kind == loaded.FROZEN_GRAPH:
    return '.pb'
  if kind == loaded.SAVED_MODEL:
    return 'SavedModel'
  name = {'none': 'float32', None: '?'}.get(quantize, quantize)
  return '.tflite %s' % name


def one_image_per_call(model):
  """True when an opened model runs one image per network run: the frozen
  graph, and deeplab-export's .tflite files (input [1, h, w, 3])."""
  return model.max_batch == 1 or model.kind == loaded.TFLITE


def inspect_models(paths):
  """Opens each exported model once (the checks deeplab-eval makes).

  Returns:
    A ModelFacts per path.

  Raises:
    loaded.ExportedModelError: a missing file, an unknown format or an
      unusable model (naming the file as {open_exported.path}).
  """
  out = []
  for path in paths:
    with loaded.open_exported(path, mean_pixel=_UNUSED_MEAN_PIXEL) as model:
      size = tuple(model.input_size) if model.input_size else None
      out.append(ModelFacts(path, model.kind, size))
  return out


def image_sizes(facts, requested=None):
  """The image size each model is measured at.

  A model of a fixed input size runs at it; the others at `requested`,
  else at the fixed size the others share.

  Args:
    facts: ModelFacts of the models.
    requested: ExportedBenchOptions.image_size.

  Returns:
    A (height, width) per model.

  Raises:
    ConfigError: no size is known for a model that takes any size.
  """
  fixed = sorted({f.input_size for f in facts if f.input_size})
  default = requested or (fixed[0] if len(fixed) == 1 else None)
  out = []
  for f in facts:
    if f.input_size:
      if requested and tuple(requested) != f.input_size:
        logging.warning('%s takes %dx%d images only: measured at that size',
                        f.path, *f.input_size)
      out.append(f.input_size)
      continue
    if default is None:
      raise errors.ConfigError(
          '{open_exported.path}=%s takes images of any size (up to its '
          'export crop size): give their size with '
          '{ExportedBenchOptions.image_size}, e.g. the export crop size',
          f.path)
    out.append(tuple(default))
  return out


def set_tensorflow_threads(threads):
  """Sets the threads of every TensorFlow session this process will open.

  Must run before TensorFlow's runtime starts: a TF1 session without a
  config takes the eager context's, whose thread counts are fixed then.

  Raises:
    RuntimeError: TensorFlow's runtime has started already.
  """
  # pylint: disable-next=g-import-not-at-top
  import tensorflow as tf
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(threads)


def _cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _timed_calls(model, images, runs):
  """Seconds of each of `runs` calls predict(images)."""
  out = []
  for _ in range(runs):
    start = time.perf_counter()
    model.predict(images)
    out.append(time.perf_counter() - start)
  return out


def _latency_figures(seconds, images_per_call):
  """(median ms per image, p90 ms per image, images/s) of timed calls."""
  per_image = np.asarray(seconds) * 1000.0 / images_per_call
  return (float(np.median(per_image)), float(np.percentile(per_image, 90)),
          images_per_call * len(seconds) / sum(seconds))


def measure_model(path, threads, image_size, options):
  """Measures one exported model in this process (a child's job).

  Args:
    path: the exported model.
    threads: thread count (TensorFlow sessions and TFLite interpreter).
    image_size: (height, width) of the random images.
    options: ExportedBenchOptions (batch size, runs, warm-up).

  Returns:
    A dict with every key of RESULT_FIELDS; peak_rss_mib is this process's
    VmHWM so far.
  """
  set_tensorflow_threads(threads)
  # pylint: disable-next=g-import-not-at-top
  import tensorflow as tf
  load_average = os.getloadavg()[0]
  start = time.perf_counter()
  model = loaded.open_exported(path, mean_pixel=_UNUSED_MEAN_PIXEL,
                               num_threads=threads)
  with model:
    load_seconds = time.perf_counter() - start
    height, width = image_size
    rng = np.random.RandomState(_IMAGE_SEED)
    batch = rng.randint(0, 256, (options.batch_size, height, width, 3),
                        dtype=np.uint8)
    start = time.perf_counter()
    try:
      model.predict(batch[0])
    except config.ImageTooLargeError as e:
      raise errors.ConfigError(
          '{ExportedBenchOptions.image_size}=%d,%d: %s; or give a smaller '
          '{ExportedBenchOptions.image_size}', height, width, e) from None
    first_call = time.perf_counter() - start
    for _ in range(options.warmup_runs):
      model.predict(batch[0])
      model.predict(batch)
    cpu_start, wall_start = _cpu_seconds(), time.perf_counter()
    one = _timed_calls(model, batch[0], options.runs)
    many = _timed_calls(model, batch, options.runs)
    cores = (_cpu_seconds() - cpu_start) / (time.perf_counter() - wall_start)
    single_calls = one_image_per_call(model)
    kind = model.kind
  quantize = tflite_quantize(path) if kind == loaded.TFLITE else None
  b1_median, b1_p90, b1_rate = _latency_figures(one, 1)
  bn_median, bn_p90, bn_rate = _latency_figures(many, options.batch_size)
  result = {
      'path': path,
      'name': os.path.basename(os.path.normpath(path)),
      'format': kind, 'label': format_label(kind, quantize),
      'quantize': quantize, 'model_bytes': model_bytes(path),
      'image_size': [height, width], 'threads': threads,
      'batch_size': options.batch_size,
      'batch_runs': SINGLE_CALLS if single_calls else ONE_RUN,
      'runs': options.runs, 'warmup_runs': options.warmup_runs,
      'load_seconds': load_seconds, 'first_call_seconds': first_call,
      'batch1_ms_median': b1_median, 'batch1_ms_p90': b1_p90,
      'batch1_images_per_sec': b1_rate,
      'batchn_ms_median': bn_median, 'batchn_ms_p90': bn_p90,
      'batchn_images_per_sec': bn_rate,
      'cores_used': cores,
      'peak_rss_mib': compare.vm_hwm_mib(os.getpid()),
      'load_average': [round(load_average, 2),
                       round(os.getloadavg()[0], 2)],
      'cpu_count': os.cpu_count(),
      'tensorflow_version': tf.__version__,
  }
  assert set(result) == set(RESULT_FIELDS)
  return report.rounded(result)


def child_result(text):
  """(status, payload) of the last JSON result line in a child's output,
  or (None, None)."""
  for line in reversed(text.splitlines()):
    if line.startswith('{'):
      try:
        payload = json.loads(line)
      except ValueError:
        continue
      if payload.get('event') == 'result':
        return payload.get('status'), payload
  return None, None


def run_children(facts, sizes, options, child_argv: Callable):
  """Measures every model at every thread count, each in a child process.

  Args:
    facts: ModelFacts of the models (inspect_models).
    sizes: the image size of each (image_sizes).
    options: ExportedBenchOptions.
    child_argv: fn(path, threads, image_size) -> the command line of the
      child measuring them (it prints measure_model's result as
      {'event': 'result', 'status': 'ok', 'results': [result]}).

  Returns:
    The results, model by model, thread count by thread count; each
    result's peak_rss_mib is the larger of the child's own reading and the
    parent's.

  Raises:
    ConfigError: a child refused its input (exit 2), e.g. an image larger
      than the model's export crop size.
    RuntimeError: a child failed otherwise (its log's tail in the message).
  """
  results = []
  env = dict(os.environ)
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  with tempfile.TemporaryDirectory(prefix='deeplab-bench-exported-') as tmp:
    for index, (fact, size) in enumerate(zip(facts, sizes)):
      for threads in options.threads:
        log_path = os.path.join(tmp, 'model%d-threads%d.log'
                                % (index, threads))
        logging.info('benchmarking %s with %d thread(s)', fact.path, threads)
        code, peak_mib, _ = compare.run_logged(
            child_argv(fact.path, threads, size), log_path, env)
        with open(log_path, errors='replace') as f:
          text = f.read()
        status, payload = child_result(text)
        if code == 2 and status == 'bad_input':
          raise errors.ConfigError('%s', payload.get('message', ''))
        if code or status != 'ok' or not payload.get('results'):
          tail = '\n'.join(text.strip().splitlines()[-15:])
          raise RuntimeError('benchmark of %s with %d thread(s) failed '
                             '(exit %d):\n%s' % (fact.path, threads, code,
                                                 tail))
        result = payload['results'][0]
        result['peak_rss_mib'] = round(max(result['peak_rss_mib'], peak_mib),
                                       1)
        results.append(result)
  return results


def _ms(value):
  return '%.1f' % value if value < 100 else '%.0f' % value


def _table(rows):
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return ['  '.join(cell.ljust(w) if i < 2 else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(row, widths)))
          for row in rows]


def format_table(results: List[dict], cpu=None):
  """The results as a text table, a row per model and thread count.

  Args:
    results: measure_model's dicts.
    cpu: runtime.cpu.machine_cpu() (default: this machine's).

  Returns:
    str.
  """
  cpu = cpu if cpu is not None else cpu_lib.machine_cpu()
  first = results[0]
  n = first['batch_size']
  sizes = sorted({'x'.join(map(str, r['image_size'])) for r in results})
  title = ('exported models: random uint8 images %s, latency per image '
           'over %d calls after %d warm-up calls' % (
               ' / '.join(sizes), first['runs'], first['warmup_runs']))
  rows = [['model', 'format', 'MiB', 'image', 'threads',
           'b1 ms med', 'b1 ms p90', 'b1 img/s',
           'b%d ms med' % n, 'b%d ms p90' % n, 'b%d img/s' % n,
           'b%d as' % n, 'cores', 'load s', 'peak RSS MiB']]
  for r in results:
    rows.append([
        r['name'], r['label'], '%.2f' % (r['model_bytes'] / 2.0 ** 20),
        'x'.join(map(str, r['image_size'])), '%d' % r['threads'],
        _ms(r['batch1_ms_median']), _ms(r['batch1_ms_p90']),
        '%.1f' % r['batch1_images_per_sec'],
        _ms(r['batchn_ms_median']), _ms(r['batchn_ms_p90']),
        '%.1f' % r['batchn_images_per_sec'],
        '1 run' if r['batch_runs'] == ONE_RUN else '%d calls' % n,
        '%.2f' % r['cores_used'], '%.2f' % r['load_seconds'],
        '%.0f' % r['peak_rss_mib']])
  lines = [title] + _table(rows)
  if any(r['batch_runs'] == SINGLE_CALLS for r in results):
    lines.append('b%d as "%d calls": the format takes one image per run, so '
                 'a batch of %d is %d single calls' % (n, n, n, n))
  loads = [r['load_average'] for r in results]
  lines += [
      'peak RSS: each model in its own process, TensorFlow included; '
      'cores: CPU time / wall time of the timed calls',
      compare.cpu_line(cpu),
      'load average (1 min) at start / end: %.2f / %.2f' % (
          loads[0][0], loads[-1][1])]
  return '\n'.join(lines)
