"""deeplab-bench: training speed of a model config on this machine.

    deeplab-bench --model_variant=mobilenet_v2 --output_stride=8 \\
        --train_crop_size=321,321 --train_batch_size=4 \\
        [--bench_data=synthetic|sample|dataset_dir] \\
        [--mixed_precision=none|bf16|fp16] [--use_xla] \\
        [--bench_variants=none,bf16,bf16+xla]

Takes deeplab-train's model and training flags. Measures in one process the
input pipeline's images/s, training images/s and s/step after warm-up, FLOPs
per step and the FLOP/s achieved, the fp32 matmul peak of the machine and
the share of it achieved, peak memory, and the time the towers waited for
input (see deeplab_train/bench.py for how). Prints a table and one JSON
line per measured setting (also written to --bench_json).

--bench_variants compares settings: each one runs in its own process (so
each has its own peak memory), one after the other, and the table gets a
column per setting with the ratio of training speeds to the first.

Data: --bench_data=synthetic writes VOC-sized synthetic JPEGs (21 classes),
sample converts the bundled sample dataset (data/ of the source tree), both
into a temp folder; dataset_dir reads --dataset_dir / --train_split.
"""
import json
import subprocess
import sys
import tempfile

from absl import flags
from absl import logging

from deeplab_train import atomic
from deeplab_train import bench
from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import train as train_cli
from deeplab_train.data import datasets
from deeplab_train.model import registry
from deeplab_train.train import graph as graph_lib
from deeplab_train.runtime import session_config as session_lib

FLAGS = flags.FLAGS
COMMAND = 'deeplab-bench'

flags.DEFINE_enum('bench_data', 'synthetic',
                  ['synthetic', 'sample', 'dataset_dir'],
                  'Data fed to the pipeline: synthetic VOC-sized images, the '
                  'bundled sample dataset, or --dataset_dir.')
flags.DEFINE_integer('bench_synthetic_images', 64,
                     'Images written with --bench_data=synthetic.')
flags.DEFINE_integer('bench_steps', 10, 'Timed training steps.')
flags.DEFINE_integer('bench_warmup_steps', 3,
                     'Training steps before timing.')
flags.DEFINE_integer('bench_trace_steps', 3,
                     'Traced steps measuring the input wait (0: skip).')
flags.DEFINE_integer('bench_input_batches', 50,
                     'Timed batches of the input pipeline alone.')
flags.DEFINE_integer('bench_matmul_size', 2048,
                     'Side of the fp32 matmul measuring the peak FLOP/s.')
flags.DEFINE_list('bench_variants', None,
                  'Settings to compare, each MODE or MODE+xla with MODE in '
                  'none/bf16/fp16, e.g. none,bf16,bf16+xla; one process '
                  'each. Unset: the --mixed_precision/--use_xla flags.')
flags.DEFINE_string('bench_json', None,
                    'Also write the JSON result lines to this file.')
flags.DEFINE_boolean('bench_child', False,
                     'Internal: run one setting and print its result for '
                     'the parent process.')

_RESULT_PREFIX = 'BENCH_RESULT '


def parse_variant(text):
  """'bf16+xla' -> ('bf16', True); 'none' -> ('none', False).

  Raises:
    config.ConfigError: unknown parts.
  """
  parts = [p.strip() for p in text.split('+') if p.strip()]
  xla = 'xla' in parts
  modes = [p for p in parts if p != 'xla']
  mode = modes[0] if len(modes) == 1 else ('none' if not modes else None)
  if mode == 'fp32':
    mode = 'none'
  if mode not in session_lib.MIXED_PRECISION_MODES or parts.count('xla') > 1:
    raise config.ConfigError(
        '--bench_variants: bad setting %r; use none, bf16 or fp16, '
        'optionally with +xla (e.g. bf16+xla)' % text)
  return mode, xla


def _data_source(tmp_dir):
  """(dataset_dir, DatasetInfo, split, label) for --bench_data."""
  if FLAGS.bench_data == 'synthetic':
    info = bench.write_synthetic_dataset(
        tmp_dir, num_images=FLAGS.bench_synthetic_images)
    return tmp_dir, info, 'train', 'synthetic'
  if FLAGS.bench_data == 'sample':
    info = bench.convert_sample_dataset(tmp_dir)
    return tmp_dir, info, 'train', 'sample'
  if not FLAGS.dataset_dir:
    raise config.ConfigError('--bench_data=dataset_dir needs --dataset_dir')
  info = datasets.load_dataset_info(FLAGS.dataset, FLAGS.dataset_dir)
  return FLAGS.dataset_dir, info, FLAGS.train_split, FLAGS.dataset_dir


