r"""deeplab-vis: coloured prediction PNGs for a split or a folder of images.

    deeplab-vis --checkpoint_dir=TRAIN_LOGDIR --vis_logdir=OUT \
        (--dataset_dir=TFRECORDS [--vis_split=val] | --image_dir=PHOTOS) \
        [--also_save_raw_predictions] [--save_overlay] \
        [--colormap_type=pascal|cityscapes|ade20k] [--max_number_of_images=N] \
        [--vis_legend=none|on_image|file]

Uses the latest checkpoint of --checkpoint_dir (or a checkpoint prefix) and
the model options saved beside it. PNGs are named after the images and have
the input image's size (see deeplab_train/evaluation/vis.py for the layout).

--vis_legend names the colours: 'on_image' widens each prediction and overlay
PNG by a strip listing the classes present (swatch, id, name, pixel share,
largest first); 'file' writes VIS_LOGDIR/legend.png listing every class and
leaves the per-image PNGs as they are; 'none' (default) draws no legend.
Class names come from the dataset ('class N' when it names none); the raw
class-id PNGs never get a legend. Names beyond ASCII are drawn with a system
font that has them (found with fontconfig's fc-match); characters no font
here draws are named in a warning.

--exported_model=PATH (a frozen .pb, a SavedModel folder or a .tflite file)
draws with what deeplab-export wrote instead of a checkpoint. Its options
come from a deeplab_config.json beside it, else from the flags; its crop,
scales, flips and (but for TFLite) resize were fixed at export, so those
flags are refused.

Prints one JSON line; exit codes: 0 ok, 2 bad input, 143 / 130 stopped by
SIGTERM / SIGINT (the images drawn so far kept), 1 unexpected error.
"""
import dataclasses
import logging
import os
from typing import Optional, Tuple

from absl import flags

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import inference_flags
from deeplab_train.cli import output_paths
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import datasets
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS
COMMAND = 'deeplab-vis'
# Option fields whose flag is not named after the field.
FLAG_NAMES = {'InferenceOptions.crop_size': 'vis_crop_size',
              'InferenceOptions.scales': 'eval_scales',
              'VisOptions.colormap': 'colormap_type',
              'VisOptions.legend': 'vis_legend',
              'open_exported.path': 'exported_model'}

# deeplab-vis's own flags: output, images, crop and what is drawn.
_VIS_TABLE = (
    ('string', 'vis_logdir', None, 'Where to write the PNGs.'),
    ('string', 'vis_split', 'val', 'Which split of the dataset is visualised.'),
    ('string', 'image_dir', None,
     'Visualise the image files of this folder (.jpg, .png, .bmp, .webp, '
     '.tif) instead of a split (no --dataset_dir needed with a saved '
     'config). A file that cannot be read, or an image larger than a fixed '
     'input size, is skipped: the others are drawn, then the command exits '
     '2 naming it.'),
    ('integer', 'vis_batch_size', 1, 'The number of images in each batch.'),
    ('list', 'vis_crop_size', None,
     'Pad every image to this HEIGHT,WIDTH. Unset: pad each image only to '
     'the next size k * output_stride + 1.'),
    ('enum', 'colormap_type', None,
     'Colormap of the PNGs (default: the dataset\'s palette).',
     {'enum_values': colormap_lib.known_colormaps()}),
    ('boolean', 'also_save_raw_predictions', False,
     'Also save single-channel PNGs of the class ids.'),
    ('boolean', 'save_overlay', False,
     'Also save image | prediction | blend side by side.'),
    ('float', 'overlay_alpha', 0.5,
     'Weight of the prediction colours in the overlay blend.'),
    ('enum', 'vis_legend', 'none',
     'none: no legend (the PNGs as before). on_image: a strip right of each '
     'prediction and overlay PNG listing the classes present, largest pixel '
     'share first. file: one legend.png of every class in --vis_logdir.',
     {'enum_values': list(config.VisOptions.LEGEND_MODES)}),
    ('integer', 'max_number_of_images', 0,
     'Stop after this many images (<= 0: all).'),
    ('integer', 'max_number_of_iterations', 1,
     'Accepted for compatibility with the original vis.py; deeplab-vis '
     'always visualises one checkpoint once.'),
)
flag_table.define(_VIS_TABLE)

@dataclasses.dataclass(frozen=True)
class VisJob:
  """What deeplab-vis draws, from which images, into which folder.

  The images are those of `image_dir` when set, else the split `split` of
  `dataset_dir`.
  """
  checkpoint: str
  vis_logdir: str
  batch_size: int
  dataset_info: datasets.DatasetInfo
  model_options: config.ModelOptions
  preprocess_options: config.PreprocessOptions
  inference: config.InferenceOptions
  vis_options: config.VisOptions
  image_dir: Optional[str] = None
  dataset_dir: Optional[str] = None
  split: str = 'val'
  exported_model: Optional[str] = None
  # The resize a TFLite model's input gets (the other formats resize
  # inside); preprocess_options then leave the images at their size.
  exported_resize: Optional[config.PreprocessOptions] = None
  exported_resize_given: Tuple[str, ...] = ()


