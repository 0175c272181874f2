"""deeplab-eval's library side: score checkpoints on a split, once or following.

Run-once mode evaluates the given checkpoint (or the latest in a directory)
and fails at once when there is none. Follow mode watches a train logdir and
evaluates each new latest checkpoint once (checkpoints written while an
evaluation runs are skipped in favour of the newest, as the original's
checkpoint iterator does), up to a maximum number of evaluations or a
timeout without new checkpoints.

Each evaluation produces a result dict (mIoU, per-class IoU, precision and
recall, pixel accuracy, flags for classes never predicted / absent from the
ground truth, the most confused pairs of classes), written atomically as
JSON and as TensorBoard scalars with the original's tags
(`eval/miou_1.0_overall`, `eval/miou_1.0_class_N`). Its confusion matrix
goes to eval_logdir as `confusion_matrix.csv` (pixel counts) and
`confusion_matrix.png` (row-normalised heatmap); in follow mode each
evaluation overwrites them, so they are the latest checkpoint's.

`evaluate_exported` scores an exported model (frozen graph, SavedModel or
TFLite, see export/loaded.py) once, with the same outputs; its scales and
flips are baked in, so its TensorBoard tag is `eval/miou_exported`.
"""
import logging
import os
import time

import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.data import pipeline
from deeplab_train.evaluation import confusion as confusion_lib
from deeplab_train.evaluation import metrics as metrics_lib
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train import atomic
from deeplab_train import restore as restore_lib
from deeplab_train.runtime import checkpoint_state
from deeplab_train.runtime import hooks as hooks_lib

RESULT_FILENAME = 'eval_result.json'
CONFUSION_CSV_FILENAME = 'confusion_matrix.csv'
CONFUSION_PNG_FILENAME = 'confusion_matrix.png'

_log = logging.getLogger(__name__)


class InputDataError(config.ConfigError):
  """A record of the split failed the input pipeline's checks."""


class ResultNotWrittenError(RuntimeError):
  """The evaluation finished but its summaries, confusion matrix files or
  JSON could not be written; `result` and `scores` hold what it measured."""

  def __init__(self, path, reason, result, scores):
    super().__init__('cannot write the evaluation results to %s: %s (the '
                     'metrics are printed above)' % (path, reason))
    self.result = result
    self.scores = scores


def iterate_split(dataset_dir, split, dataset_info, preprocess_options,
                  mean_pixel, keep_original_image=False, with_label=True):
  """Yields the split's images one by one as numpy samples.

  Images keep their own size (after any min/max_resize_value resize); the
  caller pads them.

  Args:
    dataset_dir: folder of the TFRecords.
    split: split name.
    dataset_info: DatasetInfo.
    preprocess_options: PreprocessOptions (its resize values are used).
    mean_pixel: RGB padding value of the backbone.
    keep_original_image: include 'original_image' (uint8).
    with_label: decode labels (False for unlabelled splits).

  Yields:
    {'image': float32 [h, w, 3], 'label': int32 [h, w] or None, 'name': str,
     'height': int, 'width': int (size of the stored image),
     'original_image': uint8 [h, w, 3] (if asked)}.

  Raises:
    ConfigError: missing split or folder.
    InputDataError: a record failed the pipeline's checks (message names
      the image).
  """
  with tf.Graph().as_default():
    dataset = pipeline.make_dataset(
        dataset_dir, split, dataset_info, preprocess_options, batch_size=1,
        is_training=False, mean_pixel=mean_pixel, crop_size=None,
        keep_original_image=keep_original_image, with_label=with_label)
    next_sample = tf.data.make_one_shot_iterator(dataset).get_next()
    with tf.Session() as sess:
      while True:
        try:
          sample = sess.run(next_sample)
        except tf.errors.OutOfRangeError:
          return
        except tf.errors.InvalidArgumentError as e:
          message = pipeline.data_error_message(
              e, pipeline.split_files(dataset_dir, split))
          raise InputDataError('split %r of %s: %s', split, dataset_dir,
                               message or pipeline.error_reason(e.message)
                               ) from None
        except tf.errors.DataLossError as e:
          raise InputDataError('%s', pipeline.data_error_message(
              e, pipeline.split_files(dataset_dir, split))) from None
        yield _unbatch(sample)


def _unbatch(sample):
  out = {'image': sample[pipeline.IMAGE][0],
         'name': sample[pipeline.IMAGE_NAME][0].decode('utf-8'),
         'height': int(sample[pipeline.HEIGHT][0]),
         'width': int(sample[pipeline.WIDTH][0]),
         'label': None}
  if pipeline.LABEL in sample:
    out['label'] = sample[pipeline.LABEL][0, :, :, 0]
  if pipeline.ORIGINAL_IMAGE in sample:
    out['original_image'] = sample[pipeline.ORIGINAL_IMAGE][0]
  return out


