"""deeplab-bench: training speed of a model config on this machine (or the
inference speed of exported models).

    deeplab-bench --model_variant=mobilenet_v2 --output_stride=8 \\
        --train_crop_size=321,321 --train_batch_size=4 \\
        [--bench_data=synthetic|sample|dataset_dir] \\
        [--mixed_precision=none|bf16|fp16] [--use_xla] \\
        [--bench_variants=none,bf16,bf16+xla|none,auto]
    deeplab-bench ... --compare_original=DIR [--compare_rounds=3] \\
        [--compare_steps=30]
    deeplab-bench --exported_model=OUT/frozen.pb,OUT/saved_model,OUT/m.tflite \\
        [--bench_batch_size=8] [--bench_threads=1,all] \\
        [--bench_image_size=HEIGHT,WIDTH] [--bench_runs=20]

Takes deeplab-train's model and training flags. Measures in one process the
input pipeline's images/s, training images/s and s/step after warm-up, FLOPs
per step and the FLOP/s achieved, the fp32 matmul peak of the machine and
the share of it achieved, peak memory, and the time the towers waited for
input (see deeplab_train/bench/ for how). Prints a table and, last, one
JSON line {"event": "result", "status": "ok", "results": [...]} with a
result per measured setting (also written to --bench_json, one line each).
Exit codes: 0 ok, 2 bad input, 1 unexpected error (e.g. a failed setting),
143 / 130 stopped by SIGTERM / SIGINT (the child process measuring is ended
first, and a --compare_original run removes its work folder).

--bench_variants compares settings: each one runs in its own process (so
each has its own peak memory), one after the other, and the table gets a
column per setting with the ratio of training speeds to the first. A
setting that comes to one already measured (none,auto where auto is none)
reuses its result.

--compare_original=DIR is for our own benchmarking: it measures the
original DeepLab trainer against deeplab-train on this machine. DIR is the
original made runnable by the original's setup.sh (DIR/train.sh). Both are
trained with the same model and training flags on the same records
(pascal_voc_seg-style, from --bench_data), each run in its own process and
fresh logdir, alternately (original, deeplab-train, original, ...) for
--compare_rounds rounds of --compare_steps steps. Reported per run: the
median s/step each trainer logs after the first third of its steps
(warm-up), images/s and peak RSS (the kernel's VmHWM of the trainer
process); then the medians, the speed ratio original s/step / ours (> 1:
deeplab-train is faster) with its range over the rounds, and the CPU's
AVX2 / AVX-512 / AVX512_BF16 / AMX support. Flags the original does not
have (e.g. --mixed_precision) go to deeplab-train only, with a warning.
The other --bench_* measurements are not made in this mode.

--exported_model=PATH (repeatable, or a comma list) measures the inference
speed of exported models instead (frozen .pb, SavedModel folder, .tflite;
see deeplab_train/bench/exported.py): per file and per --bench_threads
count (`all`: every usable core), in a process of its own, the latency per
image (median and p90 over --bench_runs calls after --bench_warmup_runs)
and images/s at batch 1 and --bench_batch_size (a frozen graph or .tflite
takes one image per run: its batch is that many single calls, and the
table says so), the file's size, the load time, the cores kept busy and
the peak RSS. Images are random uint8 at the model's fixed input size
(.tflite), else --bench_image_size, else the .tflite files' size. One table
has a row per file and thread count; the JSON line holds a result each.
The training flags are not used in this mode.

Data: --bench_data=synthetic writes VOC-sized synthetic JPEGs (21 classes),
sample converts the bundled sample dataset (data/ of the source tree), both
into a temp folder; dataset_dir reads --dataset_dir / --train_split.
"""
import dataclasses
import json
import subprocess
import sys
import tempfile
from typing import Optional, Tuple

from absl import flags
from absl import logging

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import output_paths
from deeplab_train.cli import train_flags
from deeplab_train.data import datasets
from deeplab_train.runtime import cpu as cpu_lib
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS
COMMAND = 'deeplab-bench'

DATA_SOURCES = ('synthetic', 'sample', 'dataset_dir')

