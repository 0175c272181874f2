"""deeplab-build-data: image + label folders -> sharded TFRecords + dataset.json.

VOC layout (the original converter's flags), every <split>.txt in the list
folder, or only --split_name:

  deeplab-build-data --image_folder=VOC2012/JPEGImages \\
      --semantic_segmentation_folder=VOC2012/SegmentationClass \\
      --list_folder=VOC2012/ImageSets/Segmentation --output_dir=tfrecord

Generic layout: images matched to <stem>.png masks by file stem, one split:

  deeplab-build-data --image_folder=images --masks_folder=masks \\
      --split_name=train --output_dir=tfrecord --num_classes=6 \\
      --dataset_name=mydata

Cityscapes layout (leftImg8bit/<split>/<city>/*_leftImg8bit.png with
gtFine/<split>/<city>/*_gtFine_labelTrainIds.png, or else the
*_gtFine_labelIds.png the dataset ships, mapped to its 19 train ids), train
and val, or only --split_name; --dataset_name and --num_classes default to
cityscapes and 19 there:

  deeplab-build-data --cityscapes_root=cityscapes --output_dir=tfrecord

ADE20K layout (the original ADE20K converter's flags): a folder of images
and one of <stem>.png labels for each of train and val (or one of them);
--dataset_name, --num_classes and --ignore_label default to ade20k, 151
and 0 there:

  deeplab-build-data \\
      --train_image_folder=ADEChallengeData2016/images/training \\
      --train_image_label_folder=ADEChallengeData2016/annotations/training \\
      --val_image_folder=ADEChallengeData2016/images/validation \\
      --val_image_label_folder=ADEChallengeData2016/annotations/validation \\
      --output_dir=tfrecord

Palette ('P') and grey ('L') label PNGs are read as class ids; RGB colour
labels are converted through --colormap (or refused with
--noconvert_rgb_labels). Run once per split to add splits to the same
--output_dir: dataset.json keeps the union of the splits.

dataset.json also records each split's statistics (images, size range,
pixels per class and of the ignore label), which are printed as a table,
with warnings for a class missing from a training split, a class under
0.1 % of the labelled pixels and ignore over 30 % of the pixels
(deeplab-stats prints the same for existing TFRecords).
One build at a time runs on an --output_dir: it holds the folder's lock.
A build killed while renaming its finished files into place is finished by
the next build on that folder (the other commands refuse the folder until
then).
Exit status: 0 done, 2 bad input (one-line message on stderr), 75 another
deeplab-build-data is converting into --output_dir (one line naming its
pid), 1 anything else; the last line on stdout is a JSON result line.
"""
import dataclasses
import logging
from typing import Optional, Tuple

from absl import flags

from deeplab_train.cli import app
from deeplab_train.cli import flag_table
from deeplab_train.cli import output_paths
from deeplab_train.config import ConfigError
from deeplab_train.data import build_inputs
from deeplab_train.data import build_options
from deeplab_train.data import colormap
from deeplab_train.data import datasets
from deeplab_train.data import stats
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS
COMMAND = 'deeplab-build-data'

# The original converter's flags and defaults.
_CONVERTER_TABLE = (
    ('string', 'image_folder', './VOCdevkit/VOC2012/JPEGImages',
     'Folder containing images.'),
    ('string', 'semantic_segmentation_folder',
     './VOCdevkit/VOC2012/SegmentationClassRaw',
     'VOC layout: folder containing the label PNGs.'),
    ('string', 'list_folder', './VOCdevkit/VOC2012/ImageSets/Segmentation',
     'VOC layout: folder of <split>.txt lists of image ids.'),
    ('string', 'output_dir', './tfrecord',
     'Folder for the TFRecord shards and dataset.json.'),
    ('enum', 'image_format', 'jpg',
     'VOC layout: extension of the image files.',
     {'enum_values': ['jpg', 'jpeg', 'png']}),
    ('enum', 'label_format', 'png',
     'Extension of the label files.', {'enum_values': ['png']}),
)

# Generic layout.
_GENERIC_LAYOUT_TABLE = (
    ('string', 'masks_folder', None,
     'Generic layout: folder of <stem>.png label masks, matched to the '
     '.jpg/.jpeg/.png images in --image_folder by file stem. Setting it '
     'selects the generic layout.'),
    ('string', 'split_name', None,
     'Split to write. Required with --masks_folder; in the VOC layout, '
     'convert only <split_name>.txt; in the Cityscapes layout, only that '
     'split\'s folder.'),
)

