"""What a retraining round reads and writes down, as values (no files).

  miou_of            the mIoU in a deeplab-eval result
  CurrentModel       the promoted model, as its export's metrics.json says
  export_metrics     that metrics.json
  checkpoint_state   the `checkpoint` file beside an export's checkpoint
  checkpoint_step    the global step in a checkpoint's name
  summary            the JSON line a round ends with

state.py reads and writes the files that hold them; policy.py decides with
them.
"""
import dataclasses
import json
import math
import os
import re
from typing import Optional

from deeplab_train.retrain import policy


def miou_of(result, source):
  """The mIoU of a deeplab-eval result (its --eval_result_json).

  Args:
    result: the parsed JSON.
    source: where it was read, for the message.

  Returns:
    The mIoU, a float.

  Raises:
    policy.RoundError: when there is no finite number under `miou`.
  """
  value = result.get('miou') if isinstance(result, dict) else None
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not math.isfinite(value)):
    raise policy.RoundError("no numeric miou in %s (got '%s')"
                            % (source, '' if value is None else value))
  return float(value)


@dataclasses.dataclass(frozen=True)
class CurrentModel:
  """The promoted model, as its export's metrics.json describes it."""
  global_step: Optional[int] = None
  miou: Optional[float] = None
  data_fingerprint: Optional[str] = None

  @classmethod
  def from_metrics(cls, metrics):
    """Reads export_metrics(); missing or malformed values become None."""
    step, miou = metrics.get('global_step'), metrics.get('miou')
    fingerprint = metrics.get('data_fingerprint')
    try:
      miou = miou_of(metrics, 'metrics.json')
    except policy.RoundError:
      miou = None
    return cls(
        global_step=(step if isinstance(step, int)
                     and not isinstance(step, bool) else None),
        miou=miou,
        data_fingerprint=fingerprint if isinstance(fingerprint, str) else None)


def export_metrics(miou, step, fingerprint, eval_split, promoted_at):
  """The metrics.json saved with an export (read back as a CurrentModel).

  Args:
    miou: the checkpoint's mIoU.
    step: its global step.
    fingerprint: the data fingerprint the mIoU was measured on.
    eval_split: the split it was measured on.
    promoted_at: ISO 8601 time of the promotion.
  """
  return {'miou': miou, 'global_step': step, 'data_fingerprint': fingerprint,
          'eval_split': eval_split, 'promoted_at': promoted_at}


def checkpoint_state(checkpoint):
  """The text of the `checkpoint` file naming `checkpoint` as the latest.

  An export carries a copy of its checkpoint (so that a later round can
  evaluate the current model again); this file makes that folder readable
  as a checkpoint folder. The name is relative, so the folder can move.

  Args:
    checkpoint: the checkpoint prefix (.../model.ckpt-1234).
  """
  name = os.path.basename(checkpoint)
  return ('model_checkpoint_path: "%s"\nall_model_checkpoint_paths: "%s"\n'
          % (name, name))


def checkpoint_step(checkpoint):
  """The global step of a checkpoint prefix (model.ckpt-1234 -> 1234).

  Returns:
    The step; None for an empty prefix (no checkpoint), 0 for a name
    without a step.
  """
  if not checkpoint:
    return None
  match = re.search(r'-([0-9]+)$', checkpoint)
  return int(match.group(1)) if match else 0


def keeps_summary(status):
  """Whether a round's summary replaces last_run.json.

  A busy round must not overwrite the summary of the round holding the lock.
  """
  return status != policy.BUSY


def summary(exit_code, status, log, message=None, global_step=None,
            miou=None, current_miou=None, candidate_source=None,
            candidate_reason=None):
  """The JSON line a round ends with (also written to last_run.json).

  Args:
    exit_code: the round's exit code.
    status: its status word.
    log: path of its log file.
    message: what happened, or None (an unexpected error).
    global_step: the checkpoint judged, if the round got that far.
    miou: its mIoU, if measured.
    current_miou: the current model's mIoU it was compared with, if it was.
    candidate_source: where the checkpoint judged was taken from
      (policy.BEST or policy.LATEST), if the round chose one.
    candidate_reason: why (policy.Candidate.reason).

  Returns:
    One line of JSON, without the newline: status, exit_code, message, log,
    then the facts known, in this order.
  """
  fields = {'status': status, 'exit_code': exit_code}
  if message is not None:
    fields['message'] = message
  fields['log'] = log
  for key, value in (('global_step', global_step), ('miou', miou),
                     ('current_miou', current_miou),
                     ('candidate_source', candidate_source),
                     ('candidate_reason', candidate_reason)):
    if value is not None:
      fields[key] = value
  return json.dumps(fields)
