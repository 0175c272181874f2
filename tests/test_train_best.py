"""deeplab-train's validation during training: the metrics history, the best
checkpoint in best/ (and deeplab-eval agreeing with its metric), early
stopping, a kill -9 then a resume, and the flags' checks."""
import json
import logging
import os
import signal

from absl import flags
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.cli import eval as eval_cli
from deeplab_train.cli import train as train_cli
from deeplab_train.data import build
from deeplab_train.runtime import validation

import eval_testing as et
import train_testing as tt

FLAGS = flags.FLAGS


@pytest.fixture(scope='module')
def records(tmp_path_factory):
  """The sample records as a train and a val split in one folder."""
  out = tmp_path_factory.mktemp('records')
  tt.make_tfrecords(out, count=2)
  tt.make_tfrecords(out, count=2, split='val')
  return str(out)


def _main(args):
  """Runs deeplab-train's main() in-process; (exit code, result dict)."""
  code, _, result = tt.main_in_process('deeplab-train', train_cli.main, args)
  return code, result


def _history(logdir):
  return validation.read_history(str(logdir))


def _best(logdir):
  with open(os.path.join(str(logdir), 'best', 'best.json')) as f:
    return json.load(f)


@pytest.mark.parametrize('extra,message', [
    (['--eval_split=val'], '--eval_split needs --eval_interval_steps'),
    (['--eval_interval_steps=0'], '--eval_interval_steps must be >= 1'),
    (['--early_stopping_patience=2'],
     '--early_stopping_patience needs --eval_interval_steps'),
    (['--eval_interval_steps=2', '--early_stopping_patience=-1'],
     '--early_stopping_patience must be >= 0'),
    (['--early_stopping_start_step=300'],
     '--early_stopping_start_step needs --eval_interval_steps'),
    (['--eval_interval_steps=2', '--early_stopping_start_step=-1'],
     '--early_stopping_start_step must be >= 0'),
    (['--eval_interval_steps=2', '--best_metric=accuracy'],
     "--best_metric must be miou or iou/CLASS (a class name or id), got "
     "'accuracy'"),
    (['--eval_interval_steps=2', '--best_metric=iou/7'],
     '--best_metric=iou/7 names no class of dataset shapes'),
    (['--eval_interval_steps=2', '--eval_split=nope'], 'nope'),
    (['--eval_interval_steps=2', '--ps_hosts=localhost:1',
      '--worker_hosts=localhost:2', '--job_name=worker', '--task=0'],
     'not supported on a cluster yet'),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, records, extra, message):
  code, result = _main(tt.tiny_cli_args(tmp_path / 'log', records, 5,
                                        *extra))
  assert code == 2 and result['status'] == 'bad_input'
  assert message in result['message'] and '\n' not in result['message']
  assert tt.latest_step(tmp_path / 'log') is None


def test_a_validation_split_without_a_pixel_to_score_is_refused_at_once(
    tmp_path, capsys):
  """Labels all the ignore label: every evaluation gave an mIoU of nan, and
  no checkpoint was ever kept as the best. deeplab-eval refuses the split
  too, and leaves no eval folder behind."""
  records = tmp_path / 'records'
  tt.make_tfrecords(records, count=2)
  entries = []
  for i in range(2):
    image = tt.SAMPLE / 'JPEGImages' / ('train_%04d.jpg' % i)
    label = tmp_path / ('ignored_%d.png' % i)
    with Image.open(image) as opened:
      Image.new('L', opened.size, 255).save(label)
    entries.append(build.Entry('val_%d' % i, str(image), str(label)))
  build.convert({'val': entries}, str(records), build.BuildOptions(
      num_classes=tt.NUM_CLASSES, ignore_label=255, dataset_name='shapes',
      num_shards=1, num_workers=1))
  message = ("split 'val' has no pixel to score: every label of its 2 images "
             "is the ignore label 255; check its labels and the dataset's "
             'ignore label')
  code, result = _main(tt.tiny_cli_args(tmp_path / 'log', str(records), 5,
                                        '--eval_interval_steps=2'))
  assert code == 2 and result['message'] == message
  assert tt.latest_step(tmp_path / 'log') is None
  logdir = tmp_path / 'trained'
  assert _main(tt.tiny_cli_args(logdir, str(records), 1))[0] == 0
  capsys.readouterr()
  assert et.run_cli(eval_cli, ['--checkpoint_dir=%s' % logdir,
                               '--dataset_dir=%s' % records]) == 2
  assert message in capsys.readouterr().err
  assert not (logdir / 'eval').exists()


def test_resume_repairs_what_a_kill_left(tmp_path):
  """Killed while best/ was swapped, after a new best but before the
  history line: the new best/ is put in place, its record back in the
  history, the temp files removed."""
  logdir = str(tmp_path)
  record = lambda step, miou: {'step': step, 'miou': miou, 'seconds': 1.0,
                               'per_class_iou': {'a': miou}}
  validation.write_history(logdir, [record(1, 0.2)])
  best = lambda step, miou: {'step': step, 'metric': 'miou', 'value': miou,
                             'record': record(step, miou)}
  for name, payload in (('.best.tmp-99.old', best(1, 0.2)),
                        ('.best.tmp-99', best(2, 0.3))):
    os.makedirs(os.path.join(logdir, name))
    with open(os.path.join(logdir, name, 'best.json'), 'w') as f:
      json.dump(payload, f)
  open(os.path.join(logdir, '.metrics_history.jsonl.tmp-99'), 'w').close()
  state = validation.load_state(logdir, 'miou', None, 0.01)
  assert state.best['step'] == 2 and _best(logdir)['step'] == 2
  assert [r['step'] for r in _history(logdir)] == [1, 2]
  assert state.stopping_best == 0.3 and state.without_improvement == 0
  assert sorted(os.listdir(logdir)) == ['best', 'metrics_history.jsonl']
  # Another metric: best/ is not compared with; the count is the history's.
  state = validation.load_state(logdir, 'iou/a', 'a', 0.2)
  assert state.best is None and state.without_improvement == 1


def test_what_a_resumed_run_does_not_take_from_best_and_the_history(
    tmp_path, caplog):
  """Before: best.json of the wrong types was a traceback (exit 1, the
  logdir stuck); a NaN value was never beaten; a logdir whose checkpoints
  were deleted stopped early at step 0 on the old run's history; another
  split's evaluations counted for early stopping; iou/0 and iou/<its name>
  were two metrics."""
  from deeplab_train.data import datasets  # pylint: disable=g-import-not-at-top
  logdir = str(tmp_path)
  info = datasets.DatasetInfo(name='d', num_classes=2, ignore_label=255,
                              splits_to_sizes={}, class_names=('bg', 'fg'))
  record = lambda step, miou, split='val': {
      'step': step, 'miou': miou, 'seconds': 1.0, 'split': split,
      'per_class_iou': {'bg': miou, 'fg': miou}}
  best_json = os.path.join(logdir, 'best', 'best.json')
  os.makedirs(os.path.dirname(best_json))

  def write_best(text):
    with open(best_json, 'w') as f:
      f.write(text)
  validation.write_history(logdir, [record(2, 0.5), record(4, 0.4)])
  for damaged in ('[1, 2]', '{"step": 2, "metric": "miou", "value": "abc"}',
                  '{"step": 2, "metric": "miou", "value": NaN}',
                  '{"step": "x", "metric": "miou", "value": 0.5}',
                  '{"step": 2, "metric": "miou", "value": 0.5, '
                  '"record": {"miou": 0.5}}'):
    write_best(damaged)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      state = validation.load_state(logdir, 'miou', None, 0.0,
                                    checkpoint_step=4, split='val')
    assert state.best is None, damaged
    assert ('cannot read %s' % best_json) in caplog.text, damaged
  # A history line of the wrong types is skipped, not a TypeError later.
  with open(validation.history_path(logdir), 'a') as f:
    f.write('{"step": 5, "miou": "x"}\n')
    # (The time budget reads the last evaluation's seconds.)
    f.write('{"step": 6, "miou": 0.5, "seconds": "x"}\n')
  assert [r['step'] for r in validation.read_history(logdir)] == [2, 4]

  write_best(json.dumps({'step': 2, 'metric': 'iou/0', 'value': 0.5,
                         'record': record(2, 0.5)}))
  state = validation.load_state(logdir, 'iou/bg', 'bg', 0.0,
                                checkpoint_step=4, split='val',
                                dataset_info=info)
  assert state.best['step'] == 2 and state.without_improvement == 1
  # Scored on another split: neither best/ nor the count is compared with.
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    state = validation.load_state(logdir, 'iou/bg', 'bg', 0.0,
                                  checkpoint_step=4, split='train',
                                  dataset_info=info)
  assert state.best is None and state.without_improvement == 0
  assert len(state.records) == 2
  assert "best/ holds the best on split 'val', not 'train'" in caplog.text
  # The checkpoints are gone (a fresh start, step 0): the old evaluations
  # are moved aside, best/ is replaced by the next evaluation.
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    state = validation.load_state(logdir, 'miou', None, 0.0,
                                  checkpoint_step=0, split='val')
  assert state.best is None and state.records == []
  assert not state.patience_used_up(1)
  assert _history(logdir) == []
  aside = validation.history_path(logdir) + '.until-step-4'
  # As it was, its skipped line too: nothing is lost.
  assert [json.loads(l)['step'] for l in open(aside)] == [2, 4, 5, 6]
  assert 'best/ holds step 2, past the latest checkpoint' in caplog.text


def test_an_evaluation_that_would_end_past_the_time_budget_stops_the_run():
  """An evaluation begun just before --max_run_seconds ran to its end, then
  one more step was trained: the run ended seconds past its budget. So did
  a SIGTERM that came during an evaluation."""
  from deeplab_train.runtime import hooks as hooks_lib  # pylint: disable=g-import-not-at-top
  options = config.RunOptions(train_logdir='unused', eval_interval_steps=2,
                              eval_split='val', max_run_seconds=100)

  class Clock:
    now = 0.

  class Validator:
    def __init__(self):
      self.state = validation.ValidationState(
          [{'step': 2, 'miou': 0.5, 'seconds': 30.0, 'per_class_iou': {}}],
          None)
      self.scored = []

    def score(self, checkpoint, step):
      self.scored.append(step)
      Clock.now += 40.   # this evaluation takes 40 s

  class Context:
    stopped = False
    session = None

    def request_stop(self):
      self.stopped = True

  class Values:
    def __init__(self, step):
      self.results = step

  def run(seconds_left, step=4):
    stop = hooks_lib.StopState()
    budget = hooks_lib.TimeBudgetHook(100, 0., stop)
    budget.seconds_left = lambda: seconds_left - Clock.now
    Clock.now = 0.
    validator = Validator()
    hook = validation.ValidationHook(options, validator,
                                     lambda session, step: 'ckpt', None, None,
                                     10, stop, budget)
    context = Context()
    hook.after_run(context, Values(step))
    return validator.scored, context.stopped, stop.reason
  # 20 s left, the last evaluation took 30: not started, the run stops.
  assert run(20.) == ([], True, hooks_lib.TIME_BUDGET)
  # 35 s left: started; it takes 40 and ends past the budget: stop now.
  assert run(35.) == ([4], True, hooks_lib.TIME_BUDGET)
  # 60 s left: evaluated, training goes on.
  assert run(60.) == ([4], False, None)
  assert run(60., step=3) == ([], False, None)   # not on the rhythm

  # A SIGTERM during an evaluation: the run stops after it, not a step on.
  class Signalled(Validator):
    def score(self, checkpoint, step):
      super().score(checkpoint, step)
      stop.request(hooks_lib.SIGNAL_PREFIX + 'SIGTERM')
  stop = hooks_lib.StopState()
  hook = validation.ValidationHook(options, Signalled(),
                                   lambda session, step: 'ckpt', None, None,
                                   10, stop)
  context = Context()
  hook.after_run(context, Values(4))
  assert context.stopped


def test_early_stopping_starts_at_its_start_step(tmp_path):
  """Before the start step evaluations are history only: a flat start
  (batch norm averages still at their initial values) does not use up the
  patience, and the reference value is the first one from the start step."""
  record = lambda step, miou: {'step': step, 'miou': miou, 'seconds': 1.0,
                               'per_class_iou': {'a': miou}}
  history = [record(100, 0.16), record(200, 0.16), record(300, 0.16),
             record(400, 0.5), record(500, 0.45), record(600, 0.49)]
  state = validation.ValidationState([], None)
  for r in history:
    state.add(r, None, 0.0, start_step=400)
  assert len(state.records) == 6
  assert (state.stopping_best, state.without_improvement) == (0.5, 2)
  assert not state.patience_used_up(3) and state.patience_used_up(2)
  # Without a start step the flat start alone uses up a patience of 2.
  flat = validation.ValidationState([], None)
  for r in history[:3]:
    flat.add(r, None, 0.0)
  assert flat.patience_used_up(2)
  # A resumed run counts the same way from the history file.
  validation.write_history(str(tmp_path), history)
  resumed = validation.load_state(str(tmp_path), 'miou', None, 0.0, 400)
  assert (resumed.stopping_best, resumed.without_improvement) == (0.5, 2)


@pytest.mark.slow
def test_history_best_and_deeplab_eval_agree(tmp_path, records, capsys):
  logdir = tmp_path / 'log'
  code, result = _main(tt.tiny_cli_args(logdir, records, 5,
                                        '--eval_interval_steps=2'))
  assert code == 0 and result['stop_reason'] == 'finished', result
  history = _history(logdir)
  # Every 2 steps, and the last step.
  assert [r['step'] for r in history] == [2, 4, 5]
  for record in history:
    assert sorted(record) == ['miou', 'per_class_iou', 'seconds', 'split',
                              'step']
    assert record['split'] == 'val'
    assert 0.0 <= record['miou'] <= 1.0
    assert len(record['per_class_iou']) == tt.NUM_CLASSES
  best = _best(logdir)
  mious = [r['miou'] for r in history]
  assert best['metric'] == 'miou' and best['value'] == max(mious)
  assert best['step'] == history[mious.index(max(mious))]['step']
  assert 'best miou' in result['message']
  # best/ is a checkpoint directory on its own: state file, config.
  best_dir = logdir / 'best'
  assert tf.train.latest_checkpoint(str(best_dir)) == str(
      best_dir / ('model.ckpt-%d' % best['step']))
  assert config.load_run_config(str(best_dir))[0] == tt.tiny_model_options()
  # eval/miou is in the train logdir's TensorBoard events.
  tags = {v.tag for path in tf.io.gfile.glob(str(logdir / 'events.*'))
          for event in tf.train.summary_iterator(path)
          for v in event.summary.value}
  assert 'eval/miou' in tags
  # deeplab-eval of best/ (its own flags only) reports the same mIoU.
  capsys.readouterr()
  assert et.run_cli(eval_cli, ['--checkpoint_dir=%s' % best_dir,
                               '--dataset_dir=%s' % records,
                               '--eval_logdir=%s' % (tmp_path / 'eval')]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  evaluated = json.loads(lines[-1])
  assert evaluated['global_step'] == best['step']
  assert evaluated['miou'] == best['value']
  assert evaluated['per_class_iou'] == best['record']['per_class_iou']


@pytest.mark.slow
def test_early_stopping_when_the_metric_cannot_improve(tmp_path, records):
  # No learning: every evaluation gives the same mIoU.
  logdir = tmp_path / 'log'
  args = tt.tiny_cli_args(
      logdir, records, 50, '--base_learning_rate=0',
      '--eval_interval_steps=1', '--early_stopping_patience=1',
      '--early_stopping_min_delta=0.001')
  code, result = _main(args)
  assert code == 0 and result['stop_reason'] == 'early_stopping', result
  assert result['global_step'] == 2 and tt.latest_step(logdir) == 2
  assert result['checkpoint'].endswith('model.ckpt-2')
  assert [r['step'] for r in _history(logdir)] == [1, 2]
  assert _best(logdir)['step'] == 1
  # Run again: the history shows the patience used up, nothing trains.
  code, result = _main(args)
  assert code == 0 and result['stop_reason'] == 'early_stopping', result
  assert result['global_step'] == 2 and len(_history(logdir)) == 2


def test_an_evaluation_lost_to_a_full_disk_is_scored_by_the_next_run(
    tmp_path, records, monkeypatch):
  """The history's write failing (a full disk) ended the run as an
  unexpected error without step or checkpoint; and the next run, with
  nothing left to train, never scored the last checkpoint."""
  logdir = tmp_path / 'log'
  args = tt.tiny_cli_args(logdir, records, 3, '--base_learning_rate=0',
                          '--eval_interval_steps=2')
  write_history = validation.write_history

  def disk_full_at_step_3(path, history):
    if history[-1]['step'] == 3:
      raise OSError(28, 'No space left on device')
    write_history(path, history)
  monkeypatch.setattr(validation, 'write_history', disk_full_at_step_3)
  code, result = _main(args)
  assert code == 1, result
  assert (result['stop_reason'], result['global_step']) == (
      'validation_not_saved', 3), result
  assert result['checkpoint'].endswith('model.ckpt-3')
  assert result['message'].startswith(
      'cannot keep the evaluation of step 3: cannot write %s: no space left '
      'on device. Free space in %s and run again' % (
          logdir / 'metrics_history.jsonl', logdir)), result
  assert [r['step'] for r in _history(logdir)] == [2]

  monkeypatch.setattr(validation, 'write_history', write_history)
  # A SIGTERM during that scoring: the scoring is kept, and the signal is
  # the stop reason (it was reported as 'nothing_to_do').
  score = validation.Validator.score

  def signalled_while_scoring(self, checkpoint, step):
    os.kill(os.getpid(), signal.SIGTERM)
    return score(self, checkpoint, step)
  monkeypatch.setattr(validation.Validator, 'score', signalled_while_scoring)
  code, result = _main(args)
  monkeypatch.setattr(validation.Validator, 'score', score)
  assert code == 0 and result['stop_reason'] == 'signal:SIGTERM', result
  assert 'scored step 3, which the run that saved it did not' in (
      result['message'])
  assert result['message'].endswith('(signal:SIGTERM during the scoring)')
  assert [r['step'] for r in _history(logdir)] == [2, 3]
  assert _best(logdir)['step'] == 2   # an equal mIoU does not replace it
  # Once scored, it is not scored again.
  code, result = _main(args)
  assert code == 0 and 'scored' not in result['message'], result
  assert [r['step'] for r in _history(logdir)] == [2, 3]


def test_an_evaluation_lost_on_the_rhythm_is_scored_when_training_goes_on(
    tmp_path, records, monkeypatch):
  """The next run scored a lost evaluation only when nothing was left to
  train: one that trained on never scored that step (the best could be
  lost, the early-stopping count was off)."""
  logdir = tmp_path / 'log'
  args = tt.tiny_cli_args(logdir, records, 4, '--base_learning_rate=0',
                          '--eval_interval_steps=2')
  save_best = validation.save_best

  def disk_full_at_step_2(path, checkpoint, best):
    if best['step'] == 2:
      raise OSError(28, 'No space left on device')
    return save_best(path, checkpoint, best)
  monkeypatch.setattr(validation, 'save_best', disk_full_at_step_2)
  code, result = _main(args)
  assert (code, result['stop_reason'], result['global_step']) == (
      1, 'validation_not_saved', 2), result
  assert _history(logdir) == []
  assert not os.path.exists(os.path.join(str(logdir), 'best'))
  monkeypatch.setattr(validation, 'save_best', save_best)
  code, result = _main(args)
  assert (code, result['global_step']) == (0, 4), result
  assert [r['step'] for r in _history(logdir)] == [2, 4]
  assert _best(logdir)['step'] == 2


def test_a_validation_split_gone_while_training_keeps_the_checkpoint(
    tmp_path, records, monkeypatch):
  """Its result was 'bad_input' with "checkpoint": null, though the step's
  checkpoint was written (cron_retrain.sh and scripts read that field)."""
  logdir = tmp_path / 'log'

  def gone(self, checkpoint, step):
    raise config.ConfigError('split %r is gone' % 'val')
  monkeypatch.setattr(validation.Evaluator, '__call__', gone)
  code, result = _main(tt.tiny_cli_args(logdir, records, 4,
                                        '--eval_interval_steps=2'))
  assert (code, result['status'], result['global_step']) == (
      2, 'bad_input', 2), result
  assert result['checkpoint'] == str(logdir / 'model.ckpt-2'), result
  assert result['message'] == "split 'val' is gone"


@pytest.mark.slow
def test_kill_9_then_resume_keeps_best_history_and_count(tmp_path, records):
  # The kill lands between the 2nd and the (patience + 1)th evaluation.
  patience = 6
  logdir = tmp_path / 'log'
  args = tt.tiny_cli_args(
      logdir, records, 1000, '--base_learning_rate=0',
      '--eval_interval_steps=1', '--early_stopping_patience=%d' % patience,
      '--early_stopping_min_delta=0.001')
  proc = tt.start_cli(args, tmp_path / 'run1')
  try:
    tt.wait_for(lambda: len(_history(logdir)) >= 2, proc=proc)
  finally:
    proc.kill()
    proc.wait()
  before = _history(logdir)
  assert len(before) <= patience, 'killed too late: the run had stopped'
  assert _best(logdir)['step'] == before[0]['step']
  code, result = _main(args)
  assert code == 0 and result['stop_reason'] == 'early_stopping', result
  after = _history(logdir)
  # The count went on from the history: 1 best + `patience` without
  # improvement in all, whenever the kill came; the records before it are
  # kept.
  assert len(after) == patience + 1 and after[:len(before)] == before
  steps = [r['step'] for r in after]
  assert steps == sorted(set(steps))
  # The first evaluation stays the best (an equal mIoU does not replace it).
  assert _best(logdir)['step'] == before[0]['step']
  assert not [e for e in os.listdir(logdir) if '.tmp-' in e]
