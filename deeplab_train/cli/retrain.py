"""python -m deeplab_train.retrain: the decisions of one retraining round.

    python -m deeplab_train.retrain QUESTION --flag=value ...

scripts/cron_retrain.sh runs the commands of a round, moves the files and
holds the lock (docs/cron.md); it asks this command everything else, in
this order: check, plan, [built], candidate, judge (twice when the current
model is measured again), [describe_export], conclude, and summary at the
end. The rules are in deeplab_train/retrain. Each question prints its
answer on stdout, one key=value per line:

  exit_code, status, message  the round ends here (the script prints the
                              summary and exits with exit_code)
  round.KEY, summary.KEY      a fact the script passes back as --KEY=VALUE
                              with every later question; summary.* facts
                              are also in the round's JSON summary
  log                         a line for the round's log
  remove                      a path the script deletes (old logs, exports,
                              records)
  anything else               the decision, as listed below

Questions (and the flags each needs, besides the facts):
  check      problem=MESSAGE for the first bad setting among the NAME=VALUE
             arguments (after --; settings.NAMES), nothing when all are fine.
  plan       removes old logs; checks the data folder; round.fingerprint,
             round.checkpoint_step, build=0|1 and train_steps=N, or the end
             (nothing to do, or a bad data folder). --state_dir --data_dir
             --data_layout --image_subdir --label_subdir --list_subdir
             --train_split --eval_split --image_format --dataset_name
             --num_classes --ignore_label --num_shards [--build_extra_flags]
             --records [--checkpoint] [--best_checkpoint] --candidate
             [--train_extra_flags] --steps_per_run --max_total_steps
             [--train_only_on_new_data] --log_folder --log_file --keep_logs
  built      stores --fingerprint as the data the TFRecords in use were
             built from; removes the other records. --state_dir
             --records_dir --records_in_use
  candidate  after training (--trainer_exit_code, read through the trainer's
             EXIT_CODES in deeplab_train/runtime/result.py) or without it:
             chooses by --candidate (CANDIDATE) between --checkpoint (the
             latest) and --best_checkpoint (best/'s): checkpoint=PREFIX of
             the one taken, a log line, summary.candidate_source and
             summary.candidate_reason, round.checkpoint_step and
             summary.global_step of it, and the end unless it is to be
             judged. --state_dir [--checkpoint] [--best_checkpoint]
             --candidate [--train_extra_flags] [--trainer_exit_code]
             [--trainer_message] --trainer_logdir
  judge      action=promote|keep|reevaluate and message, from the new
             checkpoint's eval result and the current export's metrics.json
             (or --current_result, after action=reevaluate).
             --checkpoint_step --new_result --current_export --margin
             --split [--current_result]
  describe_export  writes metrics.json and checkpoint/checkpoint into the
             new export --export_dir. --checkpoint --new_result --split
  conclude   records the verdict on the checkpoint; removes old exports
             after a promotion; the end (promoted or kept). --state_dir
             --checkpoint_step --verdict=promote|keep --message [--export
             --exports_dir --keep_exports]
  summary    prints the round's JSON line, and writes it to --last_run
             unless the round was busy. --exit_code --status --log_file
             [--message --last_run --global_step --miou --current_miou
             --candidate_source --candidate_reason]
The facts: --fingerprint, --checkpoint_step, --global_step, --miou,
--current_miou, --candidate_source, --candidate_reason.

Exit codes: 0 answered (the answer may be that the round failed), 1
unexpected error, 2 bad flags or question.
"""
import os

from absl import flags
from absl import logging

from deeplab_train import atomic
from deeplab_train.cli import app
from deeplab_train.retrain import data_folder
from deeplab_train.retrain import policy
from deeplab_train.retrain import records
from deeplab_train.retrain import settings
from deeplab_train.retrain import state

FLAGS = flags.FLAGS
COMMAND = 'python -m deeplab_train.retrain'

# The round's facts.
flags.DEFINE_string('state_dir', None, "The work folder's state/.")
flags.DEFINE_string('fingerprint', None, "The data folder's fingerprint.")
flags.DEFINE_integer('checkpoint_step', None, 'Global step of the '
                     'checkpoint judged (the latest one until the candidate '
                     'is chosen); unset when there is none.', lower_bound=0)
