"""deeplab-stats: class statistics of a split's TFRecords.

  deeplab-stats --dataset_dir=TFRECORDS [--dataset=NAME] [--split=train]
      [--num_classes=N --ignore_label=255] [--write_dataset_json]

Reads every record of the split (ours, or the original DeepLab converter's:
same tf.Example keys), decodes each label as the trainer does, and prints
the image count, the range of image sizes, the pixels of each class (count
and share of the labelled pixels) and the share of ignore pixels, the same
table deeplab-build-data prints and records in dataset.json. Warnings name
a class missing from a training split (train*), a class under 0.1 % of the
labelled pixels, ignore over 30 % of the pixels, and ids that are neither a
class nor the ignore label (e.g. palette PNGs stored as-is).

The classes come from --dataset_dir/dataset.json, else from the built-in
dataset --dataset, else from --num_classes and --ignore_label (records of a
dataset added to the original DeepLab's data_generator.py by hand). With
--write_dataset_json the split's statistics are also recorded there (the
file is created from that descriptor when absent), e.g. for deeplab-train
--label_weights=auto on records converted by the original DeepLab.

The other commands' flags (--model_variant, --master, ...) are refused:
this command reads none of them.

With --write_dataset_json it holds the folder's lock, as deeplab-build-data
does, and writes nothing if a build changed the split's records or
dataset.json while they were counted (bad input: run it again).

Exit status: 0 done, 2 bad input (one-line message on stderr), 75 a
deeplab-build-data is writing --dataset_dir (with --write_dataset_json;
one line naming its pid), 1 anything else; the last line on stdout is a
JSON result line.
"""
import dataclasses
import logging
import os
from typing import Optional, Tuple

from absl import flags

from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import output_paths
from deeplab_train.config import ConfigError
from deeplab_train.data import build_inputs
from deeplab_train.data import datasets
from deeplab_train.data import stats
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS
COMMAND = 'deeplab-stats'

_STATS_TABLE = (
    ('string', 'split', 'train', 'The split to count.'),
    ('boolean', 'write_dataset_json', False,
     'Also record the split\'s statistics in --dataset_dir/dataset.json '
     '(created from the built-in --dataset when absent), where '
     'deeplab-train --label_weights=auto reads them.'),
    # deeplab-build-data and -export define the same flags (same type and
    # default); either definition may be the one registered when their
    # modules are imported together.
    ('integer', 'num_classes', 21,
     'Classes of a --dataset that is neither built in nor described by a '
     'dataset.json in --dataset_dir (e.g. one added to the original '
     'DeepLab\'s data_generator.py); --write_dataset_json records it.',
     {'allow_override': True}),
    ('integer', 'ignore_label', 255,
     'Ignore label of such a dataset (with --num_classes).',
     {'allow_override': True}),
)
flag_table.define(_STATS_TABLE)
# --dataset and --dataset_dir are the other commands' (cli/common_flags.py);
# --help lists them with this command's own.
_SHARED_FLAGS_READ = ('dataset', 'dataset_dir')
for _name in _SHARED_FLAGS_READ:
  flags.declare_key_flag(_name)


@dataclasses.dataclass(frozen=True)
class StatsJob:
  """What to count: the split's files and the dataset they belong to."""
  dataset_dir: str
  split: str
  files: Tuple[str, ...]
  dataset_info: datasets.DatasetInfo
  write_dataset_json: bool = False
  # The split's files and dataset.json as listed (name, size, mtime):
  # dataset.json is written only if a build did not change them since.
  listed: Tuple[Tuple[str, int, int], ...] = ()
  # The split's size in the folder's dataset.json, if it records one.
  recorded_size: Optional[int] = None


def _listed(dataset_dir, split):
  """(path, size, mtime in ns) of the split's files and dataset.json."""
  from deeplab_train.data import tfrecord  # pylint: disable=g-import-not-at-top
  paths = tfrecord.list_split_files(dataset_dir, split) + [
      os.path.join(dataset_dir, datasets.DATASET_JSON)]
  out = []
  for path in paths:
    try:
      info = os.stat(path)
    except FileNotFoundError:
      continue
    out.append((path, info.st_size, info.st_mtime_ns))
  return tuple(out)


def options_from_flags():
  """The flags -> a StatsJob.

  Raises:
    ConfigError: another command's flag given, no --dataset_dir, no such
      folder or split, unknown dataset.
  """
  _refuse_other_commands_flags()
  common_flags.require(FLAGS.dataset_dir, 'dataset_dir',
                       ': the folder of the TFRecords')
  # A pattern (train*) counted several splits as one, and with
  # --write_dataset_json recorded a split named so.
  why = build_inputs.split_name_problem(FLAGS.split)
  if why:
    raise ConfigError('--split=%s: %s', FLAGS.split, why)
  from deeplab_train.data import pipeline  # pylint: disable=g-import-not-at-top
  listed = _listed(FLAGS.dataset_dir, FLAGS.split)
  files = pipeline.split_files(FLAGS.dataset_dir, FLAGS.split)
  if FLAGS.write_dataset_json:
    # Before the counting, which can take long.
    output_paths.check_writable(
        'dataset_dir', FLAGS.dataset_dir,
        '--write_dataset_json writes its dataset.json (and its lock) there; '
        'leave that flag out to count only')
  described = datasets.read_dataset_json(FLAGS.dataset_dir)
  return StatsJob(dataset_dir=FLAGS.dataset_dir, split=FLAGS.split,
                  files=tuple(files), dataset_info=_dataset_info(described),
                  write_dataset_json=FLAGS.write_dataset_json, listed=listed,
                  recorded_size=(described.splits_to_sizes.get(FLAGS.split)
                                 if described else None))