def batched(samples, batch_size):
  """Groups an iterable into lists of batch_size (the last may be shorter)."""
  batch = []
  for sample in samples:
    batch.append(sample)
    if len(batch) == batch_size:
      yield batch
      batch = []
  if batch:
    yield batch


def score(predictor, samples, num_classes, ignore_label, batch_size=1):
  """Confusion matrix of the predictor's labels over samples.

  Args:
    predictor: a restored Predictor, or an open exported model
      (export/loaded.py): predict(list of images, names=...) -> labels.
    samples: iterable of dicts with 'image', 'label', 'name'.
    num_classes: classes of the dataset.
    ignore_label: label value not scored.
    batch_size: images per session run.

  Returns:
    (ConfusionMatrix, number of images).
  """
  confusion = metrics_lib.ConfusionMatrix(num_classes, ignore_label)
  count = 0
  for batch in batched(samples, batch_size):
    names = [s['name'] for s in batch]
    labels = predictor.predict([s['image'] for s in batch], names=names)
    for sample, prediction in zip(batch, labels):
      if sample['label'] is None:
        raise InputDataError('image %s has no label: cannot evaluate a split '
                             'without ground truth' % sample['name'])
      confusion.update(sample['label'], prediction, name=sample['name'])
    count += len(batch)
  return confusion, count


def summary_tag(inference):
  """The original's metric tag, e.g. 'miou_1.0' or 'miou_0.5_1.0_flipped';
  'miou_exported' for an exported model (inference None)."""
  if inference is None:
    return 'miou_exported'
  tag = 'miou' + ''.join('_' + str(s) for s in inference.scales)
  return tag + ('_flipped' if inference.add_flipped_images else '')


def write_summaries(eval_logdir, result, inference):
  """Appends the result's scalars to the TensorBoard events in eval_logdir.

  inference: the InferenceOptions of a checkpoint's evaluation, or None for
  an exported model's (see `summary_tag`).
  """
  tag = 'eval/' + summary_tag(inference)
  values = [tf.Summary.Value(tag=tag + '_overall',
                             simple_value=_finite(result['miou'])),
            tf.Summary.Value(tag='eval/pixel_accuracy',
                             simple_value=_finite(result['pixel_accuracy']))]
  for c, iou in enumerate(result['per_class_iou'].values()):
    if iou is not None:
      values.append(tf.Summary.Value(tag='%s_class_%d' % (tag, c),
                                     simple_value=iou))
  # FileWriter refuses eager mode; a graph context makes it usable anywhere.
  # One file per evaluation, named apart from one written in the same
  # second (follow mode on a fast run), which it would truncate.
  with tf.Graph().as_default():
    events = hooks_lib.EventsFile(eval_logdir, None, with_graph=False)
    events.writer.add_summary(tf.Summary(value=values),
                              result['global_step'] or 0)
    events.close()


def watch_checkpoints(checkpoint_dir, interval_secs, timeout_secs=None,
                      poll_secs=1.0, sleep=time.sleep, clock=time.monotonic):
  """Yields each new latest checkpoint of a directory, waiting for them.

  Args:
    checkpoint_dir: the train logdir (may not exist yet).
    interval_secs: minimum seconds between two yields.
    timeout_secs: stop after waiting this long for a new checkpoint
      (None: wait for ever).
    poll_secs: how often to look for a new checkpoint.
    sleep / clock: injectable for tests.

  Yields:
    checkpoint prefixes.
  """
  last, last_yield = None, None
  wait_start = clock()
  while True:
    # Polled: the fallback's warning would repeat at every poll.
    latest = (checkpoint_state.to_read(checkpoint_dir, warn=False)
              if os.path.isdir(checkpoint_dir) else None)
    if latest is not None and latest != last:
      if last_yield is not None and clock() - last_yield < interval_secs:
        sleep(interval_secs - (clock() - last_yield))
        continue  # a newer checkpoint may have appeared meanwhile
      last, last_yield = latest, clock()
      yield latest
      wait_start = clock()
      continue
    if timeout_secs is not None and clock() - wait_start >= timeout_secs:
      _log.info('no new checkpoint in %s for %.0f s; stopping',
                checkpoint_dir, timeout_secs)
      return
    sleep(poll_secs)


def _checkpoints(checkpoint_dir, eval_options, sleep, clock):
  if not eval_options.follow:
    return [predictor_lib.resolve_checkpoint(checkpoint_dir)]
  if not os.path.isdir(checkpoint_dir):
    if tf.io.gfile.exists(checkpoint_dir + '.index'):
      raise config.ConfigError(
          'follow mode ({EvalOptions.eval_interval_secs}) watches a '
          'directory; {evaluate.checkpoint_dir}=%s is a single checkpoint',
          checkpoint_dir)
    _log.info('waiting for %s to appear', checkpoint_dir)
  return watch_checkpoints(checkpoint_dir, eval_options.eval_interval_secs,
                           eval_options.timeout_secs, sleep=sleep, clock=clock)