flags.DEFINE_string('checkpoint', None, 'The latest checkpoint prefix; '
                    'unset or empty when there is none.')
# plan, candidate: which checkpoint the round judges.
flags.DEFINE_string('best_checkpoint', None, "The checkpoint prefix in the "
                    "train logdir's best/; unset or empty when there is none.")
flags.DEFINE_enum('candidate', None, list(policy.CANDIDATE_SETTINGS),
                  'CANDIDATE.')
flags.DEFINE_string('train_extra_flags', '', 'TRAIN_EXTRA_FLAGS.')
# plan: the data folder and its conversion settings, each named after the
# script's variable (--image_subdir is IMAGE_SUBDIR); passed as the strings
# the script has, since the fingerprint hashes them as they are.
DATA_SETTINGS = ('data_dir', 'image_subdir', 'label_subdir', 'list_subdir',
                 'train_split', 'eval_split', 'image_format', 'dataset_name',
                 'num_classes', 'ignore_label', 'num_shards')
for _name in DATA_SETTINGS:
  flags.DEFINE_string(_name, None, _name.upper() + '.')
flags.DEFINE_enum('data_layout', None, list(data_folder.LAYOUTS),
                  'DATA_LAYOUT.')
flags.DEFINE_string('build_extra_flags', '', 'BUILD_EXTRA_FLAGS.')
# plan: records, budget, logs.
flags.DEFINE_string('records', None, 'The TFRecords in use (the tfrecord '
                    'link).')
flags.DEFINE_integer('steps_per_run', None, 'STEPS_PER_RUN.', lower_bound=0)
flags.DEFINE_integer('max_total_steps', None, 'MAX_TOTAL_STEPS.',
                     lower_bound=1)
flags.DEFINE_boolean('train_only_on_new_data', False,
                     'TRAIN_ONLY_ON_NEW_DATA.')
flags.DEFINE_string('log_folder', None, 'LOG_DIR.')
flags.DEFINE_integer('keep_logs', None, 'KEEP_LOGS.', lower_bound=0)
# built
flags.DEFINE_string('records_dir', None, 'The tfrecords/ folder.')
flags.DEFINE_string('records_in_use', None,
                    'The folder of tfrecords/ the tfrecord link points to.')
# candidate
flags.DEFINE_integer('trainer_exit_code', None,
                     "deeplab-train's exit status, when the round trained.")
flags.DEFINE_string('trainer_logdir', None, "deeplab-train's logdir.")
flags.DEFINE_string('trainer_message', None,
                    "The message of deeplab-train's JSON result line.")
# judge, describe_export
flags.DEFINE_string('new_result', None,
                    "deeplab-eval's result JSON for the new checkpoint.")
flags.DEFINE_string('current_result', None,
                    "deeplab-eval's result JSON for the current model, "
                    'measured again in this round.')
flags.DEFINE_string('current_export', None, 'The exports/current symlink.')
flags.DEFINE_float('margin', None, 'MIOU_MARGIN: the mIoU drop allowed.',
                   lower_bound=0.0)
flags.DEFINE_string('split', None, 'The split the mIoU was measured on.')
flags.DEFINE_string('export_dir', None, 'The new export folder.')
# conclude
flags.DEFINE_enum('verdict', None, [policy.PROMOTE, policy.KEEP],
                  'What was done with the checkpoint.')
flags.DEFINE_string('export', None,
                    'The export exports/current points to after promotion.')
flags.DEFINE_string('exports_dir', None, 'The exports/ folder.')
flags.DEFINE_integer('keep_exports', None, 'KEEP_EXPORTS.', lower_bound=0)
# summary (and conclude's --message)
flags.DEFINE_integer('exit_code', None, "The round's exit code.")
flags.DEFINE_string('status', None, "The round's status word.")
flags.DEFINE_string('message', None, 'What happened.')
flags.DEFINE_string('log_file', None, "The round's log file.")
flags.DEFINE_string('last_run', None, 'last_run.json, to write.')
flags.DEFINE_integer('global_step', None, 'The checkpoint judged.')
flags.DEFINE_float('miou', None, "The checkpoint's mIoU.")
flags.DEFINE_float('current_miou', None,
                   "The current model's mIoU it was compared with.")
