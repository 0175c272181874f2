r"""deeplab-eval: mIoU, per-class IoU, precision and recall, pixel accuracy
and confusion matrix of a checkpoint or an exported model.

    deeplab-eval --checkpoint_dir=TRAIN_LOGDIR --dataset_dir=TFRECORDS \
        [--eval_split=val] [--eval_logdir=DIR] [--eval_crop_size=513,513] \
        [--eval_scales=0.75 --eval_scales=1.0 ...] [--add_flipped_images]

Runs once on the latest checkpoint by default (exit 2 at once if there is
none). With --eval_interval_secs (or --max_number_of_evaluations other than
1) it follows the logdir, evaluating each new checkpoint once. The model
options come from the deeplab_config.json saved by deeplab-train; model flags
are only needed for checkpoints without one.

Prints a per-class table (IoU, precision, recall), the 5 most confused
pairs of classes (ground truth -> predicted, share of the ground-truth
class's pixels) and, last, one JSON line holding all of them; writes the
same JSON to --eval_result_json (default EVAL_LOGDIR/eval_result.json) and
TensorBoard summaries to EVAL_LOGDIR, with the confusion matrix as
EVAL_LOGDIR/confusion_matrix.csv (pixel counts, rows = ground truth,
columns = prediction) and EVAL_LOGDIR/confusion_matrix.png (heatmap, each
row divided by its ground-truth pixels). In follow mode each evaluation
overwrites these two files: they show the latest checkpoint evaluated.

    deeplab-eval --exported_model=OUT/frozen.pb|OUT/saved_model|OUT/m.tflite \
        --dataset_dir=TFRECORDS [--eval_split=val] [--eval_logdir=DIR]

scores what deeplab-export wrote (a frozen .pb, a SavedModel folder or a
.tflite file, float or quantized) once, with the same table, JSON line and
files (default --eval_logdir: eval_NAME_EXT beside it), so you see what the
deployed file scores. The model options come from a deeplab_config.json
beside it when there is one, else from the flags and the dataset; the crop,
scales, flips and (but for TFLite) the resize were fixed at export, so those
flags are refused. Scores are at the images' own size, as the deployed
model labels them.

One deeplab-eval at a time writes an --eval_logdir (it holds the folder's
lock). SIGTERM / SIGINT stop it at once (follow mode too), keeping the
results written so far.

Exit codes: 0 ok, 2 bad input, 75 another deeplab-eval writes to
--eval_logdir (one line naming its pid), 143 / 130 stopped by SIGTERM /
SIGINT, 1 unexpected error.
"""
import dataclasses
import os
import time
from typing import Optional, Tuple

from absl import flags
from absl import logging

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train import locking
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import inference_flags
from deeplab_train.cli import output_paths
from deeplab_train.data import datasets
from deeplab_train.evaluation import confusion
from deeplab_train.evaluation import metrics
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

FLAGS = flags.FLAGS
COMMAND = 'deeplab-eval'
# Option fields whose flag is not named after the field.
FLAG_NAMES = {'InferenceOptions.crop_size': 'eval_crop_size',
              'InferenceOptions.scales': 'eval_scales',
              'EvalOptions.split': 'eval_split',
              'EvalOptions.batch_size': 'eval_batch_size',
              'EvalOptions.timeout_secs': 'eval_timeout_secs',
              'EvalOptions.result_json': 'eval_result_json',
              'open_exported.path': 'exported_model'}

# deeplab-eval's own flags (the shared ones are in common_flags and
# inference_flags): output, split, batch, crop and follow mode.
_EVAL_TABLE = (
    ('string', 'eval_logdir', None,
     'Where to write the event logs, eval_result.json and '
     'confusion_matrix.csv/.png (default: CHECKPOINT_DIR/eval).'),
    ('integer', 'eval_batch_size', 1,
     'The number of images in each batch during evaluation.'),
    ('list', 'eval_crop_size', None,
     'Pad every image to this HEIGHT,WIDTH (the network is then built for '
     'it). Unset: pad each image only to the next size '
     'k * output_stride + 1.'),
    ('string', 'eval_split', 'val',
     'Which split of the dataset is used for evaluation.'),
    ('integer', 'max_number_of_evaluations', 0,
     'Follow mode: stop after this many evaluations (<= 0: no limit). '
     'Giving a value other than 1 turns follow mode on; 1 evaluates once.'),
    ('float', 'eval_timeout_secs', None,
     'Follow mode: stop after waiting this long for a new checkpoint '
     '(default: wait for ever).'),
    ('string', 'eval_result_json', None,
     'Where to write the JSON result (default: '
     'EVAL_LOGDIR/eval_result.json).'),
)
flag_table.define(_EVAL_TABLE)