# deeplab-bench's own flags (the training flags come from train_flags):
# data, measurement lengths, settings compared and reporting.
_BENCH_TABLE = (
    ('enum', 'bench_data', 'synthetic',
     'Data fed to the pipeline: synthetic VOC-sized images, the bundled '
     'sample dataset, or --dataset_dir.', {'enum_values': list(DATA_SOURCES)}),
    ('integer', 'bench_synthetic_images', 64,
     'Images written with --bench_data=synthetic.'),
    ('integer', 'bench_steps', 10, 'Timed training steps.'),
    ('integer', 'bench_warmup_steps', 3, 'Training steps before timing.'),
    ('integer', 'bench_trace_steps', 3,
     'Traced steps measuring the input wait (0: skip).'),
    ('integer', 'bench_input_batches', 50,
     'Timed batches of the input pipeline alone.'),
    ('integer', 'bench_matmul_size', 2048,
     'Side of the fp32 matmul measuring the peak FLOP/s.'),
    ('list', 'bench_variants', None,
     'Settings to compare, each MODE or MODE+xla with MODE in '
     'none/bf16/fp16/auto, e.g. none,bf16,bf16+xla; one process each; '
     'none,auto measures what --mixed_precision=auto gains on this machine. '
     'Unset: the --mixed_precision/--use_xla flags.'),
    ('string', 'bench_json', None,
     'Also write the JSON result lines to this file.'),
    ('boolean', 'bench_child', False,
     'Internal: run one setting and print its result for the parent process.'),
)
# The comparison with the original trainer (our own benchmarking).
_COMPARE_TABLE = (
    ('string', 'compare_original', None,
     'For our own benchmarking: a folder made by the original DeepLab\'s '
     'setup.sh; trains it and deeplab-train alternately with these flags '
     'and compares s/step and peak memory (see --help).'),
    ('integer', 'compare_rounds', 3,
     'With --compare_original: rounds, each one run of either trainer.'),
    ('integer', 'compare_steps', 30,
     'With --compare_original: training steps of every run (the first '
     'third is warm-up; fewer for big models, e.g. 10 for xception_65).'),
)
# The inference speed of exported models.
# (--exported_model itself is common_flags', shared with eval and vis.)
_EXPORTED_TABLE = (
    ('integer', 'bench_batch_size', 8,
     'With --exported_model: images per call of the batched measurement.'),
    ('list', 'bench_threads', ['1', 'all'],
     'With --exported_model: thread counts to measure, each in its own '
     'process (all: every usable core).'),
    ('list', 'bench_image_size', None,
     'With --exported_model: HEIGHT,WIDTH of the random images fed to '
     'models that take any size (default: the input size of the .tflite '
     'files measured with them).'),
    ('integer', 'bench_runs', 20,
     'With --exported_model: timed calls per batch size.'),
    ('integer', 'bench_warmup_runs', 3,
     'With --exported_model: calls of each batch size before timing.'),
)
flag_table.define(_BENCH_TABLE, _COMPARE_TABLE, _EXPORTED_TABLE)

# Given to both trainers even at their defaults, so that both surely train
# the setting the report names.
_COMPARE_ALWAYS_PASSED = ('model_variant', 'output_stride', 'train_crop_size',
                          'train_batch_size', 'fine_tune_batch_norm')

# Set per variant for a child process, or meaningless there.
_NOT_PASSED_TO_CHILDREN = ('bench_variants', 'mixed_precision', 'use_xla',
                           'bench_json', 'bench_child', 'compare_original',
                           'compare_rounds', 'compare_steps')
# BenchOptions fields set by the flag 'bench_' + field.
_BENCH_FIELDS = ('warmup_steps', 'steps', 'trace_steps', 'input_batches',
                 'matmul_size')

# Option fields whose flag is not named after the field. Those of
# BenchOptions and ExportedBenchOptions with a flag are set by 'bench_' +
# field: they are taken from _BENCH_FIELDS and _EXPORTED_TABLE, not from the
# dataclasses (whose modules load TensorFlow).
FLAG_NAMES = dict(train_flags.FLAG_NAMES, **{
    'BenchOptions.' + name: 'bench_' + name for name in _BENCH_FIELDS}, **{
        'CompareOptions.original_dir': 'compare_original',
        'CompareOptions.rounds': 'compare_rounds',
        'CompareOptions.steps': 'compare_steps'}, **{
            'ExportedBenchOptions.' + row[1][len('bench_'):]: row[1]
            for row in _EXPORTED_TABLE},
    **{'open_exported.path': 'exported_model'})


