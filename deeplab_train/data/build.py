"""Converts image + label folders into sharded TFRecords and a dataset.json.

The conversion behind deeplab-build-data, in four modules:

  build_options   BuildOptions and the errors, which name option fields
  build_inputs    lists the pairs of a VOC-layout, generic or Cityscapes
                  dataset
  build_examples  reads, validates and encodes one pair
  build           (this module) writes the shards and dataset.json

A build is all or nothing: every split's shards and the new dataset.json are
written under hidden temp names, and renamed into place only when all are
complete, so a bad file or a full disk leaves the previous build as it was.
The renames follow a journal written first (tfrecord.SWITCH_JOURNAL), so a
build killed half-way through them is finished by the next build, and
readers refuse the folder until then (pipeline.split_files). One build at a
time runs on a folder: it holds the folder's lock (locking.py), under which
it also removes the temp files that killed builds left.
dataset.json keeps the union of the splits converted into one folder, and
each split's statistics (images, size range, pixels per class and of the
ignore label: data/stats.py), counted from the label arrays the conversion
decodes anyway.
"""
import concurrent.futures
import logging
import math
import os
import threading

from deeplab_train import atomic
from deeplab_train import locking
from deeplab_train.config import ConfigError
from deeplab_train.config import serialize
from deeplab_train.data import build_examples
from deeplab_train.data import build_inputs
from deeplab_train.data import build_options
from deeplab_train.data import datasets
from deeplab_train.data import pil_images
from deeplab_train.data import stats
from deeplab_train.data import tfrecord

_log = logging.getLogger(__name__)

# The names callers use as build.X (the command, deeplab-bench, tests).
BuildOptions = build_options.BuildOptions
DataError = build_options.DataError
Entry = build_inputs.Entry

LOCK_FILENAME = '.deeplab-build-data.lock'


def folder_lock(output_dir, command='deeplab-build-data'):
  """The lock of a TFRecord folder's writers (a build, deeplab-stats
  writing dataset.json): a locking.FolderLock to hold while writing."""
  return locking.FolderLock(
      output_dir, LOCK_FILENAME, command, 'deeplab-build-data or deeplab-stats '
      '--write_dataset_json on this folder')


def _write_failure(output_dir, error):
  """atomic.OutputNotWrittenError of the build's folder, for an OSError or
  TensorFlow OpError while writing its temp files: nothing of this build
  was renamed into place."""
  failed = atomic.not_written(output_dir, error)
  return atomic.OutputNotWrittenError(
      output_dir, '%s; the records and dataset.json already there are '
      'unchanged' % failed.strerror, failed.errno)