def _dataset_info(saved_dataset, config_folder):
  """The dataset of the split, or (--image_dir) of the trained model."""
  name = common_flags.dataset_name(saved_dataset)
  if FLAGS.dataset_dir:
    return common_flags.dataset_info(saved_dataset)
  if not FLAGS.image_dir:
    raise config.ConfigError('--dataset_dir is required (or --image_dir for '
                             'a folder of plain images)')
  # Image folder: the classes and palette the model was trained with.
  if saved_dataset and saved_dataset.get('name', name) == name:
    return datasets.DatasetInfo.from_dict(
        saved_dataset, source=os.path.join(config_folder,
                                           config.RUN_CONFIG_FILENAME))
  if name in datasets.BUILTIN_DATASETS:
    return datasets.BUILTIN_DATASETS[name]
  raise config.ConfigError(
      'dataset %r is not built in and the checkpoint has no %s: pass '
      '--dataset_dir (a folder with its dataset.json)'
      % (name, config.RUN_CONFIG_FILENAME))


def options_from_flags():
  """Flags (+ saved run config) -> a VisJob.

  Raises:
    config.ConfigError: missing or contradicting flags.
  """
  if FLAGS.vis_batch_size < 1:
    raise config.ConfigError('--vis_batch_size must be >= 1')
  exported_model = common_flags.exported_model_path()
  if exported_model:
    inference_flags.exported_model_kind(exported_model, 'vis_crop_size')
  else:
    common_flags.require(FLAGS.checkpoint_dir, 'checkpoint_dir',
                         ' (the train_logdir or a checkpoint prefix, or '
                         '--exported_model)')
  common_flags.require(FLAGS.vis_logdir, 'vis_logdir')
  output_paths.check_output_folder('vis_logdir', FLAGS.vis_logdir)
  if FLAGS.image_dir and FLAGS.dataset_dir:
    logging.warning('drawing the images of --image_dir=%s; --dataset_dir=%s '
                    'gives only the classes and their colours (its split '
                    '%s is not drawn)', FLAGS.image_dir, FLAGS.dataset_dir,
                    FLAGS.vis_split)
  if FLAGS.max_number_of_iterations != 1:
    logging.warning('--max_number_of_iterations=%d ignored: deeplab-vis '
                    'visualises the latest checkpoint once',
                    FLAGS.max_number_of_iterations)
  if common_flags.explicitly_set('eval_interval_secs'):
    logging.warning('--eval_interval_secs=%d ignored: deeplab-vis '
                    'visualises the latest checkpoint once (deeplab-eval '
                    'follows a training run)', FLAGS.eval_interval_secs)
  # pylint: disable=g-import-not-at-top
  from deeplab_train.evaluation import predictor as predictor_lib
  from deeplab_train.export import loaded
  exported = {}
  if exported_model:
    checkpoint = None
    folder = loaded.run_config_folder(exported_model)
  else:
    checkpoint = predictor_lib.resolve_checkpoint(FLAGS.checkpoint_dir)
    folder = os.path.dirname(checkpoint)
  saved_model, saved_pre, saved_dataset = inference_flags.saved_run_config(
      folder)
  preprocess_options = inference_flags.preprocess_options(saved_pre)
  if exported_model:
    # The images go in at their size: the model resizes them (a TFLite
    # model's input gets exported_resize).
    exported = {'exported_model': exported_model,
                'exported_resize': preprocess_options,
                'exported_resize_given': common_flags.resize_flags_given()}
    preprocess_options = config.PreprocessOptions(crop_size=None).validate()
  info = _dataset_info(saved_dataset, folder)
  job = VisJob(
      checkpoint=checkpoint, vis_logdir=FLAGS.vis_logdir,
      batch_size=FLAGS.vis_batch_size, dataset_info=info,
      model_options=common_flags.model_options(
          info.num_classes, None, saved=saved_model,
          num_classes_from=common_flags.classes_source(FLAGS.dataset_dir),
          inference=not exported_model),
      preprocess_options=preprocess_options,
      inference=inference_flags.inference_options(
          'vis_crop_size', 'eval_scales').validate(),
      vis_options=config.VisOptions(
          colormap=FLAGS.colormap_type,
          also_save_raw_predictions=FLAGS.also_save_raw_predictions,
          save_overlay=FLAGS.save_overlay,
          max_number_of_images=FLAGS.max_number_of_images,
          overlay_alpha=FLAGS.overlay_alpha,
          legend=FLAGS.vis_legend).validate(),
      image_dir=FLAGS.image_dir, dataset_dir=FLAGS.dataset_dir,
      split=FLAGS.vis_split, **exported)
  # The first N images may fit where the split's largest does not: each is
  # checked as it comes then.
  if not (exported_model or FLAGS.image_dir or FLAGS.max_number_of_images):
    inference_flags.check_split_fits(job, FLAGS.vis_split)
  return job