# Cityscapes layout (the original Cityscapes converter's flag).
_CITYSCAPES_LAYOUT_TABLE = (
    ('string', 'cityscapes_root', None,
     'Cityscapes layout: the folder holding leftImg8bit/ and gtFine/. '
     'Setting it selects the Cityscapes layout.'),
)

# ADE20K layout (the original ADE20K converter's flags): split -> the flags
# of its image and label folders.
_PAIRED_SPLITS = {split: ('%s_image_folder' % split,
                          '%s_image_label_folder' % split)
                  for split in ('train', 'val')}
_PAIRED_LAYOUT_TABLE = tuple(
    row for split, (images, labels) in _PAIRED_SPLITS.items() for row in (
        ('string', images, None,
         'ADE20K layout: folder of the %s split\'s images, matched to the '
         '<stem>.png labels of --%s by file stem. Setting it selects this '
         'layout, in which each split given has its two folders.'
         % (split, labels)),
        ('string', labels, None,
         'ADE20K layout: folder of the %s split\'s <stem>.png labels.'
         % split)))

# Dataset description and validation.
_DATASET_TABLE = (
    ('integer', 'num_classes', 21,
     'Number of classes; label ids must be in [0, num_classes) or '
     '--ignore_label.'),
    ('integer', 'ignore_label', 255, 'Label id of ignored pixels.'),
    ('string', 'dataset_name', 'pascal_voc_seg',
     'Name stored in dataset.json (the --dataset to train with).'),
    ('list', 'class_names', None,
     'Comma-separated class names (num_classes of them) for dataset.json; '
     'built-in datasets have their own.'),
    ('enum', 'colormap', None,
     'Palette of RGB colour labels and of dataset.json (default: the '
     'dataset\'s own, else pascal).',
     {'enum_values': colormap.known_colormaps()}),
    ('boolean', 'convert_rgb_labels', True,
     'Convert RGB colour labels to ids through --colormap; with '
     '--noconvert_rgb_labels they are refused.'),
)

# Output.
_OUTPUT_TABLE = (
    ('integer', 'num_shards', 4, 'Shards per split.'),
    ('integer', 'num_workers', None,
     'Threads converting shards in parallel (default: one per core, at most '
     '--num_shards).'),
)
flag_table.define(_CONVERTER_TABLE, _GENERIC_LAYOUT_TABLE,
                  _CITYSCAPES_LAYOUT_TABLE, _PAIRED_LAYOUT_TABLE,
                  _DATASET_TABLE, _OUTPUT_TABLE)


# Conversion errors name BuildOptions fields and the arguments of
# build_voc / build_generic / build_paired_splits / convert; each is set by
# the flag of the same name, except:
FLAG_NAMES = {'build_voc.label_folder': 'semantic_segmentation_folder',
              'build_cityscapes.root': 'cityscapes_root'}


@dataclasses.dataclass(frozen=True)
class BuildJob:
  """What to convert: the folders, their layout, and the dataset options.

  `cityscapes_root` set selects the Cityscapes layout, `masks_folder` set
  the generic layout (images matched to masks by file stem), `split_folders`
  ((split, image folder, label folder) each) the ADE20K layout (the generic
  one for each split); otherwise the VOC layout reads the id lists of
  `list_folder`.
  """
  options: build_options.BuildOptions
  image_folder: str
  output_dir: str
  label_format: str = 'png'
  split_name: Optional[str] = None
  masks_folder: Optional[str] = None
  semantic_segmentation_folder: Optional[str] = None
  list_folder: Optional[str] = None
  image_format: str = 'jpg'
  cityscapes_root: Optional[str] = None
  split_folders: Tuple[Tuple[str, str, str], ...] = ()


def _paired_layout():
  """The ADE20K layout's flags given: [(split, image folder flag, label
  folder flag)] of the splits of which one is given."""
  return [(split, images, labels)
          for split, (images, labels) in _PAIRED_SPLITS.items()
          if FLAGS[images].value or FLAGS[labels].value]