@dataclasses.dataclass(frozen=True)
class EvalJob:
  """What deeplab-eval scores, how, and where the results go."""
  checkpoint_dir: str
  eval_logdir: str
  dataset_dir: str
  dataset_info: datasets.DatasetInfo
  model_options: config.ModelOptions
  preprocess_options: config.PreprocessOptions
  inference: config.InferenceOptions
  eval_options: config.EvalOptions
  exported_model: Optional[str] = None
  # The resize a TFLite model's input gets (the other formats resize
  # inside); preprocess_options then leave the images at their size.
  exported_resize: Optional[config.PreprocessOptions] = None
  exported_resize_given: Tuple[str, ...] = ()


def _follow_mode():
  if common_flags.explicitly_set('eval_interval_secs'):
    return True
  return (common_flags.explicitly_set('max_number_of_evaluations') and
          FLAGS.max_number_of_evaluations != 1)


def _checkpoint_folder(path):
  if os.path.isdir(path) or (_follow_mode() and not _is_prefix_or_file(path)):
    return path  # follow mode: a train logdir, which may not exist yet
  return os.path.dirname(path)


def _is_prefix_or_file(path):
  return os.path.lexists(path) or os.path.exists(path + '.index')


# Seconds follow mode waits for a run's deeplab_config.json once the first
# checkpoint of a logdir it found without one has appeared: deeplab-train
# writes it as its session starts, about when that checkpoint is saved.
RUN_CONFIG_GRACE_SECS = 30


def _first_checkpoint_came(folder, timeout_secs, poll_secs=1.0):
  """Follow mode on a train logdir without a checkpoint yet (started
  beside the training run, as the original's eval was): waits for the first
  one, then briefly for the run's deeplab_config.json, so that the model
  options come from the run (they were settled from the flags' defaults
  at start, and the first checkpoint was refused as another network).

  Returns:
    False when `timeout_secs` (None: for ever) passed first.
  """
  # pylint: disable=g-import-not-at-top
  from deeplab_train.evaluation import eval_loop
  from deeplab_train.runtime import checkpoint_state
  if _is_prefix_or_file(folder) and not os.path.isdir(folder):
    return True  # follow mode refuses it (it watches a directory)
  if os.path.isdir(folder) and checkpoint_state.to_read(folder, warn=False):
    return True
  logging.info('waiting for the first checkpoint in %s (its run\'s %s gives '
               'the model options)', folder, config.RUN_CONFIG_FILENAME)
  first = next(iter(eval_loop.watch_checkpoints(
      folder, 0, timeout_secs, poll_secs=poll_secs)), None)
  if first is None:
    return False
  run_config = os.path.join(folder, config.RUN_CONFIG_FILENAME)
  deadline = time.monotonic() + RUN_CONFIG_GRACE_SECS
  while not os.path.isfile(run_config) and time.monotonic() < deadline:
    time.sleep(poll_secs)
  return True