flags.DEFINE_enum('candidate_source', None, [policy.BEST, policy.LATEST],
                  'Where the checkpoint judged was taken from.')
flags.DEFINE_string('candidate_reason', None, 'Why it was taken from there.')


def _end(outcome):
  """The answer lines that end the round with `outcome`."""
  return [('exit_code', outcome.exit_code), ('status', outcome.status),
          ('message', outcome.message)]


def _removals(answer, folder, names, keep, protected):
  """Answers `remove` (and logs it) for the names to_prune() chooses."""
  for name in policy.to_prune(names, keep, protected):
    path = os.path.join(folder, name)
    answer.extend([('log', 'removing old %s' % path), ('remove', path)])


def _check(answer, args):
  values = dict(arg.partition('=')[::2] for arg in args)
  problem = settings.problem(values)
  if problem:
    answer.append(('problem', problem))


def _data_layout():
  return data_folder.Layout(
      image_subdir=FLAGS.image_subdir, label_subdir=FLAGS.label_subdir,
      list_subdir=FLAGS.list_subdir,
      splits=(FLAGS.train_split, FLAGS.eval_split),
      kind=FLAGS.data_layout)


def _fingerprint():
  """The data folder's fingerprint, with the script's conversion settings
  (those of the VOC layout as they always were, so that its fingerprints
  stay the same)."""
  if FLAGS.data_layout == data_folder.VOC:
    source = (FLAGS.image_subdir, FLAGS.label_subdir, FLAGS.list_subdir,
              FLAGS.image_format)
  else:
    source = ('layout', FLAGS.data_layout)
  return data_folder.fingerprint(FLAGS.data_dir, source + (
      FLAGS.dataset_name, FLAGS.num_classes, FLAGS.ignore_label,
      FLAGS.num_shards, FLAGS.build_extra_flags))


def _choose_candidate():
  """(the policy.Candidate, its checkpoint prefix or None), by --candidate
  from --checkpoint and --best_checkpoint."""
  best = FLAGS.best_checkpoint or None
  candidate = policy.choose_candidate(
      FLAGS.candidate,
      settings.validates_during_training(FLAGS.train_extra_flags),
      records.checkpoint_step(FLAGS.checkpoint),
      records.checkpoint_step(best))
  if candidate.source == policy.BEST:
    return candidate, best
  return candidate, FLAGS.checkpoint or None


def _candidate_line(candidate, checkpoint):
  """The log line that says which checkpoint the round judges, and why."""
  if candidate.step is None:
    return 'candidate: none, %s (%s)' % (
        'best/ holds no checkpoint' if candidate.source == policy.BEST
        else 'no checkpoint', candidate.reason)
  latest = records.checkpoint_step(FLAGS.checkpoint)
  return 'candidate: %s, %s%s: %s' % (
      policy.describe_checkpoint(candidate.source, candidate.step),
      checkpoint,
      ' (the latest is step %d)' % latest
      if candidate.source == policy.BEST and latest is not None else '',
      candidate.reason)


def _plan(answer, unused_args):
  _removals(answer, FLAGS.log_folder,
            state.names_in(FLAGS.log_folder, 'cron-*.log', state.FILES),
            FLAGS.keep_logs, os.path.basename(FLAGS.log_file))
  problem = data_folder.problem(FLAGS.data_dir, _data_layout())
  if problem:
    raise policy.RoundError(problem)
  fingerprint = _fingerprint()
  step = records.checkpoint_step(FLAGS.checkpoint)
  answer.append(('round.fingerprint', fingerprint))
  if step is not None:
    answer.append(('round.checkpoint_step', step))
  budget = policy.Budget(steps_per_run=FLAGS.steps_per_run,
                         max_total_steps=FLAGS.max_total_steps,
                         only_on_new_data=FLAGS.train_only_on_new_data)
  candidate, _ = _choose_candidate()
  decision = policy.plan_round(fingerprint, state.records_ready(FLAGS.records),
                               step, state.load(FLAGS.state_dir), budget,
                               candidate)
  if isinstance(decision, policy.Outcome):
    answer.extend(_end(decision))
  else:
    answer.extend([('build', int(decision.build)),
                   ('train_steps', decision.train_steps)])