def _refuse_other_commands_flags():
  """The flags shared by the other commands (cli/common_flags.py) parse
  here too, since the module defines them; all but --dataset and
  --dataset_dir would be ignored, so given here they are bad input."""
  given = sorted(flag.name for flag in FLAGS.get_flags_for_module(
      common_flags.__name__)
                 if flag.present and flag.name not in _SHARED_FLAGS_READ)
  if given:
    raise ConfigError(
        '--%s is not a %s flag: it counts the labels of a split\'s records '
        'and reads only --dataset_dir, --dataset, --split and '
        '--write_dataset_json; remove %s', given[0], COMMAND,
        ', '.join('--' + name for name in given))


def _dataset_info(described):
  """dataset.json (`described`, or None), else the built-in --dataset,
  else the dataset that --num_classes and --ignore_label describe; without
  --dataset the file's own name is taken (no warning that it differs from
  the default).

  Raises:
    ConfigError: --num_classes or --ignore_label given for a described
      dataset, or an unknown dataset without them.
  """
  by_flags = [name for name in ('num_classes', 'ignore_label')
              if common_flags.explicitly_set(name)]
  if by_flags:
    if described is not None or FLAGS.dataset in datasets.BUILTIN_DATASETS:
      drop = ' and '.join('--' + name for name in by_flags)
      if described is None:
        raise ConfigError('--dataset=%s is described by the built-in '
                          'dataset: drop %s', FLAGS.dataset, drop)
      # Without --dataset, the file's own name (not the default) is meant.
      named = ('--dataset=%s' % FLAGS.dataset
               if common_flags.explicitly_set('dataset')
               else 'dataset %r' % described.name)
      raise ConfigError('%s is described by %s: drop %s', named,
                        os.path.join(FLAGS.dataset_dir, datasets.DATASET_JSON),
                        drop)
    if 'num_classes' not in by_flags:
      raise ConfigError('--ignore_label describes a dataset with '
                        '--num_classes: add it')
    return datasets.DatasetInfo(
        name=FLAGS.dataset, num_classes=FLAGS.num_classes,
        ignore_label=FLAGS.ignore_label, splits_to_sizes={}).validate(
            '--num_classes=%d --ignore_label=%d'
            % (FLAGS.num_classes, FLAGS.ignore_label))
  if described is not None and not common_flags.explicitly_set('dataset'):
    return described
  if described is None and FLAGS.dataset not in datasets.BUILTIN_DATASETS:
    raise ConfigError(
        'unknown dataset %r and no %s: describe its records with '
        '--num_classes=N [--ignore_label=255] (and --write_dataset_json to '
        'record it for the other commands), or use a built-in dataset (%s)',
        FLAGS.dataset, os.path.join(FLAGS.dataset_dir, datasets.DATASET_JSON),
        ', '.join(sorted(datasets.BUILTIN_DATASETS)))
  return common_flags.dataset_info()


def count(job):
  """The stats.SplitStats of the job's split.

  Raises:
    ConfigError: a damaged file or a record that cannot be decoded.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf
  from deeplab_train.data import pipeline
  info = job.dataset_info
  try:
    return stats.count_records(job.files, info.num_classes,
                               info.ignore_label, split=job.split)
  except tf.errors.DataLossError as e:
    raise ConfigError('%s', pipeline.data_error_message(e, job.files)
                      ) from None


def record(job, counted):
  """Writes `counted` into the job's dataset.json; returns its path.

  Holds the lock of the folder's writers (data/build.py), and writes only
  if a deeplab-build-data did not change the split's files or dataset.json
  while they were counted (their statistics or splits would be lost).

  Raises:
    ConfigError: they changed.
    locking.FolderLockedError: a deeplab-build-data is writing the folder.
  """
  from deeplab_train.data import build  # pylint: disable=g-import-not-at-top
  with build.folder_lock(job.dataset_dir, COMMAND):
    if _listed(job.dataset_dir, job.split) != job.listed:
      raise ConfigError(
          'the records of split %r or dataset.json in %s changed while they '
          'were counted (a deeplab-build-data wrote them); nothing was '
          'written: run %s again', job.split, job.dataset_dir, COMMAND)
    info = job.dataset_info.with_statistics(job.split, counted)
    return datasets.write_dataset_json(job.dataset_dir, info)


def _stats():
  job = options_from_flags()
  info = job.dataset_info
  counted = count(job)
  print(stats.format_table(job.split, counted, info.class_names,
                           info.ignore_label))
  warnings = stats.split_warnings(job.split, counted, info.class_names,
                                  info.ignore_label)
  expected = job.recorded_size
  if expected is not None and expected != counted.num_images:
    warnings.append(
        '%s records %d images for split %r, its TFRecords hold %d: the '
        'records were changed or replaced since it was written (%s)' % (
            os.path.join(job.dataset_dir, datasets.DATASET_JSON), expected,
            job.split, counted.num_images,
            'the count is recorded now' if job.write_dataset_json else
            'rebuild the split with deeplab-build-data, or record the count '
            'with --write_dataset_json'))
  for warning in warnings:
    logging.warning('%s', warning)
  written = record(job, counted) if job.write_dataset_json else None
  if written:
    print('recorded the statistics of split %r in %s' % (job.split, written))
  app.print_final_result(
      'ok', dataset_dir=job.dataset_dir, split=job.split, dataset=info.name,
      num_classes=info.num_classes, ignore_label=info.ignore_label,
      statistics=counted.to_dict(), ignore_share=counted.ignore_share,
      warnings=warnings, dataset_json=written)


def main(argv):
  logging.getLogger('deeplab_train').setLevel(logging.INFO)
  return app.run_body(COMMAND, argv, _stats)


def run():
  app.start(COMMAND, main, __doc__, (__name__,))


if __name__ == '__main__':
  run()