def _layout():
  """The flag that selects the layout given ('cityscapes_root',
  'masks_folder', or the first of the ADE20K layout's given), or None for
  the VOC layout."""
  selected = ['--' + name for name in ('cityscapes_root', 'masks_folder')
              if FLAGS[name].value]
  paired = _paired_layout()
  if paired:
    _, images, labels = paired[0]
    selected.append('--' + (images if FLAGS[images].value else labels))
  if len(selected) > 1:
    raise ConfigError('%s select two layouts; give one',
                      ' and '.join(selected))
  return selected[0][2:] if selected else None


# The built-in dataset whose name, class count and ignore label a layout's
# conversion takes where their flags are not given.
_PAIRED_FLAGS = [name for pair in _PAIRED_SPLITS.values() for name in pair]
_LAYOUT_DATASETS = dict({name: 'ade20k' for name in _PAIRED_FLAGS},
                        cityscapes_root='cityscapes')


def _dataset_defaults(layout):
  """(dataset_name, num_classes, ignore_label) from the flags; in the
  Cityscapes and ADE20K layouts those not given are that dataset's own."""
  given = (FLAGS.dataset_name, FLAGS.num_classes, FLAGS.ignore_label)
  if layout not in _LAYOUT_DATASETS:
    return given
  dataset = datasets.BUILTIN_DATASETS[_LAYOUT_DATASETS[layout]]
  own = (dataset.name, dataset.num_classes, dataset.ignore_label)
  return tuple(value if FLAGS[name].present else default
               for name, value, default in zip(
                   ('dataset_name', 'num_classes', 'ignore_label'), given,
                   own))


_PAIRED_NOT_READ = {
    name: 'each split\'s images and labels are read from its own '
          '--SPLIT_image_folder and --SPLIT_image_label_folder'
    for name in ('image_folder', 'semantic_segmentation_folder',
                 'list_folder', 'image_format')}
_PAIRED_NOT_READ['split_name'] = (
    'the splits converted are those whose --SPLIT_image_folder is given')

# The flags of one layout that another layout does not read: given, they
# would be ignored (a list of the images to convert, silently not used).
_NOT_READ = {
    **{name: _PAIRED_NOT_READ for name in _PAIRED_FLAGS},
    'masks_folder': {
        'list_folder': 'to convert only the images a <split>.txt list names, '
                       'give the masks as --semantic_segmentation_folder (the '
                       'VOC layout) in place of --masks_folder',
        'semantic_segmentation_folder': 'give the masks as one of the two',
        'image_format': 'the images of --image_folder are taken as found '
                        '(.jpg, .jpeg and .png)'},
    'cityscapes_root': {
        name: 'the images and labels are read under the root '
              '(leftImg8bit/ and gtFine/)'
        for name in ('image_folder', 'semantic_segmentation_folder',
                     'list_folder', 'image_format')},
}


def _check_layout_flags():
  """The layout selected (see `_layout`); raises ConfigError for a flag
  that layout does not read, or half of a split's pair of folders."""
  layout = _layout()
  for name, fix in _NOT_READ.get(layout, {}).items():
    if FLAGS[name].present:
      raise ConfigError('--%s is not read in the layout --%s selects: %s',
                        name, layout, fix)
  for _, images, labels in _paired_layout():
    for given, missing in ((images, labels), (labels, images)):
      if not FLAGS[missing].value:
        raise ConfigError('--%s=%s needs --%s: give the folder of the '
                          'split\'s %s', given, FLAGS[given].value, missing,
                          'labels' if missing == labels else 'images')
  if FLAGS.split_name is not None:
    why = build_inputs.split_name_problem(FLAGS.split_name)
    if why:
      raise ConfigError('--split_name=%s: %s', FLAGS.split_name, why)
  return layout