def _exported_options():
  """Flags (+ the run config beside the model) -> an EvalJob of
  --exported_model."""
  path = common_flags.exported_model_path()
  inference_flags.exported_model_kind(path, 'eval_crop_size')
  if _follow_mode():
    raise config.ConfigError(
        'follow mode (--eval_interval_secs, --max_number_of_evaluations) '
        'watches a checkpoint directory; --exported_model is evaluated once')
  common_flags.require(FLAGS.dataset_dir, 'dataset_dir',
                       ' (the TFRecords folder)')
  from deeplab_train.export import loaded  # pylint: disable=g-import-not-at-top
  saved_model, saved_pre, saved_dataset = inference_flags.saved_run_config(
      loaded.run_config_folder(path))
  info = common_flags.dataset_info(saved_dataset)
  model_options = common_flags.model_options(
      info.num_classes, None, saved=saved_model,
      num_classes_from=common_flags.classes_source(FLAGS.dataset_dir))
  eval_options = config.EvalOptions(
      split=FLAGS.eval_split, batch_size=FLAGS.eval_batch_size,
      result_json=FLAGS.eval_result_json).validate()
  eval_logdir = FLAGS.eval_logdir or loaded.output_folder_beside(path, 'eval')
  _check_outputs(eval_logdir)
  return EvalJob(
      checkpoint_dir=None, eval_logdir=eval_logdir,
      dataset_dir=FLAGS.dataset_dir, dataset_info=info,
      model_options=model_options,
      preprocess_options=config.PreprocessOptions(crop_size=None).validate(),
      inference=config.InferenceOptions(), eval_options=eval_options,
      exported_model=path,
      exported_resize=inference_flags.preprocess_options(saved_pre),
      exported_resize_given=common_flags.resize_flags_given())


def _check_outputs(eval_logdir):
  """Raises ConfigError when the eval logdir or result file cannot be
  written, or a folder stands where one of eval's files goes (found only
  once the whole evaluation was done)."""
  output_paths.check_output_folder('eval_logdir', eval_logdir)
  output_paths.check_output_file('eval_result_json', FLAGS.eval_result_json)
  from deeplab_train.evaluation import eval_loop  # pylint: disable=g-import-not-at-top
  for name in (eval_loop.RESULT_FILENAME, eval_loop.CONFUSION_CSV_FILENAME,
               eval_loop.CONFUSION_PNG_FILENAME):
    if os.path.isdir(os.path.join(eval_logdir, name)):
      raise config.ConfigError(
          '--eval_logdir=%s holds a folder named %s, where deeplab-eval '
          'writes its file: move it, or give another --eval_logdir',
          eval_logdir, name)


def options_from_flags():
  """Flags (+ saved run config) -> an EvalJob; None in follow mode when
  no first checkpoint came within --eval_timeout_secs.

  Raises:
    config.ConfigError: missing or contradicting flags.
  """
  if common_flags.exported_model_path():
    return _exported_options()
  common_flags.require(FLAGS.checkpoint_dir, 'checkpoint_dir',
                       ' (the train_logdir or a checkpoint prefix)')
  common_flags.require(FLAGS.dataset_dir, 'dataset_dir',
                       ' (the TFRecords folder)')
  checkpoint_dir = FLAGS.checkpoint_dir.rstrip('/') or '/'
  folder = _checkpoint_folder(checkpoint_dir)
  eval_logdir = FLAGS.eval_logdir or os.path.join(folder, 'eval')
  # Checked now, not after the whole evaluation (or the wait for it).
  _check_outputs(eval_logdir)
  if _follow_mode() and not _first_checkpoint_came(
      folder, FLAGS.eval_timeout_secs):
    return None
  saved_model, saved_pre, saved_dataset = inference_flags.saved_run_config(
      folder if os.path.isdir(folder) else None)
  info = common_flags.dataset_info(saved_dataset)
  model_options = common_flags.model_options(
      info.num_classes, None, saved=saved_model,
      num_classes_from=common_flags.classes_source(FLAGS.dataset_dir),
      inference=True)
  inference = inference_flags.inference_options('eval_crop_size',
                                                'eval_scales').validate()
  eval_options = config.EvalOptions(
      split=FLAGS.eval_split, batch_size=FLAGS.eval_batch_size,
      follow=_follow_mode(), eval_interval_secs=FLAGS.eval_interval_secs,
      max_number_of_evaluations=FLAGS.max_number_of_evaluations,
      timeout_secs=FLAGS.eval_timeout_secs,
      result_json=FLAGS.eval_result_json).validate()
  job = EvalJob(
      checkpoint_dir=checkpoint_dir,
      eval_logdir=eval_logdir,
      dataset_dir=FLAGS.dataset_dir, dataset_info=info,
      model_options=model_options,
      preprocess_options=inference_flags.preprocess_options(saved_pre),
      inference=inference, eval_options=eval_options)
  inference_flags.check_split_fits(job, FLAGS.eval_split)
  return job