@dataclasses.dataclass(frozen=True)
class BenchCommandJob:
  """What deeplab-bench measures, on which data, and how it reports.

  Attributes:
    model_options / train_options / preprocess_options: the training setup
      measured (the training flags).
    bench_options: bench.BenchOptions, how long each measurement runs.
    data: 'synthetic', 'sample' or 'dataset_dir' (see DATA_SOURCES).
    synthetic_images: images written for synthetic data.
    dataset_dir / dataset_info / split: the dataset_dir data source.
    variants: settings compared, each in a child process, as (text as
      given, --mixed_precision mode, XLA) from parse_variant; empty:
      measure the flags' own setting here.
    child_flags: the command line a child process repeats.
    bench_json: also write the result lines to this file.
    child: this process is a child measuring one variant.
    compare: a bench.CompareJob: compare with the original trainer instead
      (see bench.run_comparison).
  """
  model_options: config.ModelOptions
  train_options: config.TrainOptions
  preprocess_options: config.PreprocessOptions
  bench_options: object  # the bench package loads TensorFlow
  data: str = 'synthetic'
  synthetic_images: int = 64
  dataset_dir: Optional[str] = None
  dataset_info: Optional[datasets.DatasetInfo] = None
  split: str = 'train'
  variants: Tuple[Tuple[str, str, bool], ...] = ()
  child_flags: Tuple[str, ...] = ()
  bench_json: Optional[str] = None
  child: bool = False
  compare: Optional[object] = None


def parse_variant(text, cpu_features=None):
  """'bf16+xla' -> ('bf16', True); 'none' -> ('none', False); 'auto' ->
  what --mixed_precision=auto chooses on a CPU with `cpu_features`
  (default: this machine's), e.g. ('bf16', False) with AVX512_BF16.

  Raises:
    config.ConfigError: unknown parts, or bf16 where it would abort
      (cpu_lib.bf16_refusal).
  """
  parts = [p.strip() for p in text.split('+') if p.strip()]
  xla = 'xla' in parts
  modes = [p for p in parts if p != 'xla']
  mode = modes[0] if len(modes) == 1 else ('none' if not modes else None)
  mode, _, refusal = cpu_lib.choose_mixed_precision(
      'none' if mode == 'fp32' else mode, cpu_features)
  if mode not in config.MIXED_PRECISION_MODES or parts.count('xla') > 1:
    raise config.ConfigError(
        '--bench_variants: bad setting %r; use none, bf16, fp16 or auto '
        '(what --mixed_precision=auto chooses here), optionally with +xla '
        '(e.g. bf16+xla)' % text)
  if refusal:
    raise config.ConfigError('--bench_variants: %s: %s', text, refusal)
  return mode, xla


def _num_classes_and_info():
  """(class count, DatasetInfo or None) of the --bench_data source."""
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  if (FLAGS.dataset_dir and FLAGS.bench_data != 'dataset_dir'
      and not FLAGS.bench_child):
    logging.warning('--dataset_dir=%s is not read: --bench_data=%s; add '
                    '--bench_data=dataset_dir to benchmark on those records',
                    FLAGS.dataset_dir, FLAGS.bench_data)
  if FLAGS.bench_data == 'synthetic':
    return bench.SYNTHETIC_CLASSES, None
  if FLAGS.bench_data == 'sample':
    return bench.SAMPLE_CLASSES, None
  if not FLAGS.dataset_dir:
    raise config.ConfigError('--bench_data=dataset_dir needs --dataset_dir')
  info = common_flags.dataset_info()
  return info.num_classes, info


def _child_flags():
  """The non-default flags a child process repeats (one per argument)."""
  out, seen = [], set()
  for name in sorted(FLAGS):
    flag = FLAGS[name]  # short names alias the same flag object
    if (flag.name in seen or flag.name in _NOT_PASSED_TO_CHILDREN or
        flag.using_default_value):
      continue
    seen.add(flag.name)
    out.extend(flag.serialize().splitlines())  # multi flags: one per line
  return tuple(out)


def _compare_options():
  """CompareOptions of --compare_original (checked), or None when unset.

  Raises:
    config.ConfigError: bad --compare_* flags or not an original's folder.
  """
  if not FLAGS.compare_original:
    return None
  if FLAGS.bench_variants:
    raise config.ConfigError('--compare_original cannot be combined with '
                             '--bench_variants: run them separately')
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  return bench.CompareOptions(original_dir=FLAGS.compare_original,
                              rounds=FLAGS.compare_rounds,
                              steps=FLAGS.compare_steps).validate()