def options_from_flags():
  """The flags -> a BuildJob (its BuildOptions validated)."""
  layout = _check_layout_flags()
  dataset_name, num_classes, ignore_label = _dataset_defaults(layout)
  options = build_options.BuildOptions(
      num_classes=num_classes, ignore_label=ignore_label,
      dataset_name=dataset_name,
      class_names=tuple(FLAGS.class_names) if FLAGS.class_names else None,
      colormap=FLAGS.colormap, convert_rgb_labels=FLAGS.convert_rgb_labels,
      num_shards=FLAGS.num_shards, num_workers=FLAGS.num_workers).validate()
  output_paths.check_output_folder('output_dir', FLAGS.output_dir)
  job = BuildJob(
      options=options, image_folder=FLAGS.image_folder,
      output_dir=FLAGS.output_dir, label_format=FLAGS.label_format,
      split_name=FLAGS.split_name, masks_folder=FLAGS.masks_folder,
      semantic_segmentation_folder=FLAGS.semantic_segmentation_folder,
      list_folder=FLAGS.list_folder, image_format=FLAGS.image_format,
      cityscapes_root=FLAGS.cityscapes_root,
      split_folders=tuple((split, FLAGS[images].value, FLAGS[labels].value)
                          for split, images, labels in _paired_layout()))
  _check_input_folders(job)
  return job


def _check_input_folders(job):
  """Raises ConfigError naming the flag of a missing input folder: before
  the conversion loads TensorFlow (seconds), so that a wrong path, or the
  original's VOC defaults where there is no VOCdevkit, is answered at
  once. The conversion lists and checks everything else."""
  if job.cityscapes_root:
    folders = (('{build_cityscapes.root}', job.cityscapes_root),)
  elif job.split_folders:
    folders = tuple(
        (field, path) for split, images, labels in job.split_folders
        for field, path in zip(build_inputs.paired_fields(split),
                               (images, labels)))
  elif job.masks_folder:
    folders = (('{build_generic.image_folder}', job.image_folder),
               ('{build_generic.masks_folder}', job.masks_folder))
  else:
    folders = (('{build_voc.image_folder}', job.image_folder),
               ('{build_voc.label_folder}', job.semantic_segmentation_folder),
               ('{build_voc.list_folder}', job.list_folder))
  for field, path in folders:
    build_inputs.require_dir(path, field)


def convert(job):
  """Runs the conversion the job describes; returns the DatasetInfo."""
  from deeplab_train.data import build  # pylint: disable=g-import-not-at-top
  if job.cityscapes_root:
    return build.build_cityscapes(job.cityscapes_root, job.output_dir,
                                  job.options, split_name=job.split_name)
  if job.split_folders:
    return build.build_paired_splits(job.split_folders, job.output_dir,
                                     job.options,
                                     label_format=job.label_format)
  if job.masks_folder:
    return build.build_generic(job.image_folder, job.masks_folder,
                               job.split_name, job.output_dir, job.options,
                               label_format=job.label_format)
  return build.build_voc(job.image_folder, job.semantic_segmentation_folder,
                         job.list_folder, job.output_dir, job.options,
                         split_name=job.split_name,
                         image_format=job.image_format,
                         label_format=job.label_format)


def report_statistics(info, splits):
  """Prints the statistics table of each of `splits` that info counted and
  logs its warnings.

  Returns:
    The warnings, in order.
  """
  warnings = []
  for split in splits:
    counted = info.split_statistics(split)
    if counted is None:
      continue
    print(stats.format_table(split, counted, info.class_names,
                             info.ignore_label))
    for warning in stats.split_warnings(split, counted, info.class_names,
                                        info.ignore_label):
      logging.warning('%s', warning)
      warnings.append(warning)
  return warnings


def _build():
  job = options_from_flags()
  info = convert(job)
  print('wrote %s: dataset %r, %d classes, ignore %d, splits %s'
        % (job.output_dir, info.name, info.num_classes, info.ignore_label,
           ', '.join('%s=%d' % kv for kv in sorted(
               info.splits_to_sizes.items()))))
  # The splits converted now (every split of a VOC layout without
  # --split_name).
  warnings = report_statistics(
      info, [job.split_name] if job.split_name else
      [split for split, _, _ in job.split_folders] or sorted(
          info.statistics or {}))
  app.print_final_result('ok', output_dir=job.output_dir,
                         dataset=info.name, num_classes=info.num_classes,
                         ignore_label=info.ignore_label,
                         splits=dict(info.splits_to_sizes),
                         warnings=warnings)


def main(argv):
  logging.getLogger('deeplab_train').setLevel(logging.INFO)
  # Bad input or an unwritable --output_dir: one line, no traceback.
  return app.run_body(COMMAND, argv, _build, bad_input=(ConfigError, OSError),
                      flag_names=FLAG_NAMES)


def run():
  app.start(COMMAND, main, __doc__, (__name__,))


if __name__ == '__main__':
  run()