def _check_colormap_covers(name, num_classes):
  """A named colormap must colour every class the model predicts: it
  failed at the first image predicting one past it, some drawn already.
  `num_classes`: None when the model does not say (a frozen graph)."""
  defined = colormap_lib.DEFINED_ENTRIES.get(name)
  if defined is not None and num_classes and num_classes > defined:
    raise config.ConfigError(
        '{VisOptions.colormap}=%s colours %d classes (ids 0..%d), the model '
        'predicts %d: choose pascal (256 colours), or leave the flag out '
        'for the dataset\'s own colours', name, defined, defined - 1,
        num_classes)


def _samples(job, unreadable):
  """The images to draw: the image folder's (its unreadable files listed
  in `unreadable` and skipped), or the split's."""
  # pylint: disable=g-import-not-at-top
  from deeplab_train.evaluation import eval_loop
  from deeplab_train.evaluation import vis
  from deeplab_train.model import registry
  mean_pixel = registry.mean_pixel(job.model_options.model_variant)
  if job.image_dir:
    return vis.iterate_image_dir(job.image_dir, job.preprocess_options,
                                 mean_pixel, unreadable)
  return eval_loop.iterate_split(
      job.dataset_dir, job.split, job.dataset_info, job.preprocess_options,
      mean_pixel, keep_original_image=True, with_label=False)


def run_vis(job):
  """Writes the PNGs; returns the number of images.

  Raises:
    config.ConfigError: files of --image_dir that could not be read, once
      the others are drawn (a folder stopped at its first such file).
  """
  # pylint: disable=g-import-not-at-top
  from deeplab_train.evaluation import predictor as predictor_lib
  from deeplab_train.evaluation import vis
  from deeplab_train.export import loaded
  from deeplab_train.model import registry
  info = job.dataset_info
  colormap = job.vis_options.colormap or info.colormap()
  # Cityscapes is trained on 19 train ids; its evaluation server wants its
  # label ids, so raw predictions are mapped (as the original vis).
  eval_ids = (datasets.CITYSCAPES_TRAIN_ID_TO_LABEL_ID
              if info.name == 'cityscapes' else None)
  unreadable = []
  samples = _samples(job, unreadable)
  if job.exported_model:
    model = loaded.open_exported(
        job.exported_model,
        registry.mean_pixel(job.model_options.model_variant),
        job.exported_resize, resize_given=job.exported_resize_given)
  else:
    model = predictor_lib.Predictor(job.model_options, job.inference)
  with model:
    if job.exported_model:
      model.check_num_classes(info.num_classes,
                              common_flags.classes_source(job.dataset_dir))
      # What the dataset flags say is checked against the model only
      # where the model says its count.
      predicted = model.num_classes
    else:
      model.restore(job.checkpoint)
      predicted = job.model_options.num_classes
    # Before legend.png and the first image.
    _check_colormap_covers(job.vis_options.colormap, predicted)
    count = vis.visualize(model, samples, job.vis_logdir, colormap,
                          job.vis_options, batch_size=job.batch_size,
                          train_id_to_eval_id=eval_ids,
                          class_names=info.class_names,
                          num_classes=job.model_options.num_classes,
                          too_large=unreadable if job.image_dir else None)
  if unreadable:
    unreadable = [u if isinstance(u, str) else app.user_message(u, FLAG_NAMES)
                  for u in unreadable]
    raise config.ConfigError(
        '%d file(s) of --image_dir could not be read or drawn and were '
        'skipped, after %d image(s) were drawn to %s: %s; replace or remove '
        'them',
        len(unreadable), count, job.vis_logdir, '; '.join(unreadable[:5]) + (
            '; ...' if len(unreadable) > 5 else ''))
  return count


def _vis():
  job = options_from_flags()
  count = run_vis(job)
  extra = ({'exported_model': job.exported_model} if job.exported_model
           else {})
  app.print_final_result('ok', checkpoint=job.checkpoint, num_images=count,
                         vis_logdir=job.vis_logdir, **extra)


main = inference_flags.main_for(COMMAND, _vis, FLAG_NAMES)


def run():
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