def _compare_flag_args():
  """(name, arguments) of the model and training flags given to the
  trainers compared: those set, and _COMPARE_ALWAYS_PASSED."""
  out = []
  for module in (common_flags, train_flags):
    for flag in FLAGS.get_flags_for_module(module.__name__):
      if (not flag.using_default_value or
          flag.name in _COMPARE_ALWAYS_PASSED):
        out.append((flag.name, tuple(flag.serialize().splitlines())))
  return out


def _compare_job(options, model_options, train):
  """The CompareJob of the flags (`options`: _compare_options())."""
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  shared, ours_only, names = bench.split_flag_args(_compare_flag_args())
  if names:
    logging.warning('the original has no --%s: given to deeplab-train only',
                    ', --'.join(names))
  return bench.CompareJob(
      options=options, model_variant=model_options.model_variant,
      output_stride=model_options.output_stride,
      crop_size=tuple(model_options.crop_size),
      batch_size=train.train_batch_size,
      fine_tune_batch_norm=train.fine_tune_batch_norm, shared_args=shared,
      ours_only_args=ours_only, data=FLAGS.bench_data,
      synthetic_images=FLAGS.bench_synthetic_images, dataset=FLAGS.dataset,
      dataset_dir=FLAGS.dataset_dir, split=FLAGS.train_split)


@dataclasses.dataclass(frozen=True)
class ExportedCommandJob:
  """deeplab-bench --exported_model: which models, measured how.

  Attributes:
    paths: the exported models.
    options: bench.exported.ExportedBenchOptions.
    bench_json: also write the result lines to this file.
    child: this process is a child measuring one model at one thread
      count (paths and options.threads hold one value each).
  """
  paths: Tuple[str, ...]
  options: object  # the bench package loads TensorFlow
  bench_json: Optional[str] = None
  child: bool = False


def _exported_paths():
  """The --exported_model paths (repeated flags and comma lists)."""
  value = FLAGS.exported_model or ()
  if isinstance(value, str):  # the one-path flag of deeplab-eval/vis
    value = [value]
  return tuple(p.strip() for v in value for p in v.split(',') if p.strip())


def _thread_counts():
  """--bench_threads as counts ('all': every usable core), no repeats."""
  counts = []
  for text in FLAGS.bench_threads or ():
    text = text.strip().lower()
    try:
      count = cpu_lib.usable_cores() if text == 'all' else int(text)
    except ValueError:
      raise config.ConfigError(
          '--bench_threads must be thread counts or all, got %r' % text
      ) from None
    if count not in counts:
      counts.append(count)
  return tuple(counts)


def _not_read_with_exported():
  """The flags given (absl's own aside) that --exported_model's mode does
  not read: training flags, e.g. --model_variant, were silently ignored."""
  read = {'exported_model', 'bench_json', 'bench_child', 'flagfile'} | {
      row[1] for row in _EXPORTED_TABLE}
  return sorted({
      FLAGS[name].name for name in FLAGS
      if FLAGS[name].present and FLAGS[name].name not in read and
      not (FLAGS.find_module_defining_flag(name) or '').startswith('absl')})


def exported_options_from_flags():
  """The flags -> an ExportedCommandJob (--exported_model given).

  Raises:
    config.ConfigError: bad flags, or --exported_model with another mode.
  """
  for other in ('bench_variants', 'compare_original'):
    if FLAGS[other].value:
      raise config.ConfigError('--exported_model cannot be combined with '
                               '--%s: run them separately' % other)
  unread = _not_read_with_exported()
  if unread:
    logging.warning(
        '%s not read with --exported_model: the models are measured as '
        'exported (only --bench_batch_size, --bench_threads, '
        '--bench_image_size, --bench_runs, --bench_warmup_runs and '
        '--bench_json apply)', ', '.join('--' + name for name in unread))
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.bench import exported as bench_exported
  options = bench_exported.ExportedBenchOptions(
      batch_size=FLAGS.bench_batch_size, threads=_thread_counts(),
      image_size=common_flags.parse_int_list(FLAGS.bench_image_size,
                                             'bench_image_size'),
      runs=FLAGS.bench_runs, warmup_runs=FLAGS.bench_warmup_runs)
  if options.image_size is not None and len(options.image_size) == 1:
    options = dataclasses.replace(options, image_size=options.image_size * 2)
  return ExportedCommandJob(paths=_exported_paths(),
                            options=options.validate(),
                            bench_json=FLAGS.bench_json,
                            child=FLAGS.bench_child)