def _scores(confusion, count, dataset_info, split):
  """The SegmentationMetrics of `count` images of `split` scored into
  `confusion`.

  Raises:
    InputDataError: the split has no image, or no pixel to score (every
      label the ignore label: an mIoU of nan over 0 classes passed as a
      result, saying no pixel was misclassified).
  """
  if count == 0:
    raise InputDataError('split %r has no images' % split)
  scores = confusion.result(dataset_info.class_names)
  if scores.num_pixels == 0:
    raise _no_pixel_to_score(split, count, dataset_info)
  return scores


def _no_pixel_to_score(split, count, dataset_info):
  return InputDataError(
      'split %r has no pixel to score: every label of its %d images is the '
      'ignore label %d; check its labels and the dataset\'s ignore label',
      split, count, dataset_info.ignore_label)


def check_scorable(dataset_info, split):
  """Refuses, before any work, a `split` whose counts (dataset.json's
  statistics, when kept) show no pixel to score.

  Raises:
    InputDataError: every labelled pixel of the split is the ignore label.
  """
  counted = dataset_info.split_statistics(split)
  if (counted is not None and counted.num_images > counted.unlabelled_images
      and not sum(counted.class_pixels) and not counted.invalid_pixels):
    raise _no_pixel_to_score(split, counted.num_images, dataset_info)


def evaluate_checkpoint(predictor, checkpoint_path, make_samples,
                        dataset_info, eval_options, inference):
  """Restores one checkpoint and scores it.

  Returns:
    The result dict (see module docstring).
  """
  start = time.time()
  predictor.restore(checkpoint_path)
  confusion, count = score(predictor, make_samples(),
                           dataset_info.num_classes, dataset_info.ignore_label,
                           eval_options.batch_size)
  scores = _scores(confusion, count, dataset_info, eval_options.split)
  seconds = time.time() - start
  result = {'checkpoint': checkpoint_path,
            'global_step': predictor_lib.checkpoint_global_step(
                checkpoint_path),
            'dataset': dataset_info.name,
            'split': eval_options.split,
            'num_images': count,
            'eval_crop_size': (list(inference.crop_size)
                               if inference.crop_size else None),
            'eval_scales': list(inference.scales),
            'add_flipped_images': inference.add_flipped_images,
            'seconds': round(seconds, 3)}
  result.update(scores.to_dict())
  return result, scores


def evaluate(checkpoint_dir, eval_logdir, model_options, inference,
             eval_options, dataset_info, make_samples, on_result=None,
             session_config=None, sleep=time.sleep, clock=time.monotonic):
  """Evaluates once, or follows a checkpoint directory.

  Args:
    checkpoint_dir: train logdir, or a checkpoint prefix (run-once only).
    eval_logdir: where summaries, the confusion matrix files and the default
      result JSON go.
    model_options: ModelOptions of the network.
    inference: InferenceOptions (crop, scales, flips).
    eval_options: EvalOptions.
    dataset_info: DatasetInfo of the split.
    make_samples: fn() -> iterable of samples (see `iterate_split`), called
      once per evaluation.
    on_result: fn(result dict, SegmentationMetrics, last) called after each
      evaluation (the CLI prints there); `last`: no evaluation follows it
      (run-once, or the last of --max_number_of_evaluations).
    session_config: optional tf.ConfigProto.
    sleep / clock: injectable for tests (follow mode).

  Returns:
    The list of result dicts.

  Raises:
    NoCheckpointError: run-once mode and no checkpoint.
    CheckpointMismatchError, ImageTooLargeError, InputDataError,
    LabelRangeError: bad input.
    ResultNotWrittenError: eval_logdir, a file in it or the result JSON not
      writable.
  """
  eval_options.validate()
  inference.validate()
  checkpoints = _checkpoints(checkpoint_dir, eval_options, sleep, clock)
  result_json = eval_options.result_json or os.path.join(eval_logdir,
                                                         RESULT_FILENAME)
  results = []
  with predictor_lib.Predictor(model_options, inference,
                               session_config=session_config) as predictor:
    for checkpoint_path in checkpoints:
      try:
        # One-shot, the checkpoint was pinned when it was chosen; followed,
        # each is pinned before the training run can delete it.
        with restore_lib.pinned(checkpoint_path):
          result, scores = evaluate_checkpoint(
              predictor, checkpoint_path, make_samples, dataset_info,
              eval_options, inference)
      except (tf.errors.NotFoundError, restore_lib.CheckpointGoneError,
              restore_lib.DamagedCheckpointError) as e:
        if not eval_options.follow:
          raise
        # The trainer may delete old checkpoints while we read them; one
        # that cannot be read (a disk that filled up while it was saved)
        # does not stop the checkpoints after it from being scored.
        _log.warning('skipping %s: %s', checkpoint_path,
                     getattr(e, 'message', e))
        continue
      _write_outputs(eval_logdir, result_json, result, scores, inference)
      results.append(result)
      limit = eval_options.max_number_of_evaluations
      last = not eval_options.follow or 0 < limit <= len(results)
      if on_result is not None:
        on_result(result, scores, last)
      if last:
        break
  return results


