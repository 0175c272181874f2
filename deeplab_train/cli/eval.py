r"""deeplab-eval: mIoU, per-class IoU and pixel accuracy of a checkpoint.

    deeplab-eval --checkpoint_dir=TRAIN_LOGDIR --dataset_dir=TFRECORDS \\
        [--eval_split=val] [--eval_logdir=DIR] [--eval_crop_size=513,513] \\
        [--eval_scales=0.75 --eval_scales=1.0 ...] [--add_flipped_images]

Runs once on the latest checkpoint by default (exit 2 at once if there is
none). With --eval_interval_secs (or --max_number_of_evaluations other than
1) it follows the logdir, evaluating each new checkpoint once. The model
options come from the deeplab_config.json saved by deeplab-train; model flags
are only needed for checkpoints without one.

Prints a per-class table and, last, one JSON line; writes the same JSON to
--eval_result_json (default EVAL_LOGDIR/eval_result.json) and TensorBoard
summaries to EVAL_LOGDIR. Exit codes: 0 ok, 2 bad input, 1 unexpected error.
"""
import logging
import os

from absl import flags

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import inference_flags
from deeplab_train.data import datasets
from deeplab_train.evaluation import eval_loop
from deeplab_train.evaluation import metrics
from deeplab_train.model import registry

FLAGS = flags.FLAGS
COMMAND = 'deeplab-eval'

flags.DEFINE_string('eval_logdir', None,
                    'Where to write the event logs and eval_result.json '
                    '(default: CHECKPOINT_DIR/eval).')
flags.DEFINE_integer('eval_batch_size', 1,
                     'The number of images in each batch during evaluation.')
flags.DEFINE_list('eval_crop_size', None,
                  'Pad every image to this HEIGHT,WIDTH (the network is then '
                  'built for it). Unset: pad each image only to the next '
                  'size k * output_stride + 1.')
flags.DEFINE_string('eval_split', 'val',
                    'Which split of the dataset is used for evaluation.')
flags.DEFINE_integer('max_number_of_evaluations', 0,
                     'Follow mode: stop after this many evaluations (<= 0: '
                     'no limit). Giving a value other than 1 turns follow '
                     'mode on; 1 evaluates once.')
flags.DEFINE_float('eval_timeout_secs', None,
                   'Follow mode: stop after waiting this long for a new '
                   'checkpoint (default: wait for ever).')
flags.DEFINE_string('eval_result_json', None,
                    'Where to write the JSON result (default: '
                    'EVAL_LOGDIR/eval_result.json).')


def _follow_mode():
  if common_flags.explicitly_set('eval_interval_secs'):
    return True
  return (common_flags.explicitly_set('max_number_of_evaluations') and
          FLAGS.max_number_of_evaluations != 1)


def _checkpoint_folder(path):
  return path if os.path.isdir(path) else os.path.dirname(path)


def _dataset_name(saved_dataset):
  """--dataset, or the trained-on dataset when the flag is not given."""
  if (saved_dataset and not common_flags.explicitly_set('dataset') and
      saved_dataset.get('name')):
    return saved_dataset['name']
  return FLAGS.dataset


def build_options():
  """Flags (+ saved run config) -> the library's option objects.

  Returns:
    dict with model_options, inference, eval_options, dataset_info,
    preprocess_options, checkpoint_dir, eval_logdir.

  Raises:
    config.ConfigError: missing or contradicting flags.
  """
  if not FLAGS.checkpoint_dir:
    raise config.ConfigError('--checkpoint_dir is required (the train_logdir '
                             'or a checkpoint prefix)')
  if not FLAGS.dataset_dir:
    raise config.ConfigError('--dataset_dir is required (the TFRecords '
                             'folder)')
  checkpoint_dir = FLAGS.checkpoint_dir.rstrip('/') or '/'
  folder = _checkpoint_folder(checkpoint_dir)
  saved_model, saved_pre, saved_dataset = inference_flags.saved_run_config(
      folder if os.path.isdir(folder) else None)
  info = datasets.load_dataset_info(_dataset_name(saved_dataset),
                                    FLAGS.dataset_dir)
  model_options = common_flags.model_options(info.num_classes, None,
                                             saved=saved_model)
  inference = config.InferenceOptions(
      crop_size=inference_flags.parse_crop(FLAGS.eval_crop_size,
                                           'eval_crop_size'),
      scales=FLAGS.eval_scales, add_flipped_images=FLAGS.add_flipped_images,
      image_pyramid=FLAGS.image_pyramid).validate()
  eval_options = config.EvalOptions(
      split=FLAGS.eval_split, batch_size=FLAGS.eval_batch_size,
      follow=_follow_mode(), eval_interval_secs=FLAGS.eval_interval_secs,
      max_number_of_evaluations=FLAGS.max_number_of_evaluations,
      timeout_secs=FLAGS.eval_timeout_secs,
      result_json=FLAGS.eval_result_json).validate()
  return {'model_options': model_options, 'inference': inference,
          'eval_options': eval_options, 'dataset_info': info,
          'preprocess_options': inference_flags.preprocess_options(saved_pre),
          'checkpoint_dir': checkpoint_dir,
          'eval_logdir': FLAGS.eval_logdir or os.path.join(folder, 'eval')}


def print_result(result, scores):
  print(metrics.format_table(scores))
  print('checkpoint %s (step %s), %d images of split %r'
        % (result['checkpoint'], result['global_step'], result['num_images'],
           result['split']))
  app.print_result('ok', **result)


def run_eval(opts):
  """Evaluates as the options say; returns the list of results."""
  mean_pixel = registry.mean_pixel(opts['model_options'].model_variant)

  def make_samples():
    return eval_loop.iterate_split(
        FLAGS.dataset_dir, opts['eval_options'].split, opts['dataset_info'],
        opts['preprocess_options'], mean_pixel)

  return eval_loop.evaluate(
      opts['checkpoint_dir'], opts['eval_logdir'], opts['model_options'],
      opts['inference'], opts['eval_options'], opts['dataset_info'],
      make_samples, on_result=print_result)


def main(argv):
  logging.getLogger().setLevel(logging.INFO)
  return app.run_body(COMMAND, argv,
                                  lambda: run_eval(build_options()))


def run():
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