def options_from_flags():
  """The flags -> a BenchCommandJob (an ExportedCommandJob with
  --exported_model).

  Raises:
    config.ConfigError: bad flags.
  """
  # Checked before minutes of measuring, not when the results are written.
  output_paths.check_output_file('bench_json', FLAGS.bench_json)
  if _exported_paths():
    return exported_options_from_flags()
  compare_options = _compare_options()  # a bad folder fails first
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  bench_options = bench.BenchOptions(**{
      name: FLAGS['bench_' + name].value for name in _BENCH_FIELDS
  }).validate()
  crop = train_flags.train_crop()
  num_classes, info = _num_classes_and_info()
  model_options = common_flags.model_options(num_classes, crop)
  train = train_flags.train_options().replace(tf_initial_checkpoint=None)
  for warning in config.check_training_setup(model_options, train):
    logging.warning('%s', app.user_message(warning, FLAG_NAMES))
  # Parsed here, so that a bad setting fails before any child starts.
  variants = tuple((text,) + parse_variant(text)
                   for text in FLAGS.bench_variants or ())
  return BenchCommandJob(
      model_options=model_options, train_options=train,
      preprocess_options=train_flags.preprocess_options(crop),
      bench_options=bench_options, data=FLAGS.bench_data,
      synthetic_images=FLAGS.bench_synthetic_images,
      dataset_dir=FLAGS.dataset_dir, dataset_info=info,
      split=FLAGS.train_split, variants=variants,
      child_flags=_child_flags(), bench_json=FLAGS.bench_json,
      child=FLAGS.bench_child,
      compare=(_compare_job(compare_options, model_options, train)
               if compare_options else None))


def _data_source(job, tmp_dir):
  """(dataset_dir, DatasetInfo, split, label) of the job's data, written
  into `tmp_dir` unless it is an existing dataset."""
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  if job.data == 'synthetic':
    info = bench.write_synthetic_dataset(tmp_dir,
                                         num_images=job.synthetic_images)
    return tmp_dir, info, 'train', 'synthetic'
  if job.data == 'sample':
    return tmp_dir, bench.convert_sample_dataset(tmp_dir), 'train', 'sample'
  return job.dataset_dir, job.dataset_info, job.split, job.dataset_dir


def _library_job(job, tmp_dir):
  """The library's BenchJob for `job` (data written into `tmp_dir`)."""
  # pylint: disable=g-import-not-at-top
  from deeplab_train import bench
  from deeplab_train.model import registry
  from deeplab_train.runtime import session_config as session_lib
  from deeplab_train.train import graph as graph_lib
  dataset_dir, info, split, label = _data_source(job, tmp_dir)
  train = job.train_options

  def build_graph(input_fn):
    return graph_lib.build_training_graph(
        job.model_options, train, ignore_label=info.ignore_label,
        input_fn=input_fn)

  return bench.BenchJob(
      model_options=job.model_options, train_options=train,
      preprocess_options=job.preprocess_options, dataset_dir=dataset_dir,
      dataset_info=info, split=split, data=label,
      mixed_precision=train.mixed_precision, use_xla=train.use_xla,
      session_config=session_lib.from_train_options(train),
      peak_session_config=session_lib.make_session_config(
          intra_op_threads=train.intra_op_parallelism_threads,
          inter_op_threads=train.inter_op_parallelism_threads),
      build_graph=build_graph,
      mean_pixel=registry.get(job.model_options.model_variant).mean_pixel)


def run_one(job):
  """Benchmarks the job's own setting in this process; returns the result."""
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix='deeplab-bench-') as tmp:
    return bench.rounded(bench.run_benchmark(_library_job(job, tmp),
                                             job.bench_options))


def _child_argv(job, mode, xla):
  """The command line of the child process measuring a setting."""
  return ([sys.executable, '-m', 'deeplab_train.cli.bench'] +
          list(job.child_flags) +
          ['--mixed_precision=%s' % mode, '--use_xla' if xla else '--nouse_xla',
           '--bench_child'])


def _child_result(stdout):
  """The result a child printed on its JSON result line, or None."""
  for line in reversed(stdout.splitlines()):
    if line.startswith('{'):
      payload = json.loads(line)
      if payload.get('event') == 'result' and payload.get('results'):
        return payload['results'][0]
  return None


