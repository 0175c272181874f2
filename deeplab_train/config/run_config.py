"""The model config saved beside the checkpoints: written by deeplab-train,
read by deeplab-eval, deeplab-vis and deeplab-export so that they build the
network that was trained."""
import os

from deeplab_train import atomic
from deeplab_train.config.data import PreprocessOptions
from deeplab_train.config.errors import ConfigError
from deeplab_train.config.model import ModelOptions
from deeplab_train.config.serialize import read_json_file

RUN_CONFIG_FILENAME = 'deeplab_config.json'
_INVALID = ('%s is not a valid deeplab config (%s); delete it and pass the '
            'model flags instead')


def save_run_config(logdir, model_options, preprocess_options, dataset,
                    train_options=None):
  """Atomically writes `deeplab_config.json` into `logdir`.

  Args:
    logdir: the training directory.
    model_options: ModelOptions.
    preprocess_options: PreprocessOptions (resize settings matter at export).
    dataset: dict with at least 'name', 'num_classes', 'ignore_label'.
    train_options: TrainOptions of the run, kept as a record (e.g. the class
      weights a --label_weights scheme derived); nothing reads them back.

  Returns:
    The path written.
  """
  path = os.path.join(logdir, RUN_CONFIG_FILENAME)
  payload = {'model_options': model_options.to_dict(),
             'preprocess_options': preprocess_options.to_dict(),
             'dataset': dict(dataset)}
  if train_options is not None:
    payload['train_options'] = train_options.to_dict()
  return atomic.write_json(path, payload)


def load_run_config(logdir_or_file):
  """Reads what `save_run_config` wrote.

  Args:
    logdir_or_file: the training directory, or the JSON file itself.

  Returns:
    (ModelOptions, PreprocessOptions, dataset dict), or None when there is no
    saved config (e.g. a model-zoo checkpoint directory).

  Raises:
    ConfigError: the file exists but cannot be read.
  """
  path = logdir_or_file
  if os.path.isdir(path):
    path = os.path.join(path, RUN_CONFIG_FILENAME)
  payload = read_json_file(path, _INVALID)
  if payload is None:
    return None
  try:
    return (ModelOptions.from_dict(payload['model_options']),
            PreprocessOptions.from_dict(payload['preprocess_options']),
            payload['dataset'])
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(_INVALID, path, e) from None


def check_resumable(logdir, train_options):
  """Raises ConfigError when the checkpoints in `logdir` cannot be resumed
  with `train_options`: another optimizer's slot variables are in them
  (restoring failed with a TensorFlow traceback).

  Args:
    logdir: a training directory holding checkpoints.
    train_options: the TrainOptions of the run about to resume it.
  """
  path = os.path.join(logdir, RUN_CONFIG_FILENAME)
  payload = read_json_file(path, _INVALID)
  saved = payload.get('train_options') if isinstance(payload, dict) else None
  optimizer = saved.get('optimizer') if isinstance(saved, dict) else None
  if optimizer is not None and optimizer != train_options.optimizer:
    raise ConfigError(
        '{TrainOptions.optimizer}=%s, but the checkpoints in %s were trained '
        'with %s, whose slot variables they hold (%s): pass '
        '{TrainOptions.optimizer}=%s to train on, or start a new '
        '{RunOptions.train_logdir}', train_options.optimizer, logdir,
        optimizer, path, optimizer)