# ---------------------------------------------------------------------------
# Writing shards.
# ---------------------------------------------------------------------------
def _write_shard(entries, temp_path, options, stop):
  """Writes one shard; returns the stats.SplitCounter of its pairs."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  counter = stats.SplitCounter(options.num_classes, options.ignore_label)
  oriented = []
  try:
    with tf.io.TFRecordWriter(temp_path) as writer:
      for entry in entries:
        if stop.is_set():
          break
        pair = build_examples.encode_pair(entry, options)
        writer.write(pair.serialized)
        counter.add(pair.height, pair.width, pair.label_ids)
        if pair.orientation != 1:
          oriented.append(entry.image_path)
  except tf.errors.OpError as e:
    # The writer's (the pairs are read and encoded without TensorFlow).
    raise _write_failure(os.path.dirname(temp_path), e) from None
  if oriented:
    _log.warning('%s', pil_images.turned_note(
        oriented, 'Their pixels are stored as the files hold them, as '
        'TensorFlow reads them; if their labels were drawn on the images as '
        'viewers show them, they do not line up, so build again once the '
        'files are turned'))
  return counter


def _shard_ranges(num_items, num_shards):
  per_shard = int(math.ceil(num_items / float(num_shards)))
  return [(i * per_shard, min((i + 1) * per_shard, num_items))
          for i in range(num_shards)]


def write_split(entries, split, output_dir, options):
  """Converts `entries` into `options.num_shards` shards of `split`, under
  hidden temp names (never matched by the `{split}-*` reader glob).

  Shards are contiguous slices of `entries` (as the original converter),
  converted in parallel threads.

  Returns:
    ([(temp path, final path)] of the shards, which the caller renames into
    place (`_switch`) or removes; the split's stats.SplitStats).

  Raises:
    DataError: the first invalid pair (the temp files are removed).
  """
  n = options.num_shards
  finals = [os.path.join(output_dir, tfrecord.shard_filename(split, i, n))
            for i in range(n)]
  temps = [atomic.temp_name(p) for p in finals]
  workers = options.num_workers or min(n, os.cpu_count() or 1)
  stop = threading.Event()
  futures = []
  try:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
      try:
        for (a, b), temp in zip(_shard_ranges(len(entries), n), temps):
          futures.append(pool.submit(_write_shard, entries[a:b], temp,
                                     options, stop))
        for future in concurrent.futures.as_completed(futures):
          future.result()
      except BaseException:
        # E.g. a bad pair, or a SIGTERM raised here: the other shards stop
        # after their current pair, and the pool waits for them before
        # their temps are removed.
        stop.set()
        raise
  except BaseException:
    _remove(temps)
    raise
  counted = stats.merge_counters([f.result() for f in futures],
                                 options.num_classes, options.ignore_label)
  return list(zip(temps, finals)), counted


def _remove(paths):
  for path in paths:
    if os.path.exists(path):
      os.remove(path)


def _stale_shards(written, splits):
  """The shards of `splits` ([(folder, split)]) already in place that the
  new build did not write (it has another shard count)."""
  keep = {final for _, final in written}
  stale = []
  for output_dir, split in splits:
    for path in tfrecord.list_split_files(output_dir, split):
      # Standard names only (list_split_files gives none of another
      # split's): other files of the glob are not the build's to remove.
      if tfrecord.parse_shard_filename(path) and path not in keep:
        stale.append(path)
  return stale


def _switch(output_dir, written, stale, journaled):
  """Renames every written file into place, then removes the stale
  shards, following a journal written first and removed last, so that a
  build killed in between is finished by the next one (_finish_killed).
  A SIGTERM/SIGINT waits until the switch is done (atomic.signals_held):
  one during the journal's write left the whole new build as temp files,
  one during the renames a half-switched folder every reader refuses.
  `journaled` gets the journal's path once it is in place: from then on
  the temps are the next build's to rename, not to be removed."""
  plan = {'renames': [[os.path.basename(temp), os.path.basename(final)]
                      for temp, final in written],
          'remove': [os.path.basename(path) for path in stale]}
  journal = os.path.join(output_dir, tfrecord.SWITCH_JOURNAL)
  with atomic.signals_held():
    try:
      atomic.write_json(journal, plan)
    except OSError as e:
      raise _write_failure(output_dir, e) from None
    journaled.append(journal)
    try:
      _follow(output_dir, plan['renames'], plan['remove'])
      os.remove(journal)
    except OSError as e:
      raise atomic.OutputNotWrittenError(
          output_dir, '%s, while renaming the new build into place; the '
          'next deeplab-build-data on this folder finishes that'
          % atomic.not_written(output_dir, e).strerror, e.errno) from None


def _follow(output_dir, renames, remove):
  """Carries out a switch plan; what is already done is skipped."""
  for temp, final in renames:
    temp = os.path.join(output_dir, temp)
    if os.path.exists(temp):
      os.replace(temp, os.path.join(output_dir, final))
  for name in remove:
    path = os.path.join(output_dir, name)
    if os.path.exists(path):
      _log.info('removing stale shard %s', path)
      os.remove(path)


_NOT_A_PLAN = ('%s is not a switch plan deeplab-build-data wrote (%s); the '
               'records beside it may mix two builds: delete the folder\'s '
               'TFRecords, dataset.json and this file, then convert again')


def _finish_killed(output_dir):
  """Finishes the switch of a build killed half-way through it, then
  removes the temp files killed builds left. Call under the folder's lock.
  """
  journal = tfrecord.unfinished_switch(output_dir)
  if journal:
    plan = serialize.read_json_file(journal, _NOT_A_PLAN)
    try:
      renames = [(str(temp), str(final)) for temp, final in plan['renames']]
      remove = [str(name) for name in plan['remove']]
    except (ValueError, KeyError, TypeError) as e:
      raise ConfigError(_NOT_A_PLAN, journal, 'no list of %s' % e) from None
    _log.warning('finishing the build a killed deeplab-build-data left '
                 'half-switched in %s', output_dir)
    _follow(output_dir, renames, remove)
    os.remove(journal)
  for name in sorted(os.listdir(output_dir)):
    target = atomic.temp_target(name)
    if target in (datasets.DATASET_JSON, tfrecord.SWITCH_JOURNAL) or (
        target and tfrecord.parse_shard_filename(target)):
      _log.info('removing %s, left by a killed deeplab-build-data', name)
      os.remove(os.path.join(output_dir, name))


# ---------------------------------------------------------------------------
# dataset.json
# ---------------------------------------------------------------------------
def _check_existing(existing, options, path):
  if existing is None:
    return
  if (existing.num_classes, existing.ignore_label) != (
      options.num_classes, options.ignore_label):
    raise ConfigError(
        '%s says num_classes=%d, ignore_label=%d but this run uses '
        '{BuildOptions.num_classes}=%d {BuildOptions.ignore_label}=%d; use '
        'another {convert.output_dir} or delete the folder\'s TFRecords and '
        'dataset.json', path, existing.num_classes, existing.ignore_label,
        options.num_classes, options.ignore_label)
  if existing.name != options.dataset_name:
    # A split added without the name (the default, pascal_voc_seg) renamed
    # the dataset and gave it another palette, keeping its class names.
    raise ConfigError(
        '%s is of dataset %r but this run uses {BuildOptions.dataset_name}=%s;'
        ' give {BuildOptions.dataset_name}=%s to convert into it, or use '
        'another {convert.output_dir}', path, existing.name,
        options.dataset_name, existing.name)


def dataset_info_for(options, split_sizes, existing=None, split_stats=None):
  """The DatasetInfo to write: `existing` splits merged with `split_sizes`
  and their statistics with `split_stats` ({split: stats.SplitStats})."""
  splits = dict(existing.splits_to_sizes) if existing else {}
  splits.update(split_sizes)
  counted = dict(existing.statistics or {}) if existing else {}
  counted.update(split_stats or {})
  class_names = options.class_names
  builtin = datasets.BUILTIN_DATASETS.get(options.dataset_name)
  if class_names is None and existing is not None:
    class_names = existing.class_names
  if (class_names is None and builtin is not None and
      builtin.num_classes == options.num_classes):
    class_names = builtin.class_names
  return datasets.DatasetInfo(
      name=options.dataset_name, num_classes=options.num_classes,
      ignore_label=options.ignore_label, splits_to_sizes=splits,
      class_names=class_names, palette=options.palette(),
      statistics=counted or None)


def convert(splits_to_entries, output_dir, options):
  """Writes every split's shards, then merges them into dataset.json.

  Args:
    splits_to_entries: {split: [Entry, ...]}.
    output_dir: folder of the TFRecords (created if needed).
    options: BuildOptions.

  Returns:
    The DatasetInfo written to `output_dir/dataset.json` (its statistics
    hold the splits converted now, and those of earlier builds).

  Raises:
    ConfigError / DataError: bad options or input files.
  """
  options.validate()
  pil_images.quiet_unnamed_warnings()
  for split in splits_to_entries:
    why = build_inputs.split_name_problem(split)
    if why:
      raise ConfigError('cannot write split %r: %s', split, why)
  os.makedirs(output_dir, exist_ok=True)
  with folder_lock(output_dir):
    _finish_killed(output_dir)
    return _convert_locked(splits_to_entries, output_dir, options)


def _convert_locked(splits_to_entries, output_dir, options):
  json_path = os.path.join(output_dir, datasets.DATASET_JSON)
  existing = datasets.read_dataset_json(output_dir)
  _check_existing(existing, options, json_path)
  # All or nothing: every split is written under temp names first; the old
  # build (shards and dataset.json) stays as it was until all of them and
  # the new dataset.json are complete, then everything is renamed in.
  sizes, counted, written = {}, {}, []
  journaled = []  # the journal, once in place: the next build finishes it
  try:
    for split, entries in splits_to_entries.items():
      if not entries:
        raise ConfigError('split %r has no images', split)
      _log.info('converting %d images of split %r into %d shards',
                len(entries), split, options.num_shards)
      shards, counted[split] = write_split(entries, split, output_dir,
                                           options)
      written += shards
      sizes[split] = len(entries)
    info = dataset_info_for(options, sizes, existing, counted)
    info.validate(json_path)
    # dataset.json is renamed in last.
    written.append((atomic.temp_name(json_path), json_path))
    try:
      atomic.write_temp(written[-1][0], atomic.json_bytes(info.to_dict()))
    except OSError as e:
      raise _write_failure(output_dir, e) from None
    stale = _stale_shards(written, [(output_dir, split) for split in sizes])
    _switch(output_dir, written, stale, journaled)
  except BaseException:
    if not journaled:
      _remove([temp for temp, _ in written])
    raise
  return info


def build_voc(image_folder, label_folder, list_folder, output_dir, options,
              split_name=None, image_format='jpg', label_format='png'):
  """Converts a VOC-layout dataset (every list, or `split_name` only).

  Args:
    image_folder: folder of `<id>.<image_format>` images.
    label_folder: folder of `<id>.<label_format>` labels.
    list_folder: folder of `<split>.txt` id lists.
    output_dir: folder of the TFRecords (created if needed).
    options: BuildOptions.
    split_name: convert only this split (None: every list).
    image_format / label_format: file extensions.

  Returns:
    The DatasetInfo written.

  Raises:
    ConfigError / DataError: bad options, folders or input files.
  """
  build_inputs.require_dir(image_folder, '{build_voc.image_folder}')
  build_inputs.require_dir(label_folder, '{build_voc.label_folder}')
  lists = build_inputs.voc_split_files(list_folder, split_name)
  splits = {split: build_inputs.voc_entries(path, image_folder, label_folder,
                                            image_format, label_format)
            for split, path in lists.items()}
  return convert(splits, output_dir, options)


def build_generic(image_folder, masks_folder, split_name, output_dir,
                  options, label_format='png'):
  """Converts an images folder + masks folder into one split.

  Args:
    image_folder: folder of .jpg/.jpeg/.png images.
    masks_folder: folder of `<stem>.<label_format>` labels.
    split_name: the split to write (required).
    output_dir: folder of the TFRecords (created if needed).
    options: BuildOptions.
    label_format: extension of the label files.

  Returns:
    The DatasetInfo written.

  Raises:
    ConfigError / DataError: bad options, folders or input files.
  """
  if not split_name:
    raise ConfigError(
        '{build_generic.split_name} is required with '
        '{build_generic.masks_folder} (e.g. {build_generic.split_name}=train)')
  entries = build_inputs.generic_entries(image_folder, masks_folder,
                                         label_format)
  return convert({split_name: entries}, output_dir, options)


def build_paired_splits(split_folders, output_dir, options,
                        label_format='png'):
  """`build_generic` for several splits, each given as (split, image
  folder, label folder) in `split_folders` (the layout of ADE20K's
  ADEChallengeData2016); returns the DatasetInfo written."""
  return convert({split: build_inputs.generic_entries(
      images, labels, label_format, fields=build_inputs.paired_fields(split))
                  for split, images, labels in split_folders},
                 output_dir, options)


def build_cityscapes(root, output_dir, options, split_name=None):
  """Converts a Cityscapes root (train and val, or `split_name` only).

  Args:
    root: the folder holding leftImg8bit/ and gtFine/.
    output_dir: folder of the TFRecords (created if needed).
    options: BuildOptions (Cityscapes' train ids: 19 classes, ignore 255).
    split_name: convert only this split (None: train and val).

  Returns:
    The DatasetInfo written.

  Raises:
    ConfigError / DataError: bad options, folders or input files.
  """
  splits = build_inputs.cityscapes_splits(root, split_name)
  return convert({split: build_inputs.cityscapes_entries(root, split)
                  for split in splits}, output_dir, options)
