"""Tests of the retraining round's policy (deeplab_train/retrain).

The decisions are pure functions, tested here without TensorFlow or any
command; tests/test_scripts.py runs whole rounds of scripts/cron_retrain.sh.
Over 400 lines on purpose: a short section per decision of the policy
(plan, training outcome, candidate, verdict, results, housekeeping), mostly
tables of cases.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from deeplab_train.retrain import data_folder
from deeplab_train.retrain import policy
from deeplab_train.retrain import records
from deeplab_train.retrain import settings
from deeplab_train.retrain import state

import fake_voc

FP = 'f' * 64        # a data fingerprint
NEW_FP = 'e' * 64    # the data after a change
BUDGET = policy.Budget(steps_per_run=1000, max_total_steps=5000)
# The trainer's table with other numbers than deeplab-train's: the policy
# must read codes through the table, never by value.
TRAINER_CODES = {'ok': 0, 'error': 101, 'bad_input': 102,
                 'non_finite_loss': 103, 'locked': 175}


def _decided(step, fingerprint=FP):
  return policy.State(built=fingerprint, trained=fingerprint,
                      decided=policy.decision_key(step, fingerprint))


# ---------------------------------------------------------------------------
# plan_round: build, train, or nothing to do.
# ---------------------------------------------------------------------------
def test_first_round_builds_and_trains():
  plan = policy.plan_round(FP, records_ready=False, checkpoint_step=None,
                           state=policy.State(), budget=BUDGET)
  assert plan == policy.Plan(build=True, train_steps=1000)


def test_changed_data_or_missing_records_rebuild():
  done = _decided(5000)
  assert policy.plan_round(NEW_FP, True, 5000, done, BUDGET).build
  assert policy.plan_round(FP, False, 5000, done, BUDGET).build


@pytest.mark.parametrize('step, expected', [
    (0, 1000), (3999, 1000), (4500, 500), (5000, 0), (7000, 0)])
def test_steps_stop_at_max_total_steps(step, expected):
  assert policy.steps_to_train(step, FP, policy.State(), BUDGET) == expected


def test_train_only_on_new_data():
  budget = policy.Budget(1000, 5000, only_on_new_data=True)
  seen = policy.State(trained=FP)
  assert policy.steps_to_train(10, FP, seen, budget) == 0
  assert policy.steps_to_train(10, NEW_FP, seen, budget) == 1000
  assert policy.steps_to_train(10, FP, seen, BUDGET) == 1000


def test_nothing_to_do_same_data_and_already_at_step():
  outcome = policy.plan_round(FP, True, 5000, _decided(5000), BUDGET)
  assert outcome == policy.Outcome(
      policy.EXIT_NOTHING_TO_DO, 'nothing_to_do',
      'data unchanged, no steps to train, checkpoint step 5000 already '
      'evaluated')


def test_nothing_to_do_without_checkpoint_or_steps():
  budget = policy.Budget(steps_per_run=0, max_total_steps=5000)
  outcome = policy.plan_round(FP, True, None, _decided(0), budget)
  assert outcome.exit_code == policy.EXIT_NOTHING_TO_DO
  assert outcome.status == 'nothing_to_do'
  assert 'no checkpoint yet' in outcome.message


def test_undecided_checkpoint_is_still_judged():
  # E.g. the last round was killed after training, before the verdict.
  stale = policy.State(built=FP, trained=FP,
                       decided=policy.decision_key(4000, FP))
  plan = policy.plan_round(FP, True, 5000, stale, BUDGET)
  assert plan == policy.Plan(build=False, train_steps=0)
  # A checkpoint decided on other data is judged again, too.
  other_data = policy.State(built=FP, decided=policy.decision_key(5000,
                                                                  NEW_FP))
  assert isinstance(policy.plan_round(FP, True, 5000, other_data, BUDGET),
                    policy.Plan)


def test_nothing_to_do_looks_at_the_candidate():
  # best/ holds step 300, decided; the latest (step 400) never was judged,
  # but it is not the candidate.
  best = policy.Candidate(policy.BEST, 300, 'why')
  budget = policy.Budget(steps_per_run=0, max_total_steps=5000)
  outcome = policy.plan_round(FP, True, 400, _decided(300), budget, best)
  assert outcome == policy.Outcome(
      policy.EXIT_NOTHING_TO_DO, 'nothing_to_do', 'data unchanged, no steps '
      'to train, checkpoint step 300 of best/ already evaluated')
  latest = policy.Candidate(policy.LATEST, 400, 'why')
  assert policy.plan_round(FP, True, 400, _decided(300), budget,
                           latest) == policy.Plan(build=False, train_steps=0)
  # The budget still counts from the latest checkpoint.
  assert policy.plan_round(FP, True, 400, _decided(300), BUDGET,
                           best) == policy.Plan(build=False, train_steps=1000)
  none_yet = policy.Candidate(policy.BEST, None, 'why')
  assert policy.plan_round(FP, True, 400, _decided(300), budget,
                           none_yet).message == (
                               'data unchanged, no steps to train and no '
                               'checkpoint in best/ yet')


# ---------------------------------------------------------------------------
# choose_candidate: best/'s checkpoint or the latest.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize('setting, validating, best, source, step, why', [
    ('auto', True, 300, 'best', 300, 'training validates'),
    ('auto', True, None, 'latest', 400, 'best/ holds no checkpoint yet'),
    ('auto', False, 300, 'latest', 400, 'best/ is not kept up to date'),
    ('auto', False, None, 'latest', 400, 'no --eval_interval_steps in '
     'TRAIN_EXTRA_FLAGS'),
    ('best', True, 300, 'best', 300, 'CANDIDATE=best'),
    ('best', True, None, 'best', None, 'CANDIDATE=best'),
    ('latest', True, 300, 'latest', 400, 'CANDIDATE=latest')])
def test_choose_candidate(setting, validating, best, source, step, why):
  candidate = policy.choose_candidate(setting, validating, 400, best)
  assert (candidate.source, candidate.step) == (source, step)
  assert why in candidate.reason


def test_choose_candidate_refuses_an_unknown_setting():
  with pytest.raises(ValueError, match='auto, best, latest'):
    policy.choose_candidate('newest', True, 400, 300)


def test_validation_is_read_from_the_extra_flags():
  for flags in ('--eval_interval_steps=50', '--x=1 --eval_interval_steps 50',
                '-eval_interval_steps=5'):
    assert settings.validates_during_training(flags), flags
  for flags in ('', None, '--eval_split=val', '--eval_interval_steps_x=5',
                '--best_metric=miou'):
    assert not settings.validates_during_training(flags), flags


# ---------------------------------------------------------------------------
# training_outcome: the trainer's exit code, read through its own table.
# ---------------------------------------------------------------------------
def test_trainer_success_goes_on():
  assert policy.training_outcome(0, TRAINER_CODES, '/w/train') is None


def test_locked_trainer_is_busy():
  outcome = policy.training_outcome(175, TRAINER_CODES, '/w/train')
  assert (outcome.exit_code, outcome.status) == (policy.EXIT_BUSY, 'busy')
  assert '/w/train is locked' in outcome.message


@pytest.mark.parametrize('code, words', [
    (103, 'NaN loss'), (102, 'rejected its input (exit 102'),
    (101, 'exit status 101'), (99, 'exit status 99'),
    (143, 'exit status 143')])
def test_trainer_failures_fail_the_round(code, words):
  outcome = policy.training_outcome(code, TRAINER_CODES, '/w/train')
  assert (outcome.exit_code, outcome.status) == (policy.EXIT_FAILURE,
                                                 'failed')
  assert words in outcome.message


def test_trainer_failures_say_what_the_trainer_said():
  said = 'cannot save checkpoint /w/train/model.ckpt-9: no space left on device'
  outcome = policy.training_outcome(101, TRAINER_CODES, '/w/train', said)
  assert outcome.message == 'deeplab-train failed with exit status 101: ' + said
  outcome = policy.training_outcome(102, TRAINER_CODES, '/w/train', 'bad')
  assert outcome.message == 'deeplab-train rejected its input (exit 102): bad'


def test_codes_are_not_taken_by_value():
  # deeplab-train's real 75 and 3 mean nothing under another table.
  assert policy.training_outcome(75, TRAINER_CODES, 'd').status == 'failed'
  assert 'NaN' not in policy.training_outcome(3, TRAINER_CODES, 'd').message


@pytest.mark.slow  # imports TensorFlow, through the trainer's runtime
def test_policy_knows_the_trainers_statuses():
  # The trainer's own table (what cli/retrain.py hands the policy); the
  # command module itself is not imported here: its flags mirror the cron
  # script's variables and would clash with deeplab-train's in one process.
  from deeplab_train.runtime import result  # pylint: disable=g-import-not-at-top
  codes = result.EXIT_CODES
  assert set(policy.TRAINER_STATUSES) <= set(codes)
  assert policy.training_outcome(codes['locked'], codes, 'd').status == 'busy'
  assert policy.training_outcome(codes['ok'], codes, 'd') is None


# ---------------------------------------------------------------------------
# candidate_outcome: is there a new checkpoint to judge?
# ---------------------------------------------------------------------------
def test_candidate_outcomes():
  assert policy.candidate_outcome(10, FP, policy.State(), True, 't') is None
  unchanged = policy.candidate_outcome(10, FP, _decided(10), True, 't')
  assert (unchanged.exit_code, unchanged.status) == (0, 'unchanged')
  rebuilt = policy.candidate_outcome(None, FP, policy.State(), False, 't')
  assert (rebuilt.exit_code, rebuilt.status) == (0, 'rebuilt')
  no_checkpoint = policy.candidate_outcome(None, FP, policy.State(), True,
                                           '/w/train')
  assert no_checkpoint.status == 'failed'
  assert 'no checkpoint in /w/train' in no_checkpoint.message


def test_candidate_outcomes_of_best():
  unchanged = policy.candidate_outcome(10, FP, _decided(10), True, 't',
                                       policy.BEST)
  assert unchanged == policy.Outcome(0, 'unchanged', 'no new checkpoint '
                                     '(still checkpoint step 10 of best/); '
                                     'nothing to promote')
  # CANDIDATE=best, and the run ended before its first validation.
  no_best = policy.candidate_outcome(None, FP, policy.State(), True, 't',
                                     policy.BEST)
  assert (no_best.exit_code, no_best.status) == (0, 'unchanged')
  assert 'no checkpoint in best/' in no_best.message
  rebuilt = policy.candidate_outcome(None, FP, policy.State(), False, 't',
                                     policy.BEST)
  assert rebuilt.message == ('TFRecords rebuilt; no steps to train and no '
                             'checkpoint in best/ yet')


# ---------------------------------------------------------------------------
# judge: promote, keep, or measure the current model first.
# ---------------------------------------------------------------------------
def _current(miou=0.75, step=100, fingerprint=FP):
  return records.CurrentModel(global_step=step, miou=miou,
                             data_fingerprint=fingerprint)


def test_first_model_is_promoted():
  verdict = policy.judge(0.01, 2, FP, None, margin=0.005)
  assert verdict.action == policy.PROMOTE
  assert verdict.message == 'first model, mIoU 0.0100 (step 2)'
  assert verdict.current_miou is None


# Binary fractions, so that the boundary is exact.
@pytest.mark.parametrize('new, action', [
    (0.875, policy.PROMOTE),     # better
    (0.75, policy.PROMOTE),      # equal
    (0.5, policy.PROMOTE),       # dropped by exactly the margin
    (0.4921875, policy.KEEP),    # dropped by more than the margin
    (0.0, policy.KEEP)])
def test_promotion_rule(new, action):
  verdict = policy.judge(new, 200, FP, _current(0.75), margin=0.25)
  assert verdict.action == action
  assert verdict.current_miou == 0.75


def test_kept_model_message():
  verdict = policy.judge(0.7, 200, FP, _current(0.75), margin=0.005)
  assert verdict.action == policy.KEEP
  assert verdict.message == (
      "mIoU 0.7000 (step 200) is more than 0.005 below the current model's "
      '0.7500 (step 100): current model kept')


def test_promoted_model_message():
  verdict = policy.judge(0.8, 200, FP, _current(0.75), margin=0.005)
  assert verdict.message == 'mIoU 0.8000 (step 200) vs 0.7500 (step 100)'
  outcome = policy.conclusion(verdict.action, verdict.message, 'x-step200')
  assert outcome == policy.Outcome(
      0, 'promoted', 'mIoU 0.8000 (step 200) vs 0.7500 (step 100): '
      'exports/current -> x-step200')


def test_zero_margin_keeps_any_drop():
  assert policy.judge(0.7499, 200, FP, _current(0.75), 0.0).action == 'keep'


def test_current_model_at_the_same_step_is_kept():
  verdict = policy.judge(0.1, 100, FP, _current(0.75, step=100), 0.005)
  assert verdict.action == policy.KEEP
  assert 'already is checkpoint step 100' in verdict.message


def test_current_model_measured_on_other_data_is_measured_again():
  current = _current(0.99, fingerprint=NEW_FP)
  verdict = policy.judge(0.5, 200, FP, current, 0.005)
  assert verdict.action == policy.REEVALUATE
  assert 're-evaluating' in verdict.message
  # Then its new mIoU counts, not the stored 0.99.
  verdict = policy.judge(0.5, 200, FP, current, 0.005, remeasured_miou=0.25)
  assert (verdict.action, verdict.current_miou) == (policy.PROMOTE, 0.25)


def test_current_model_without_miou_is_measured_again():
  verdict = policy.judge(0.5, 200, FP, _current(None), 0.005)
  assert verdict.action == policy.REEVALUATE


def test_conclusion_of_a_kept_model_and_bad_verdicts():
  assert policy.conclusion('keep', 'why', None) == policy.Outcome(0, 'kept',
                                                                  'why')
  with pytest.raises(ValueError):
    policy.conclusion('reevaluate', 'why')


# ---------------------------------------------------------------------------
# Results and metrics.
# ---------------------------------------------------------------------------
def test_miou_of_eval_results():
  assert records.miou_of({'miou': 0.5, 'global_step': 3}, 'r.json') == 0.5
  assert records.miou_of({'miou': 1}, 'r.json') == 1.0
  for bad in ({}, {'miou': None}, {'miou': 'high'}, {'miou': True},
              {'miou': float('nan')}, []):
    with pytest.raises(policy.RoundError, match='no numeric miou in r.json'):
      records.miou_of(bad, 'r.json')


def test_export_metrics_are_read_back():
  metrics = records.export_metrics(0.5, 12, FP, 'val', '2024-01-01T02:30:00')
  assert list(metrics) == ['miou', 'global_step', 'data_fingerprint',
                           'eval_split', 'promoted_at']
  assert records.CurrentModel.from_metrics(metrics) == _current(0.5, 12)
  assert records.CurrentModel.from_metrics(
      {'miou': 'x', 'global_step': '12'}) == records.CurrentModel()


def test_checkpoint_names():
  assert records.checkpoint_step('/w/train/model.ckpt-1234') == 1234
  assert records.checkpoint_step('/w/train/model.ckpt') == 0
  assert records.checkpoint_step('') is None
  assert records.checkpoint_state('/w/train/model.ckpt-7') == (
      'model_checkpoint_path: "model.ckpt-7"\n'
      'all_model_checkpoint_paths: "model.ckpt-7"\n')


# ---------------------------------------------------------------------------
# Housekeeping and the summary.
# ---------------------------------------------------------------------------
def test_to_prune_keeps_the_newest_and_the_protected():
  names = ['20240103-000000-step30', '20240101-000000-step10',
           '20240102-000000-step20', '20240104-000000-step40']
  assert policy.to_prune(names, 2) == ['20240102-000000-step20',
                                       '20240101-000000-step10']
  assert policy.to_prune(names, 1, protected='20240102-000000-step20') == [
      '20240103-000000-step30', '20240101-000000-step10']
  assert policy.to_prune(names, 0, protected=names[0]) == [
      '20240104-000000-step40', '20240102-000000-step20',
      '20240101-000000-step10']
  assert policy.to_prune(names, 9) == []


def test_summary_line():
  line = records.summary(0, 'kept', '/w/logs/cron-1.log', message='a "b" \\c',
                        global_step=6, miou=0.25, current_miou=1.0)
  assert line == ('{"status": "kept", "exit_code": 0, "message": '
                  '"a \\"b\\" \\\\c", "log": "/w/logs/cron-1.log", '
                  '"global_step": 6, "miou": 0.25, "current_miou": 1.0}')
  assert '\n' not in line
  line = records.summary(0, 'kept', 'l', global_step=6,
                         candidate_source='best', candidate_reason='why')
  assert json.loads(line) == {'status': 'kept', 'exit_code': 0, 'log': 'l',
                              'global_step': 6, 'candidate_source': 'best',
                              'candidate_reason': 'why'}
  # An unexpected error has no message; facts not known are left out.
  assert json.loads(records.summary(1, 'failed', 'l')) == {
      'status': 'failed', 'exit_code': 1, 'log': 'l'}


def test_busy_rounds_leave_last_run_alone():
  assert not records.keeps_summary('busy')
  for status in ('promoted', 'kept', 'unchanged', 'rebuilt', 'nothing_to_do',
                 'failed'):
    assert records.keeps_summary(status)


def test_script_exit_codes_agree_with_the_policy(repo_dir):
  script = (repo_dir / 'scripts' / 'cron_retrain.sh').read_text()
  codes = dict(re.findall(r'\b(EXIT_[A-Z_]+)=(\d+)', script))
  assert codes == {'EXIT_FAILURE': str(policy.EXIT_FAILURE),
                   'EXIT_BUSY': str(policy.EXIT_BUSY)}


# ---------------------------------------------------------------------------
# The script's settings and the data folder.
# ---------------------------------------------------------------------------
GOOD_SETTINGS = dict(DATA_DIR='d', WORK_DIR='w', NUM_CLASSES='21',
                     IGNORE_LABEL='255', NUM_SHARDS='4', STEPS_PER_RUN='0',
                     MAX_TOTAL_STEPS='1', MAX_RUN_SECONDS='14400',
                     KEEP_EXPORTS='5', KEEP_LOGS='30',
                     TRAIN_ONLY_ON_NEW_DATA='0', MIOU_MARGIN='.005',
                     CANDIDATE='auto', TRAIN_EXTRA_FLAGS='',
                     DATA_LAYOUT='voc')


@pytest.mark.parametrize('name, value, message', [
    ('DATA_DIR', '', '--data_dir (or DATA_DIR) is required (see -h)'),
    ('WORK_DIR', '', '--work_dir (or WORK_DIR) is required (see -h)'),
    ('NUM_SHARDS', '-1', "NUM_SHARDS must be a non-negative integer, got '-1'"),
    ('KEEP_LOGS', '3.0', "KEEP_LOGS must be a non-negative integer, got '3.0'"),
    ('MAX_TOTAL_STEPS', '0', 'MAX_TOTAL_STEPS must be at least 1'),
    ('MAX_RUN_SECONDS', '0', 'MAX_RUN_SECONDS must be at least 1'),
    ('NUM_SHARDS', '0', 'NUM_SHARDS must be at least 1'),
    ('TRAIN_ONLY_ON_NEW_DATA', 'yes', 'TRAIN_ONLY_ON_NEW_DATA must be 0 or 1'),
    ('MIOU_MARGIN', '-0.1', "--margin must be a non-negative number, got "
     "'-0.1'"),
    ('MIOU_MARGIN', '1e-3', "--margin must be a non-negative number, got "
     "'1e-3'"),
    ('CANDIDATE', 'newest', "--candidate (or CANDIDATE) must be auto, best "
     "or latest, got 'newest'"),
    ('CANDIDATE', '', "--candidate (or CANDIDATE) must be auto, best or "
     "latest, got ''"),
    ('CANDIDATE', 'best', 'CANDIDATE=best needs validation during training, '
     'which keeps best/: add --eval_interval_steps=N to TRAIN_EXTRA_FLAGS'),
    ('DATA_LAYOUT', 'ade20k', "DATA_LAYOUT must be voc or cityscapes, got "
     "'ade20k'")])
def test_bad_settings(name, value, message):
  assert settings.problem(GOOD_SETTINGS) is None
  assert settings.problem(dict(GOOD_SETTINGS, **{name: value})) == message
  assert set(GOOD_SETTINGS) == set(settings.NAMES)


def test_good_candidate_settings():
  for candidate in ('auto', 'latest', 'best'):
    assert settings.problem(dict(
        GOOD_SETTINGS, CANDIDATE=candidate,
        TRAIN_EXTRA_FLAGS='--eval_interval_steps=100')) is None
  assert settings.problem(dict(GOOD_SETTINGS, CANDIDATE='latest')) is None


def _voc_folder(root):
  for sub in ('JPEGImages', 'SegmentationClass', 'ImageSets/Segmentation'):
    (root / sub).mkdir(parents=True)
  (root / 'JPEGImages' / 'a.jpg').write_bytes(b'jpeg')
  (root / 'ImageSets/Segmentation/train.txt').write_text('a\n')
  return data_folder.Layout('JPEGImages', 'SegmentationClass',
                            'ImageSets/Segmentation', ('train', 'val'))


def test_data_folder_problems(tmp_path):
  root = tmp_path / 'data'
  layout = _voc_folder(root)
  assert data_folder.problem(str(root), layout) == (
      '%s/ImageSets/Segmentation/val.txt is missing or empty' % root)
  (root / 'ImageSets/Segmentation/val.txt').write_text('a\n')
  assert data_folder.problem(str(root), layout) is None
  (root / 'SegmentationClass').rmdir()
  assert data_folder.problem(str(root), layout) == (
      '%s/SegmentationClass is missing (expected VOC layout: JPEGImages, '
      'SegmentationClass, ImageSets/Segmentation; see -h)' % root)
  assert 'is not a folder' in data_folder.problem(str(tmp_path / 'x'), layout)


def test_cityscapes_data_folder_problems(tmp_path):
  root = tmp_path / 'cityscapes'
  for folder in ('leftImg8bit', 'gtFine'):
    for split in ('train', 'val'):
      (root / folder / split / 'aachen').mkdir(parents=True)
  layout = data_folder.Layout('JPEGImages', 'SegmentationClass',
                              'ImageSets/Segmentation', ('train', 'val'),
                              kind='cityscapes')
  assert data_folder.problem(str(root), layout) is None
  (root / 'gtFine' / 'val' / 'aachen').rmdir()
  (root / 'gtFine' / 'val').rmdir()
  assert data_folder.problem(str(root), layout) == (
      '%s/gtFine/val is missing (expected a Cityscapes root: leftImg8bit/ '
      'and gtFine/, each with <split>/<city>/ folders for train and val; '
      'see -h)' % root)
  assert data_folder.problem(
      str(root), dataclasses.replace(layout, splits=('train', 'test'))) == (
          "DATA_LAYOUT=cityscapes converts the train and val splits: "
          "TRAIN_SPLIT and EVAL_SPLIT must be one of them, got 'test'")


def test_fingerprint_is_the_one_the_shell_computed(tmp_path):
  # Rounds of earlier versions stored this shell pipeline's value: the same
  # folder must keep its fingerprint, or an upgrade rebuilds and retrains.
  root = tmp_path / 'data'
  _voc_folder(root)
  (root / '.hidden').write_text('x')
  os.utime(root / '.hidden', ns=(0, 1_500_000_123))
  (tmp_path / 'elsewhere').mkdir()
  (tmp_path / 'elsewhere' / 'b.png').write_bytes(b'png!')
  (root / 'SegmentationClass' / 'linked').symlink_to(tmp_path / 'elsewhere')
  (root / 'dangling').symlink_to(tmp_path / 'nowhere')
  conversion = ['JPEGImages', 'jpg', '21', '']
  shell = subprocess.run(
      ['bash', '-c', 'cd "$1" && shift && { find -L . -type f -printf '
       '"%P\\t%s\\t%T@\\n" | LC_ALL=C sort; printf "settings\\t%s\\n" '
       '"$@"; } | sha256sum | cut -d " " -f 1', 'fp', str(root)] + conversion,
      capture_output=True, text=True, check=True).stdout.strip()
  assert data_folder.fingerprint(str(root), conversion) == shell
  assert data_folder.fingerprint(str(root), conversion[:3] + ['x']) != shell
  (root / 'JPEGImages' / 'a.jpg').write_bytes(b'jpeg2')
  assert data_folder.fingerprint(str(root), conversion) != shell


def test_fingerprint_refuses_a_link_loop(tmp_path):
  (tmp_path / 'loop').symlink_to(tmp_path)
  with pytest.raises(policy.RoundError, match='symbolic link loop'):
    data_folder.fingerprint(str(tmp_path), [])


def test_names_in_lists_what_may_be_pruned(tmp_path):
  for name in ('20240101-000000-step5', '20240102-000000-step9', '.tmp-x'):
    (tmp_path / name).mkdir()
  (tmp_path / 'current').symlink_to('20240102-000000-step9')
  (tmp_path / 'cron-1.log').write_text('')
  (tmp_path / 'cron-2.log').mkdir()
  assert sorted(state.names_in(tmp_path, '[0-9]*-step*', state.FOLDERS)) == [
      '20240101-000000-step5', '20240102-000000-step9']
  assert state.names_in(tmp_path, 'cron-*.log', state.FILES) == ['cron-1.log']
  assert sorted(state.names_in(tmp_path, '*', state.ANY)) == [
      '20240101-000000-step5', '20240102-000000-step9', 'cron-1.log',
      'cron-2.log', 'current']


# ---------------------------------------------------------------------------
# state.py and the command the script asks.
# ---------------------------------------------------------------------------
def test_state_round_trip(tmp_path):
  assert state.load(tmp_path) == policy.State()
  state.record(tmp_path, state.BUILT, FP)
  state.record_decision(tmp_path, 7, FP)
  assert (tmp_path / 'decided').read_text() == '7 %s\n' % FP
  assert state.load(tmp_path) == policy.State(
      built=FP, decided=policy.decision_key(7, FP))


def test_current_model_is_read_through_the_link(tmp_path):
  link = tmp_path / 'current'
  assert state.read_current_model(str(link)) is None
  export = tmp_path / '20240101-000000-step5'
  export.mkdir()
  link.symlink_to(export.name)
  with pytest.raises(policy.RoundError, match='metrics.json is missing'):
    state.read_current_model(str(link))
  state.write_metrics(str(export / 'metrics.json'),
                      records.export_metrics(0.5, 5, FP, 'val', 'now'))
  assert state.read_current_model(str(link)) == _current(0.5, 5)
  with pytest.raises(policy.RoundError, match='deeplab-eval wrote no'):
    state.read_miou(str(tmp_path / 'absent.json'))


def _ask(*args, no_room=False):
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.retrain'] + [str(a) for a in args],
      capture_output=True, text=True, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
      preexec_fn=fake_voc.no_room_to_write if no_room else None)
  return proc


def test_command_answers_key_value_lines(tmp_path):
  (tmp_path / 'new.json').write_text('{"miou": 0.5}')
  proc = _ask('judge', '--fingerprint', FP, '--checkpoint_step=3',
              '--new_result', tmp_path / 'new.json', '--current_export',
              tmp_path / 'current', '--margin=0.005', '--split=val')
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      'summary.miou=0.5', 'log=checkpoint step 3: mIoU 0.5000 on val',
      'action=promote', 'message=first model, mIoU 0.5000 (step 3)']
  # A missing flag is a usage error (exit 2), not an answer.
  proc = _ask('judge', '--fingerprint', FP)
  assert proc.returncode == 2 and '--checkpoint_step' in proc.stderr


def test_command_summary_writes_last_run_unless_busy(tmp_path):
  last_run = tmp_path / 'last_run.json'
  proc = _ask('summary', '--exit_code=75', '--status=busy', '--message=m',
              '--log_file=l', '--last_run', last_run)
  assert json.loads(proc.stdout)['status'] == 'busy'
  assert not last_run.exists()
  proc = _ask('summary', '--exit_code=0', '--status=promoted', '--message=m',
              '--log_file=l', '--last_run', last_run, '--global_step=2',
              '--miou=0.125')
  assert proc.returncode == 0, proc.stderr
  assert json.loads(last_run.read_text()) == json.loads(proc.stdout) == {
      'status': 'promoted', 'exit_code': 0, 'message': 'm', 'log': 'l',
      'global_step': 2, 'miou': 0.125}


def test_command_summary_removes_a_last_run_it_cannot_replace(tmp_path):
  """A round that cannot write last_run.json (a full disk) left the one of
  an earlier round, which could say it promoted."""
  last_run = tmp_path / 'last_run.json'
  last_run.write_text('{"status": "promoted", "exit_code": 0}\n')
  proc = _ask('summary', '--exit_code=1', '--status=failed', '--message=m',
              '--log_file=l', '--last_run', last_run, no_room=True)
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout)['status'] == 'failed'
  assert not last_run.exists()
  assert "removed the previous round's" in proc.stderr


def test_command_checks_settings():
  proc = _ask('check', '--', *('%s=%s' % kv for kv in GOOD_SETTINGS.items()))
  assert (proc.returncode, proc.stdout) == (0, ''), proc.stderr
  proc = _ask('check', '--', 'WORK_DIR=w', 'MIOU_MARGIN=x=y')
  assert proc.stdout == 'problem=--data_dir (or DATA_DIR) is required ' \
      '(see -h)\n'


def test_command_plans_a_round(tmp_path):
  data = tmp_path / 'data'
  _voc_folder(data)
  (data / 'ImageSets/Segmentation/val.txt').write_text('a\n')
  logs = tmp_path / 'logs'
  logs.mkdir()
  for i in (1, 2, 3):
    (logs / ('cron-2024010%d.log' % i)).write_text('')
  flags = ['--state_dir', tmp_path, '--data_dir', data, '--data_layout=voc',
           '--image_subdir=JPEGImages', '--label_subdir=SegmentationClass',
           '--list_subdir=ImageSets/Segmentation', '--train_split=train',
           '--eval_split=val', '--image_format=jpg', '--dataset_name=d',
           '--num_classes=21', '--ignore_label=255', '--num_shards=4',
           '--records', tmp_path / 'tfrecord', '--candidate=auto',
           '--steps_per_run=5',
           '--max_total_steps=100', '--log_folder', logs,
           '--log_file', logs / 'cron-20240103.log', '--keep_logs=1']
  fingerprint = data_folder.fingerprint(str(data), [
      'JPEGImages', 'SegmentationClass', 'ImageSets/Segmentation', 'jpg', 'd',
      '21', '255', '4', ''])
  proc = _ask('plan', '--checkpoint=/w/train/model.ckpt-98', *flags)
  assert proc.returncode == 0, proc.stderr
  removed = [str(logs / ('cron-2024010%d.log' % i)) for i in (2, 1)]
  assert proc.stdout.splitlines() == [
      'log=removing old %s' % removed[0], 'remove=%s' % removed[0],
      'log=removing old %s' % removed[1], 'remove=%s' % removed[1],
      'round.fingerprint=%s' % fingerprint, 'round.checkpoint_step=98',
      'build=1', 'train_steps=2']
  # The same folder read as a Cityscapes root: its own check and settings.
  proc = _ask('plan', *flags, '--data_layout=cityscapes')
  assert proc.stdout.splitlines()[-1] == (
      'message=%s/leftImg8bit/train is missing (expected a Cityscapes root: '
      'leftImg8bit/ and gtFine/, each with <split>/<city>/ folders for train '
      'and val; see -h)' % data)
  for folder in ('leftImg8bit', 'gtFine'):
    for split in ('train', 'val'):
      (data / folder / split).mkdir(parents=True)
  proc = _ask('plan', *flags, '--data_layout=cityscapes')
  assert proc.returncode == 0, proc.stderr
  assert 'round.fingerprint=%s' % data_folder.fingerprint(str(data), [
      'layout', 'cityscapes', 'd', '21', '255', '4', '']) in proc.stdout
  # A data folder without its lists ends the round (after the log pruning).
  (data / 'ImageSets/Segmentation/val.txt').unlink()
  proc = _ask('plan', *flags)
  assert proc.stdout.splitlines()[-3:] == [
      'exit_code=1', 'status=failed',
      'message=%s/ImageSets/Segmentation/val.txt is missing or empty' % data]


def test_command_candidate_and_conclusion(tmp_path):
  exports = tmp_path / 'exports'
  for name in ('20240101-000000-step2', '20240102-000000-step4'):
    (exports / name).mkdir(parents=True)
  round_flags = ['--state_dir', tmp_path, '--fingerprint', FP,
                 '--candidate=auto']
  proc = _ask('candidate', '--checkpoint=/w/train/model.ckpt-4',
              '--trainer_logdir=/w/train', *round_flags)
  why = ('training does not validate (no --eval_interval_steps in '
         'TRAIN_EXTRA_FLAGS)')
  assert proc.stdout.splitlines() == [
      'log=candidate: checkpoint step 4, /w/train/model.ckpt-4: ' + why,
      'summary.candidate_source=latest', 'summary.candidate_reason=' + why,
      'checkpoint=/w/train/model.ckpt-4', 'round.checkpoint_step=4',
      'summary.global_step=4']
  proc = _ask('conclude', '--checkpoint_step=4', '--verdict=promote',
              '--message=m', '--export=20240102-000000-step4',
              '--exports_dir', exports, '--keep_exports=1', *round_flags)
  old = exports / '20240101-000000-step2'
  assert proc.stdout.splitlines() == [
      'log=removing old %s' % old, 'remove=%s' % old, 'exit_code=0',
      'status=promoted', 'message=m: exports/current -> 20240102-000000-step4']
  # The same checkpoint on the same data is not judged twice.
  proc = _ask('candidate', '--checkpoint=/w/train/model.ckpt-4',
              '--trainer_logdir=/w/train', *round_flags)
  assert proc.stdout.splitlines()[-3:-1] == ['exit_code=0', 'status=unchanged']


def test_command_that_cannot_write_its_state_names_the_file(tmp_path):
  """A full disk (or a read-only state/): the policy stopped with a
  traceback in the log, which the full disk could cut short, and the
  summary said only 'the retraining policy failed on ... (see the log)'."""
  proc = _ask('conclude', '--checkpoint_step=4', '--verdict=keep',
              '--message=m', '--state_dir', tmp_path, '--fingerprint', FP,
              no_room=True)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      'exit_code=1', 'status=failed',
      "message=the retraining policy could not keep its answer to "
      "'conclude': cannot write %s: File too large; free space on that "
      'disk or make it writable' % (tmp_path / 'decided')]


def test_command_candidate_from_best(tmp_path):
  flags = ['--state_dir', tmp_path, '--fingerprint', FP,
           '--trainer_logdir=/w/train', '--checkpoint=/w/train/model.ckpt-9',
           '--best_checkpoint=/w/train/best/model.ckpt-6',
           '--train_extra_flags=--eval_interval_steps=3 --best_metric=miou']
  proc = _ask('candidate', '--candidate=auto', *flags)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0] == (
      'log=candidate: checkpoint step 6 of best/, '
      '/w/train/best/model.ckpt-6 (the latest is step 9): training validates (--eval_interval_steps) '
      'and best/ holds its best checkpoint')
  assert lines[1:] == [
      'summary.candidate_source=best', lines[2],
      'checkpoint=/w/train/best/model.ckpt-6', 'round.checkpoint_step=6',
      'summary.global_step=6']
  proc = _ask('candidate', '--candidate=latest', *flags)
  assert 'checkpoint=/w/train/model.ckpt-9' in proc.stdout.splitlines()
  # CANDIDATE=best with an empty best/: nothing to judge.
  proc = _ask('candidate', '--candidate=best',
              *(flags[:-2] + ['--best_checkpoint=', flags[-1]]))
  lines = proc.stdout.splitlines()
  assert lines[0] == ('log=candidate: none, best/ holds no checkpoint '
                      '(CANDIDATE=best)')
  assert lines[-3:-1] == ['exit_code=0', 'status=rebuilt']
  assert not [line for line in lines if line.startswith('checkpoint=')]
  # The summary says which one and why.
  proc = _ask('summary', '--exit_code=0', '--status=kept', '--log_file=l',
              '--global_step=6', '--candidate_source=best',
              '--candidate_reason=because')
  assert json.loads(proc.stdout)['candidate_source'] == 'best'
  assert json.loads(proc.stdout)['candidate_reason'] == 'because'


def test_a_signal_ends_a_question():
  """The commands' start kept a SIGTERM for work that this module's
  questions never begin: one ran to its end and exited 0."""
  script = '''
import os, signal, sys
from deeplab_train.cli import retrain
def signalled(answer, args):
  os.kill(os.getpid(), signal.SIGTERM)
  answer.append('{"ran": "to its end"}')
retrain._QUESTIONS['check'] = (signalled,) + retrain._QUESTIONS['check'][1:]
sys.argv = ['retrain', 'check']
retrain.run()
'''
  proc = subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == -15, (proc.returncode, proc.stdout,
                                  proc.stderr[-2000:])
  assert 'to its end' not in proc.stdout
