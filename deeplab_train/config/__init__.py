"""Frozen option dataclasses: what the library is told to do.

Each area owns one module (model, data, train, runtime, inference); the
commands in `deeplab_train/cli/` build these from their flags and hand the
library the slice it needs. Every class has `validate()`, which raises a
`ConfigError` written around option fields, never flags (see errors.py),
and round-trips through JSON so the model options can be saved beside the
checkpoints and read back by eval, vis and export (run_config.py).

Everything is re-exported here: `from deeplab_train import config` then
`config.TrainOptions`, `config.ConfigError`, ...
"""
from deeplab_train.config.data import PreprocessOptions
from deeplab_train.config.data import RESIZE_FIELDS
from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_one_of
from deeplab_train.config.errors import ConfigError
from deeplab_train.config.errors import render
from deeplab_train.config.inference import EvalOptions
from deeplab_train.config.inference import ExportOptions
from deeplab_train.config.inference import ImageTooLargeError
from deeplab_train.config.inference import InferenceOptions
from deeplab_train.config.inference import TFLITE_QUANTIZE_MODES
from deeplab_train.config.inference import VisOptions
from deeplab_train.config.model import ModelOptions
from deeplab_train.config.run_config import check_resumable
from deeplab_train.config.run_config import load_run_config
from deeplab_train.config.run_config import RUN_CONFIG_FILENAME
from deeplab_train.config.run_config import save_run_config
from deeplab_train.config.runtime import ClusterOptions
from deeplab_train.config.runtime import PROFILE_STEPS
from deeplab_train.config.runtime import RunOptions
from deeplab_train.config.train import check_training_setup
from deeplab_train.config.train import LEARNING_POLICIES
from deeplab_train.config.train import MIXED_PRECISION_MODES
from deeplab_train.config.train import OPTIMIZERS
from deeplab_train.config.train import TrainOptions
from deeplab_train.config.train import FP16_ON_CPU
from deeplab_train.config.train import XLA_ON_CPU
from deeplab_train.config.train import valid_crop_sizes_near
