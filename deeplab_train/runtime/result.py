"""How a command ended: the result every command reports as one JSON line,
and the exit code each status maps to.

  ok               0  done: finished, time budget, SIGTERM/SIGINT (a final
                      checkpoint is written), or nothing to do
  error            1  anything unexpected; also a cluster task whose step
                      still waited for another task a grace period past
                      its time budget, stopped at once (the last
                      checkpoint written is intact)
  bad_input        2  bad flags, dataset, checkpoint or records
  non_finite_loss  3  NaN/inf loss or weights; no checkpoint of that step
  locked          75  another live run holds the logdir (EX_TEMPFAIL)
  interrupted    130  a second SIGINT: stopped at once (128 + SIGINT)
  terminated     143  a second SIGTERM: stopped at once (128 + SIGTERM);
                      the last checkpoint written is intact

No TensorFlow here: the cron round's policy reads these codes in a process
that should start in a fraction of a second.
"""
import dataclasses
import json
import math
from typing import Any, Optional

from deeplab_train import atomic

EXIT_CODES = {'ok': 0, 'error': 1, 'bad_input': 2, 'non_finite_loss': 3,
              'locked': 75, 'interrupted': 130, 'terminated': 143}
# The stop reason of a signal: SIGNAL_PREFIX + 'SIGTERM'.
SIGNAL_PREFIX = 'signal:'
# The stop reason of --max_run_seconds.
TIME_BUDGET = 'time_budget'
# The status of a run stopped at once by a second signal of its name.
STOPPED_NOW = {'SIGINT': 'interrupted', 'SIGTERM': 'terminated'}


@dataclasses.dataclass
class RunResult:
  """How a run ended (see the module docstring for statuses)."""
  status: str
  stop_reason: str
  global_step: Optional[int] = None
  loss: Optional[float] = None
  checkpoint: Optional[str] = None
  seconds: float = 0.0
  message: str = ''
  # What the message says, naming option fields (a ConfigError or a
  # config.errors.Message: render(name_of) shows them in a command's terms);
  # not part of the JSON.
  detail: Optional[Any] = dataclasses.field(default=None, repr=False,
                                            compare=False)

  @property
  def exit_code(self):
    return EXIT_CODES[self.status]

  def to_dict(self):
    d = {'event': 'result'}
    d.update(dataclasses.asdict(self))
    del d['detail']
    d['seconds'] = round(self.seconds, 3)
    if d['loss'] is not None and not math.isfinite(d['loss']):
      d['loss'] = str(d['loss'])  # JSON has no NaN
    return d

  def to_json(self):
    return json.dumps(self.to_dict(), sort_keys=True)


def write_result_json(result, path):
  """Writes the result to `path` under a temporary name, then renames."""
  atomic.write_bytes(path, (result.to_json() + '\n').encode('utf-8'))