def _built(answer, unused_args):
  state.record(FLAGS.state_dir, state.BUILT, FLAGS.fingerprint)
  # Only the records in use are kept (older ones, and any left by a round
  # killed between their rename and the switch of the link).
  _removals(answer, FLAGS.records_dir,
            state.names_in(FLAGS.records_dir, '*', state.ANY), 0,
            FLAGS.records_in_use)


def trainer_exit_codes():
  """deeplab-train's exit code of each status, from the trainer itself."""
  # Imported here, not at the top: only a failed training needs it.
  from deeplab_train.runtime import result  # pylint: disable=g-import-not-at-top
  return result.EXIT_CODES


def _candidate(answer, unused_args):
  trained = FLAGS.trainer_exit_code is not None
  if trained:
    outcome = policy.training_outcome(
        FLAGS.trainer_exit_code, trainer_exit_codes(), FLAGS.trainer_logdir,
        FLAGS.trainer_message)
    if outcome is not None:
      answer.extend(_end(outcome))
      return
    state.record(FLAGS.state_dir, state.TRAINED, FLAGS.fingerprint)
  candidate, checkpoint = _choose_candidate()
  answer.extend([('log', _candidate_line(candidate, checkpoint)),
                 ('summary.candidate_source', candidate.source),
                 ('summary.candidate_reason', candidate.reason)])
  if candidate.step is not None:
    answer.extend([('checkpoint', checkpoint),
                   ('round.checkpoint_step', candidate.step),
                   ('summary.global_step', candidate.step)])
  outcome = policy.candidate_outcome(
      candidate.step, FLAGS.fingerprint, state.load(FLAGS.state_dir), trained,
      FLAGS.trainer_logdir, candidate.source)
  if outcome is not None:
    answer.extend(_end(outcome))


def _judge(answer, unused_args):
  miou = state.read_miou(FLAGS.new_result)
  answer.append(('summary.miou', miou))
  current = state.read_current_model(FLAGS.current_export)
  remeasured = None
  if FLAGS.current_result:
    remeasured = state.read_miou(FLAGS.current_result)
    answer.append(('log', 'the current model: mIoU %s on %s' % (
        policy.format_miou(remeasured), FLAGS.split)))
  else:
    answer.append(('log', 'checkpoint step %d: mIoU %s on %s' % (
        FLAGS.checkpoint_step, policy.format_miou(miou), FLAGS.split)))
  verdict = policy.judge(miou, FLAGS.checkpoint_step, FLAGS.fingerprint,
                         current, FLAGS.margin, remeasured)
  if verdict.current_miou is not None:
    answer.append(('summary.current_miou', verdict.current_miou))
  if verdict.action == policy.REEVALUATE:
    answer.append(('log', verdict.message))
  answer.extend([('action', verdict.action), ('message', verdict.message)])


def _describe_export(unused_answer, unused_args):
  metrics = records.export_metrics(
      state.read_miou(FLAGS.new_result),
      records.checkpoint_step(FLAGS.checkpoint), FLAGS.fingerprint,
      FLAGS.split, state.now_iso())
  state.write_metrics(os.path.join(FLAGS.export_dir, 'metrics.json'), metrics)
  state.write_checkpoint_state(os.path.join(FLAGS.export_dir, 'checkpoint'),
                               FLAGS.checkpoint)


def _conclude(answer, unused_args):
  if FLAGS.verdict == policy.PROMOTE:
    if not (FLAGS.export and FLAGS.exports_dir
            and FLAGS.keep_exports is not None):
      raise policy.RoundError('conclude --verdict=promote needs --export, '
                              '--exports_dir and --keep_exports')
    _removals(answer, FLAGS.exports_dir,
              state.names_in(FLAGS.exports_dir, '[0-9]*-step*',
                             state.FOLDERS),
              FLAGS.keep_exports, FLAGS.export)
  state.record_decision(FLAGS.state_dir, FLAGS.checkpoint_step,
                        FLAGS.fingerprint)
  answer.extend(_end(policy.conclusion(FLAGS.verdict, FLAGS.message,
                                       FLAGS.export)))