def print_scores(result, scores):
  print(metrics.format_table(scores))
  print(confusion.format_confused_pairs(scores.most_confused))
  if result.get('exported_model'):
    what = 'exported model %s (%s)' % (result['exported_model'],
                                       result['exported_format'])
  else:
    what = 'checkpoint %s (step %s)' % (result['checkpoint'],
                                        result['global_step'])
  print('%s, %d images of split %r' % (what, result['num_images'],
                                       result['split']))


def print_result(result, scores, final=True):
  """The scores and the result line of one evaluation; `final`: the
  command's last (run-once, or the last of --max_number_of_evaluations in
  follow mode)."""
  print_scores(result, scores)
  if final:
    app.print_final_result('ok', **result)
  else:
    app.print_result('ok', **result)


# One deeplab-eval at a time writes an --eval_logdir: two would leave the
# result JSON of one checkpoint beside the confusion matrix of another.
LOCK_FILENAME = '.deeplab-eval.lock'


def run_eval(job):
  """Evaluates as the job says, holding the eval_logdir's lock; returns
  the list of results.

  Raises:
    locking.FolderLockedError: another deeplab-eval writes there.
  """
  made = _missing_folders(job.eval_logdir)
  try:
    os.makedirs(job.eval_logdir, exist_ok=True)
  except OSError as e:
    raise atomic.not_written(job.eval_logdir, e) from None
  try:
    with locking.FolderLock(job.eval_logdir, LOCK_FILENAME, COMMAND,
                            '%s writing to this folder' % COMMAND):
      return _run_eval_locked(job)
  finally:
    # A run refused (a missing split, another network's checkpoint, ...)
    # left the folders it made empty, e.g. an eval/ in a training logdir.
    for folder in made:
      try:
        os.rmdir(folder)
      except OSError:
        break  # not empty: results, or another's files


def _missing_folders(path):
  """The folders of `path` that do not exist yet, innermost first."""
  missing = []
  path = os.path.abspath(path)
  while not os.path.isdir(path) and path != os.path.dirname(path):
    missing.append(path)
    path = os.path.dirname(path)
  return missing


def _run_eval_locked(job):
  # pylint: disable=g-import-not-at-top
  from deeplab_train.evaluation import eval_loop
  from deeplab_train.export import loaded
  from deeplab_train.model import registry
  mean_pixel = registry.mean_pixel(job.model_options.model_variant)

  def make_samples():
    return eval_loop.iterate_split(
        job.dataset_dir, job.eval_options.split, job.dataset_info,
        job.preprocess_options, mean_pixel)

  if job.exported_model:
    with loaded.open_exported(
        job.exported_model, mean_pixel, job.exported_resize,
        resize_given=job.exported_resize_given) as model:
      model.check_num_classes(job.dataset_info.num_classes,
                              common_flags.classes_source(job.dataset_dir))
      return eval_loop.evaluate_exported(
          model, job.eval_logdir, job.eval_options, job.dataset_info,
          make_samples, on_result=print_result)
  return eval_loop.evaluate(
      job.checkpoint_dir, job.eval_logdir, job.model_options, job.inference,
      job.eval_options, job.dataset_info, make_samples,
      on_result=print_result)


def evaluate_flags():
  """The evaluation the flags ask for; the metrics are printed even when
  they cannot be written (then exit 1)."""
  job = options_from_flags()  # raises no ResultNotWrittenError
  if job is None:
    # Follow mode's end, asked for: exit 0, with the command's result line
    # (there was none), saying that nothing was evaluated.
    app.print_final_result(
        'ok', message='no checkpoint in %s within --eval_timeout_secs=%g: '
        'nothing was evaluated' % (FLAGS.checkpoint_dir,
                                   FLAGS.eval_timeout_secs),
        evaluations=0)
    return []
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.evaluation import eval_loop
  eval_loop.check_scorable(job.dataset_info, job.eval_options.split)
  try:
    return run_eval(job)
  except eval_loop.ResultNotWrittenError as e:
    print_scores(e.result, e.scores)
    app.say('%s: error: %s' % (COMMAND, e))
    app.print_result('error', **dict(e.result, message=str(e)))
    raise app.Reported(app.EXIT_UNEXPECTED) from e


main = inference_flags.main_for(COMMAND, evaluate_flags, FLAG_NAMES)


def run():
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