def build_job(tmp_dir):
  """A BenchJob from the flags (data written into `tmp_dir` if needed).

  Raises:
    config.ConfigError: bad flags.
  """
  crop = common_flags.parse_int_list(FLAGS.train_crop_size, 'train_crop_size')
  if len(crop) != 2 or min(crop) < 1:
    raise config.ConfigError('--train_crop_size must be HEIGHT,WIDTH, got %s'
                             % ','.join(FLAGS.train_crop_size))
  dataset_dir, info, split, label = _data_source(tmp_dir)
  model_options = common_flags.model_options(info.num_classes, crop)
  train = train_cli.train_options().replace(tf_initial_checkpoint=None)
  for warning in config.check_training_setup(model_options, train):
    logging.warning('%s', warning)
  preprocess = config.PreprocessOptions(
      crop_size=crop, min_scale_factor=FLAGS.min_scale_factor,
      max_scale_factor=FLAGS.max_scale_factor,
      scale_factor_step_size=FLAGS.scale_factor_step_size,
      **common_flags.resize_values(None)).validate()

  def build_graph(input_fn):
    return graph_lib.build_training_graph(
        model_options, train, ignore_label=info.ignore_label,
        input_fn=input_fn)

  session_config = session_lib.from_train_options(train)
  return bench.BenchJob(
      model_options=model_options, train_options=train,
      preprocess_options=preprocess, dataset_dir=dataset_dir,
      dataset_info=info, split=split, data=label,
      mixed_precision=train.mixed_precision, use_xla=train.use_xla,
      session_config=session_config,
      peak_session_config=session_lib.make_session_config(
          intra_op_threads=train.intra_op_parallelism_threads,
          inter_op_threads=train.inter_op_parallelism_threads),
      build_graph=build_graph,
      mean_pixel=registry.get(model_options.model_variant).mean_pixel)


def bench_options():
  """BenchOptions from the --bench_* flags."""
  return bench.BenchOptions(
      warmup_steps=FLAGS.bench_warmup_steps, steps=FLAGS.bench_steps,
      trace_steps=FLAGS.bench_trace_steps,
      input_batches=FLAGS.bench_input_batches,
      matmul_size=FLAGS.bench_matmul_size).validate()


def run_one():
  """Benchmarks the current flags in this process; returns the result."""
  options = bench_options()
  with tempfile.TemporaryDirectory(prefix='deeplab-bench-') as tmp:
    job = build_job(tmp)
    return bench.run_benchmark(job, options)


_NOT_PASSED_TO_CHILDREN = ('bench_variants', 'mixed_precision', 'use_xla',
                           'bench_json', 'bench_child')


def _child_argv(variant):
  """The command line of the child process measuring `variant`."""
  mode, xla = parse_variant(variant)
  argv = [sys.executable, '-m', 'deeplab_train.cli.bench']
  seen = set()
  for name in sorted(FLAGS):
    flag = FLAGS[name]  # short names alias the same flag object
    if (flag.name in seen or flag.name in _NOT_PASSED_TO_CHILDREN or
        flag.using_default_value):
      continue
    seen.add(flag.name)
    argv.extend(flag.serialize().splitlines())  # multi flags: one per line
  return argv + ['--mixed_precision=%s' % mode,
                 '--use_xla' if xla else '--nouse_xla', '--bench_child']


def run_variants(variants):
  """Runs each variant in a child process; returns their results.

  Raises:
    RuntimeError: a child failed (its stderr tail is in the message).
  """
  results = []
  for variant in variants:
    parse_variant(variant)  # fail before starting any child
  for variant in variants:
    logging.info('benchmarking %s', variant)
    proc = subprocess.run(_child_argv(variant), capture_output=True,
                          text=True, check=False)
    lines = [l for l in proc.stdout.splitlines()
             if l.startswith(_RESULT_PREFIX)]
    if proc.returncode or not lines:
      tail = '\n'.join(proc.stderr.strip().splitlines()[-15:])
      raise RuntimeError('benchmark of %s failed (exit %d):\n%s'
                         % (variant, proc.returncode, tail))
    results.append(json.loads(lines[-1][len(_RESULT_PREFIX):]))
  return results


def _write_json(results, path):
  """One JSON line per result, written under a temp name."""
  text = ''.join(json.dumps(r, sort_keys=True) + '\n' for r in results)
  atomic.write_bytes(path, text.encode('utf-8'))


def main(argv):
  if len(argv) > 1:
    sys.stderr.write('%s: unexpected arguments %s (flags are written '
                     '--name=value)\n' % (COMMAND, ' '.join(argv[1:])))
    return 2
  try:
    if FLAGS.bench_variants and not FLAGS.bench_child:
      results = run_variants(FLAGS.bench_variants)
    else:
      results = [bench.rounded(run_one())]
  except config.ConfigError as e:
    sys.stderr.write('%s: %s\n' % (COMMAND, e))
    return 2
  if FLAGS.bench_child:
    print(_RESULT_PREFIX + json.dumps(results[0], sort_keys=True), flush=True)
    return 0
  print(bench.format_table(results))
  for result in results:
    print(json.dumps(result, sort_keys=True), flush=True)
  if FLAGS.bench_json:
    _write_json(results, FLAGS.bench_json)
  return 0


def run():
  app.start(COMMAND, main, __doc__, (__name__,))


if __name__ == '__main__':
  run()