def _summary(unused_answer, unused_args):
  line = records.summary(FLAGS.exit_code, FLAGS.status, FLAGS.log_file,
                         message=FLAGS.message, global_step=FLAGS.global_step,
                         miou=FLAGS.miou, current_miou=FLAGS.current_miou,
                         candidate_source=FLAGS.candidate_source,
                         candidate_reason=FLAGS.candidate_reason)
  if FLAGS.last_run and records.keeps_summary(FLAGS.status):
    try:
      state.write_summary(FLAGS.last_run, line)
    except OSError as e:
      # The line on stdout still tells cron how the round went; an earlier
      # round's summary left in place would tell another story.
      logging.warning('could not write %s: %s', FLAGS.last_run, e)
      try:
        os.remove(FLAGS.last_run)
        logging.warning('removed the previous round\'s %s', FLAGS.last_run)
      except FileNotFoundError:
        pass
      except OSError as e:
        logging.warning('could not remove the previous round\'s %s either: '
                        '%s', FLAGS.last_run, e)
  print(line)


# name -> (handler(answer, args), the flags it needs, whether it takes args)
_QUESTIONS = {
    'check': (_check, (), True),
    'plan': (_plan, ('state_dir', 'data_layout') + DATA_SETTINGS + (
        'records', 'candidate', 'steps_per_run', 'max_total_steps',
        'log_folder', 'log_file', 'keep_logs'), False),
    'built': (_built, ('state_dir', 'fingerprint', 'records_dir',
                       'records_in_use'), False),
    'candidate': (_candidate, ('state_dir', 'fingerprint', 'candidate',
                               'trainer_logdir'), False),
    'judge': (_judge, ('fingerprint', 'checkpoint_step', 'new_result',
                       'current_export', 'margin', 'split'), False),
    'describe_export': (_describe_export, ('export_dir', 'checkpoint',
                                           'new_result', 'fingerprint',
                                           'split'), False),
    'conclude': (_conclude, ('state_dir', 'fingerprint', 'checkpoint_step',
                             'verdict', 'message'), False),
    'summary': (_summary, ('exit_code', 'status', 'log_file'), False),
}


def _usage_problem(argv):
  """What is wrong with the question and its flags, or None."""
  if len(argv) < 2 or argv[1] not in _QUESTIONS:
    return 'expected a question (%s), got %s' % (
        ', '.join(_QUESTIONS), ' '.join(argv[1:2]) or 'none')
  _, required, takes_args = _QUESTIONS[argv[1]]
  missing = ['--' + name for name in required if FLAGS[name].value is None]
  if missing:
    return '%s needs %s' % (argv[1], ' '.join(missing))
  if argv[2:] and not takes_args:
    return '%s takes no arguments, got %s' % (argv[1], ' '.join(argv[2:]))
  return None


def _print_answer(answer):
  for key, value in answer:
    # One line per key: the script reads the answer line by line.
    print('%s=%s' % (key, ' '.join(str(value).splitlines())))


def _unwritten(error):
  """'cannot write PATH: REASON' of an OSError."""
  if isinstance(error, atomic.OutputNotWrittenError) or not error.filename:
    return str(error)
  return 'cannot write %s: %s' % (error.filename,
                                  error.strerror or error)


def main(argv):
  problem = _usage_problem(argv)
  if problem:
    app.say('%s: %s (see --help)' % (COMMAND, problem))
    return app.EXIT_BAD_INPUT
  handler = _QUESTIONS[argv[1]][0]
  answer = []
  try:
    handler(answer, argv[2:])
  except policy.RoundError as e:
    answer.extend(_end(policy.failed(str(e))))
  except OSError as e:
    # Its state files on a full disk or a read-only folder: named in the
    # summary (a traceback in the log could be cut short by the full disk).
    answer.extend(_end(policy.failed(
        'the retraining policy could not keep its answer to %r: %s; free '
        'space on that disk or make it writable' % (argv[1], _unwritten(e)))))
  _print_answer(answer)
  return app.EXIT_OK


def run():
  # Its questions run outside app.run_body: a signal ends them as usual.
  app.start(COMMAND, main, __doc__, (__name__,), keep_signals=False)


if __name__ == '__main__':
  run()
