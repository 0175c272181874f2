r"""deeplab-vis: coloured prediction PNGs for a split or a folder of images.

    deeplab-vis --checkpoint_dir=TRAIN_LOGDIR --vis_logdir=OUT \\
        (--dataset_dir=TFRECORDS [--vis_split=val] | --image_dir=PHOTOS) \\
        [--also_save_raw_predictions] [--save_overlay] \\
        [--colormap_type=pascal|cityscapes|ade20k] [--max_number_of_images=N]

Uses the latest checkpoint of --checkpoint_dir (or a checkpoint prefix) and
the model options saved beside it. PNGs are named after the images and have
the input image's size (see deeplab_train/evaluation/vis.py for the layout).
Prints one JSON line; exit codes: 0 ok, 2 bad input, 1 unexpected error.
"""
import logging
import os

from absl import flags

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import inference_flags
from deeplab_train.data import colormap as colormap_lib
from deeplab_train.data import datasets
from deeplab_train.evaluation import eval_loop
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.evaluation import vis
from deeplab_train.model import registry

FLAGS = flags.FLAGS
COMMAND = 'deeplab-vis'

flags.DEFINE_string('vis_logdir', None, 'Where to write the PNGs.')
flags.DEFINE_string('vis_split', 'val',
                    'Which split of the dataset is visualised.')
flags.DEFINE_string('image_dir', None,
                    'Visualise the .jpg/.png files of this folder instead of '
                    'a split (no --dataset_dir needed with a saved config).')
flags.DEFINE_integer('vis_batch_size', 1,
                     'The number of images in each batch.')
flags.DEFINE_list('vis_crop_size', None,
                  'Pad every image to this HEIGHT,WIDTH. Unset: pad each '
                  'image only to the next size k * output_stride + 1.')
flags.DEFINE_enum('colormap_type', None, colormap_lib.known_colormaps(),
                  'Colormap of the PNGs (default: the dataset\'s palette).')
flags.DEFINE_boolean('also_save_raw_predictions', False,
                     'Also save single-channel PNGs of the class ids.')
flags.DEFINE_boolean('save_overlay', False,
                     'Also save image | prediction | blend side by side.')
flags.DEFINE_float('overlay_alpha', 0.5,
                   'Weight of the prediction colours in the overlay blend.')
flags.DEFINE_integer('max_number_of_images', 0,
                     'Stop after this many images (<= 0: all).')
flags.DEFINE_integer('max_number_of_iterations', 1,
                     'Accepted for compatibility with the original vis.py; '
                     'deeplab-vis always visualises one checkpoint once.')


def _dataset_info(saved_dataset, config_folder):
  """The dataset of the split, or (--image_dir) of the trained model."""
  name = FLAGS.dataset
  if saved_dataset and not common_flags.explicitly_set('dataset'):
    name = saved_dataset.get('name') or name
  if FLAGS.dataset_dir:
    return datasets.load_dataset_info(name, FLAGS.dataset_dir)
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


def build_options():
  """Flags (+ saved run config) -> dict of the library's options.

  Raises:
    config.ConfigError: missing or contradicting flags.
  """
  if not FLAGS.checkpoint_dir:
    raise config.ConfigError('--checkpoint_dir is required (the train_logdir '
                             'or a checkpoint prefix)')
  if not FLAGS.vis_logdir:
    raise config.ConfigError('--vis_logdir is required')
  if FLAGS.max_number_of_iterations != 1:
    logging.warning('--max_number_of_iterations=%d ignored: deeplab-vis '
                    'visualises the latest checkpoint once',
                    FLAGS.max_number_of_iterations)
  checkpoint = predictor_lib.resolve_checkpoint(FLAGS.checkpoint_dir)
  folder = os.path.dirname(checkpoint)
  saved_model, saved_pre, saved_dataset = inference_flags.saved_run_config(
      folder)
  info = _dataset_info(saved_dataset, folder)
  return {
      'checkpoint': checkpoint,
      'dataset_info': info,
      'model_options': common_flags.model_options(info.num_classes, None,
                                                  saved=saved_model),
      'preprocess_options': inference_flags.preprocess_options(saved_pre),
      'inference': config.InferenceOptions(
          crop_size=inference_flags.parse_crop(FLAGS.vis_crop_size,
                                               'vis_crop_size'),
          scales=FLAGS.eval_scales,
          add_flipped_images=FLAGS.add_flipped_images,
          image_pyramid=FLAGS.image_pyramid).validate('vis_crop_size'),
      'vis_options': config.VisOptions(
          colormap=FLAGS.colormap_type,
          also_save_raw_predictions=FLAGS.also_save_raw_predictions,
          save_overlay=FLAGS.save_overlay,
          max_number_of_images=FLAGS.max_number_of_images,
          overlay_alpha=FLAGS.overlay_alpha).validate(),
  }


def run_vis(opts):
  """Writes the PNGs; returns the number of images."""
  info = opts['dataset_info']
  mean_pixel = registry.mean_pixel(opts['model_options'].model_variant)
  if FLAGS.image_dir:
    samples = vis.iterate_image_dir(FLAGS.image_dir,
                                    opts['preprocess_options'], mean_pixel)
  else:
    samples = eval_loop.iterate_split(
        FLAGS.dataset_dir, FLAGS.vis_split, info, opts['preprocess_options'],
        mean_pixel, keep_original_image=True, with_label=False)
  colormap = opts['vis_options'].colormap or info.colormap()
  eval_ids = (vis.CITYSCAPES_TRAIN_ID_TO_EVAL_ID
              if info.name == 'cityscapes' else None)
  with predictor_lib.Predictor(opts['model_options'], opts['inference'],
                               crop_flag='vis_crop_size') as predictor:
    predictor.restore(opts['checkpoint'])
    return vis.visualize(predictor, samples, FLAGS.vis_logdir, colormap,
                         opts['vis_options'], batch_size=FLAGS.vis_batch_size,
                         train_id_to_eval_id=eval_ids)


def _vis():
  if FLAGS.vis_batch_size < 1:
    raise config.ConfigError('--vis_batch_size must be >= 1')
  opts = build_options()
  count = run_vis(opts)
  app.print_result('ok', checkpoint=opts['checkpoint'], num_images=count,
                   vis_logdir=FLAGS.vis_logdir)


def main(argv):
  logging.getLogger().setLevel(logging.INFO)
  return app.run_body(COMMAND, argv, _vis)


def run():
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
