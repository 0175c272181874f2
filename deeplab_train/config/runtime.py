"""How a training run is driven and where it runs (owned by runtime/)."""
import dataclasses
import re
from typing import Optional, Tuple

from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_finite
from deeplab_train.config.errors import ConfigError
from deeplab_train.config.errors import field_ref
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.config.serialize import set_field
from deeplab_train.config.serialize import tuple_or_none

# Steps between two Chrome traces in RunOptions.profile_logdir (the
# default of runtime/run.py's PROFILE_STEPS, which the run reads).
PROFILE_STEPS = 100

# RunOptions.best_metric: the mIoU, or one class's IoU by name or id.
_BEST_METRIC = re.compile(r'^(miou|iou/.+)$')


@dataclasses.dataclass(frozen=True)
class RunOptions(JsonMixin):
  """How a training run is driven: logdir, checkpoints, stopping, logging.

  Attributes:
    train_logdir: checkpoints, summaries, deeplab_config.json and the lock.
    log_steps: a progress line every this many steps.
    save_interval_secs / save_interval_steps: a checkpoint when either is
      due (0 or None switches one off); a final one is always written when
      the run stops normally.
    save_summaries_secs: TensorBoard summaries interval (0: none).
    keep_checkpoint_max: checkpoints kept in train_logdir.
    max_run_seconds: stop (with a checkpoint) after this wall time.
    num_steps_more: stop after this many more steps than the logdir's
      checkpoint holds (never past training_number_of_steps).
    profile_logdir: write Chrome traces of a step every PROFILE_STEPS there.
    result_json: also write the result as JSON to this file.
    eval_split / eval_interval_steps: score the weights on this split
      every this many steps (None: no validation during training; see
      runtime/validation.py); both are set, or neither.
    best_metric: what the best checkpoint (copied to train_logdir/best) is
      chosen by: 'miou', or 'iou/' + a class name or id.
    early_stopping_patience: stop after this many evaluations in a row
      without an improvement of more than early_stopping_min_delta of
      best_metric (0: never).
    early_stopping_start_step: evaluations of earlier steps are kept in the
      history (and may be the best) but early stopping neither counts them
      nor compares with them: it starts at this step.
  """
  train_logdir: str
  log_steps: int = 10
  save_interval_secs: Optional[float] = 1200
  save_interval_steps: Optional[int] = None
  save_summaries_secs: Optional[float] = 600
  keep_checkpoint_max: int = 5
  max_run_seconds: Optional[float] = None
  num_steps_more: Optional[int] = None
  profile_logdir: Optional[str] = None
  result_json: Optional[str] = None
  eval_split: Optional[str] = None
  eval_interval_steps: Optional[int] = None
  best_metric: str = 'miou'
  early_stopping_patience: int = 0
  early_stopping_min_delta: float = 0.0
  early_stopping_start_step: int = 0

  @property
  def validates(self):
    """Whether the run scores its weights as it trains."""
    return self.eval_interval_steps is not None

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(self.train_logdir, '{RunOptions.train_logdir} is required: the '
          'folder for checkpoints and summaries')
    check(self.log_steps >= 1, '{RunOptions.log_steps} must be >= 1')
    for name in ('save_interval_secs', 'save_interval_steps',
                 'save_summaries_secs'):
      check((getattr(self, name) or 0) >= 0, '%s must be >= 0 (0 switches '
            'it off)' % field_ref(self, name))
    check(self.keep_checkpoint_max >= 1,
          '{RunOptions.keep_checkpoint_max} must be >= 1')
    check(self.max_run_seconds is None or self.max_run_seconds > 0,
          '{RunOptions.max_run_seconds} must be > 0')
    check(self.num_steps_more is None or self.num_steps_more >= 1,
          '{RunOptions.num_steps_more} must be >= 1')
    self._validate_validation()
    return self

  def _validate_validation(self):
    check(self.eval_interval_steps is None or self.eval_interval_steps >= 1,
          '{RunOptions.eval_interval_steps} must be >= 1, got %s'
          % self.eval_interval_steps)
    check(self.eval_split is None or self.validates,
          '{RunOptions.eval_split} needs {RunOptions.eval_interval_steps}: '
          'the number of steps between two evaluations')
    check(not self.validates or self.eval_split,
          '{RunOptions.eval_interval_steps} needs {RunOptions.eval_split}: '
          'the split to evaluate on')
    if not _BEST_METRIC.match(self.best_metric or ''):
      # The value is the user's: a template value, never a reference.
      raise ConfigError('{RunOptions.best_metric} must be miou or iou/CLASS '
                        '(a class name or id), got %r', self.best_metric)
    check(self.early_stopping_patience >= 0,
          '{RunOptions.early_stopping_patience} must be >= 0 (0: off)')
    check(self.early_stopping_min_delta >= 0,
          '{RunOptions.early_stopping_min_delta} must be >= 0')
    check(self.early_stopping_start_step >= 0,
          '{RunOptions.early_stopping_start_step} must be >= 0')
    for name, default in (('best_metric', 'miou'),
                          ('early_stopping_patience', 0),
                          ('early_stopping_min_delta', 0.0),
                          ('early_stopping_start_step', 0)):
      check(self.validates or getattr(self, name) == default,
            '%s needs {RunOptions.eval_interval_steps}: it acts on the '
            'evaluations during training' % field_ref(self, name))


@dataclasses.dataclass(frozen=True)
class ClusterOptions(JsonMixin):
  """Training across machines (see `deeplab_train.runtime.cluster_spec`).

  Attributes:
    ps_hosts / worker_hosts: 'host:port' of each ps / worker task (the
      chief first); empty for a single-machine run (or TF_CONFIG).
    job_name: 'ps' or 'worker' (None without a cluster).
    task: this process's index in its job (the original's task number).
    sync_replicas: synchronous updates (SyncReplicasOptimizer); False:
      asynchronous.
    num_replicas / num_ps_tasks: the original's options; None follows the
      cluster, a value must match it.
    startup_delay_steps: asynchronous mode: worker i starts at global step
      i * startup_delay_steps (the original's option).
  """
  ps_hosts: Tuple[str, ...] = ()
  worker_hosts: Tuple[str, ...] = ()
  job_name: Optional[str] = None
  task: int = 0
  sync_replicas: bool = True
  num_replicas: Optional[int] = None
  num_ps_tasks: Optional[int] = None
  startup_delay_steps: int = 15

  def __post_init__(self):
    for name in ('ps_hosts', 'worker_hosts'):
      set_field(self, name, tuple_or_none(getattr(self, name), str) or ())

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    for name, minimum in (('task', 0), ('num_replicas', 1),
                          ('num_ps_tasks', 0), ('startup_delay_steps', 0)):
      value = getattr(self, name)
      check(value is None or value >= minimum, '%s must be >= %d, got %d'
            % (field_ref(self, name), minimum, value or 0))
    return self