def evaluate_exported(model, eval_logdir, eval_options, dataset_info,
                      make_samples, on_result=None):
  """Scores an exported model once, with a checkpoint's outputs.

  Args:
    model: an open ExportedModel (export/loaded.py).
    eval_logdir: where summaries, the confusion matrix files and the default
      result JSON go.
    eval_options: EvalOptions (follow mode is not for exported models).
    dataset_info: DatasetInfo of the split.
    make_samples: fn() -> iterable of samples (see `iterate_split`) at the
      images' own size: the model resizes them itself.
    on_result: fn(result dict, SegmentationMetrics, last=True) called with
      the result.

  Returns:
    [the result dict]: the checkpoint result's keys, with 'checkpoint' and
    'global_step' None, plus 'exported_model' (the path) and
    'exported_format' (its kind); 'eval_crop_size' is the model's fixed
    input size (None if it takes any size); scales and flips are None
    (baked into the model).

  Raises:
    ImageTooLargeError, ExportedModelError, InputDataError, LabelRangeError:
      bad input.
    ResultNotWrittenError: eval_logdir, a file in it or the result JSON not
      writable.
  """
  eval_options.validate()
  if eval_options.follow:
    raise config.ConfigError(
        'follow mode ({EvalOptions.eval_interval_secs}) watches a checkpoint '
        'directory; an exported model is evaluated once')
  start = time.time()
  confusion, count = score(model, make_samples(), dataset_info.num_classes,
                           dataset_info.ignore_label, eval_options.batch_size)
  scores = _scores(confusion, count, dataset_info, eval_options.split)
  result = {'checkpoint': None,
            'exported_model': model.path,
            'exported_format': model.kind,
            'global_step': None,
            'dataset': dataset_info.name,
            'split': eval_options.split,
            'num_images': count,
            'eval_crop_size': (list(model.input_size)
                               if model.input_size else None),
            'eval_scales': None,
            'add_flipped_images': None,
            'seconds': round(time.time() - start, 3)}
  result.update(scores.to_dict())
  result_json = eval_options.result_json or os.path.join(eval_logdir,
                                                         RESULT_FILENAME)
  _write_outputs(eval_logdir, result_json, result, scores, None)
  if on_result is not None:
    on_result(result, scores, True)
  return [result]


def heatmap_title(result):
  """E.g. 'confusion matrix of step 7 (split val): mIoU 0.4321' (of an
  exported model: 'confusion matrix of frozen.pb (split val): ...')."""
  miou = result['miou']
  if result.get('exported_model'):
    what = os.path.basename(os.path.normpath(result['exported_model']))
  else:
    what = 'step %s' % result['global_step']
  return 'confusion matrix of %s (split %s): mIoU %s' % (
      what, result['split'], '-' if miou is None else '%.4f' % miou)


def _write_outputs(eval_logdir, result_json, result, scores, inference):
  """Summaries and confusion matrix files in eval_logdir and the JSON file,
  or ResultNotWrittenError.

  The three files are put in place together (and the JSON last), so they
  always hold the same evaluation: a failure (a full disk) leaves all three
  as they were.
  """
  path = eval_logdir
  try:
    os.makedirs(eval_logdir, exist_ok=True)
    write_summaries(eval_logdir, result, inference)
    with atomic.together():
      path = os.path.join(eval_logdir, CONFUSION_CSV_FILENAME)
      confusion_lib.write_csv(path, scores.counts, scores.class_names)
      path = os.path.join(eval_logdir, CONFUSION_PNG_FILENAME)
      confusion_lib.write_heatmap(path, scores.counts, scores.class_names,
                                  heatmap_title(result))
      path = result_json
      atomic.write_json(result_json, result)
  except (OSError, tf.errors.OpError) as e:
    if isinstance(e, atomic.OutputNotWrittenError):
      path = e.filename   # also when putting the files in place failed
    raise ResultNotWrittenError(path, atomic.not_written(path, e).strerror,
                                result, scores) from e


def _finite(value):
  return float('nan') if value is None else float(value)