def run_variants(job):
  """Runs each of the job's variants in a child process; returns their
  results.

  Raises:
    RuntimeError: a child failed (its stderr tail is in the message).
  """
  results = []
  measured = {}  # (mode, xla) -> (variant, result)
  for variant, mode, xla in job.variants:
    if (mode, xla) in measured:
      # E.g. none,auto where auto is none: the same child again would
      # measure the same thing.
      earlier, result = measured[(mode, xla)]
      logging.info('%s is --mixed_precision=%s%s here, as %s: its result '
                   'is reused, not measured again', variant, mode,
                   ' --use_xla' if xla else '', earlier)
      results.append(dict(result, bench_variant=variant))
      continue
    logging.info('benchmarking %s (--mixed_precision=%s%s)', variant, mode,
                 ' --use_xla' if xla else '')
    proc = subprocess.run(_child_argv(job, mode, xla), capture_output=True,
                          text=True, check=False)
    result = _child_result(proc.stdout)
    if proc.returncode or result is None:
      tail = '\n'.join(proc.stderr.strip().splitlines()[-15:])
      raise RuntimeError('benchmark of %s failed (exit %d):\n%s'
                         % (variant, proc.returncode, tail))
    measured[(mode, xla)] = (variant, result)
    # The setting as given: auto's result says bf16 or none.
    results.append(dict(result, bench_variant=variant))
  return results


def _write_json(results, path):
  """One JSON line per result, written under a temp name."""
  text = ''.join(json.dumps(r, sort_keys=True) + '\n' for r in results)
  atomic.write_bytes(path, text.encode('utf-8'))


def run_compare(job):
  """Compares with the original trainer; prints the table and the result
  line, writes bench_json."""
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  result = bench.run_comparison(job.compare)
  print(bench.format_comparison(result))
  if job.bench_json:
    atomic.write_bytes(job.bench_json, (bench.result_json_line(result) +
                                        '\n').encode('utf-8'))
  app.print_final_result('ok', **result)


def _exported_child_argv(job, path, threads, image_size):
  """The command line of the child measuring one exported model."""
  options = job.options
  return [sys.executable, '-m', 'deeplab_train.cli.bench',
          '--exported_model=' + path, '--bench_threads=%d' % threads,
          '--bench_image_size=%d,%d' % tuple(image_size),
          '--bench_batch_size=%d' % options.batch_size,
          '--bench_runs=%d' % options.runs,
          '--bench_warmup_runs=%d' % options.warmup_runs, '--bench_child']


def run_exported(job):
  """Measures exported models (each in child processes, or this child's
  one); prints the table and the result line, writes bench_json."""
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.bench import exported as bench_exported
  if job.child:
    result = bench_exported.measure_model(
        job.paths[0], job.options.threads[0], job.options.image_size,
        job.options)
    app.print_final_result('ok', mode=bench_exported.MODE, results=[result])
    return
  facts = bench_exported.inspect_models(job.paths)
  sizes = bench_exported.image_sizes(facts, job.options.image_size)
  results = bench_exported.run_children(
      facts, sizes, job.options,
      lambda path, threads, size: _exported_child_argv(job, path, threads,
                                                       size))
  print(bench_exported.format_table(results))
  if job.bench_json:
    _write_json(results, job.bench_json)
  app.print_final_result('ok', mode=bench_exported.MODE, results=results)


def run_job(job):
  """Measures, prints the table and the result line, writes bench_json."""
  if isinstance(job, ExportedCommandJob):
    run_exported(job)
    return
  if job.compare is not None:
    run_compare(job)
    return
  if job.variants and not job.child:
    results = run_variants(job)
  else:
    results = [run_one(job)]
  from deeplab_train import bench  # pylint: disable=g-import-not-at-top
  if not job.child:
    print(bench.format_table(results))
    if job.bench_json:
      _write_json(results, job.bench_json)
  app.print_final_result('ok', results=results)


def main(argv):
  """Runs the command; a SIGTERM/SIGINT ends the child process measuring
  (a trainer, a setting, an exported model) before this one exits with
  128 + the signal number and a 'terminated'/'interrupted' result line
  (app.run_body)."""
  return app.run_body(COMMAND, argv, lambda: run_job(options_from_flags()),
                      flag_names=FLAG_NAMES)


def run():
  app.start(COMMAND, main, __doc__, (__name__,))


if __name__ == '__main__':
  run()
