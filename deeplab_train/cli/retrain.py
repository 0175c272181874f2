"""python -m deeplab_train.retrain: the decisions of one retraining round.

    python -m deeplab_train.retrain SUBCOMMAND --flag=value ...

scripts/cron_retrain.sh runs the commands of a round (docs/cron.md) and asks
this command what to do between them; the rules are in
deeplab_train/retrain/policy.py. Each subcommand prints its answer on
stdout, one key=value per line:

  exit_code, status, message  the round ends here (the script prints the
                              summary and exits with exit_code)
  summary.KEY                 a fact for the round's JSON summary
  log                         a line for the round's log
  anything else               the decision, as listed below

Subcommands (and the flags each needs; --checkpoint_step is left out when
there is no checkpoint):
  plan       build=0|1 and train_steps=N, or the end (nothing to do).
             --state_dir --fingerprint [--checkpoint_step] --records_ready
             --steps_per_run --max_total_steps [--train_only_on_new_data]
  record     stores --fingerprint as the data the TFRecords were built
             from (--stage=built) or the trainer last saw (--stage=trained).
             --state_dir --fingerprint --stage
  trainer    the end when deeplab-train exited with --trainer_exit_code
             (read through the trainer's EXIT_CODES, in
             deeplab_train/runtime/result.py; imports TensorFlow).
             --trainer_exit_code --trainer_logdir
  candidate  summary.global_step, and the end unless the latest checkpoint
             is to be judged. --state_dir --fingerprint [--checkpoint_step]
             [--trained] --trainer_logdir
  judge      action=promote|keep|reevaluate and message, from the new
             checkpoint's eval result and the current export's metrics.json
             (or --current_result, after action=reevaluate).
             --fingerprint --checkpoint_step --new_result --current_export
             --margin --split [--current_result]
  metrics    writes --out, the metrics.json of a new export.
             --out --new_result --checkpoint_step --fingerprint --split
  conclude   records the verdict on the checkpoint; the end (promoted or
             kept). --state_dir --fingerprint --checkpoint_step
             --verdict=promote|keep --message [--export]
  prune      remove=NAME for each NAME argument (after --) beyond the
             newest --keep, never --protect. --keep [--protect]
  summary    prints the round's JSON line, and writes it to --last_run
             unless the round was busy. --exit_code --status --log_file
             [--message --last_run --global_step --miou --current_miou]

Exit codes: 0 answered (the answer may be that the round failed), 1
unexpected error, 2 bad flags or subcommand.
"""
import sys

from absl import flags
from absl import logging

from deeplab_train.cli import app
from deeplab_train.retrain import policy
from deeplab_train.retrain import state

FLAGS = flags.FLAGS
COMMAND = 'python -m deeplab_train.retrain'

# The round.
flags.DEFINE_string('state_dir', None, "The work folder's state/.")
flags.DEFINE_string('fingerprint', None, "The data folder's fingerprint.")
flags.DEFINE_integer('checkpoint_step', None, 'Global step of the latest '
                     'checkpoint; unset when there is none.', lower_bound=0)
# plan
flags.DEFINE_boolean('records_ready', None,
                     'Whether the TFRecords in use exist (dataset.json).')
flags.DEFINE_integer('steps_per_run', None, 'STEPS_PER_RUN.', lower_bound=0)
flags.DEFINE_integer('max_total_steps', None, 'MAX_TOTAL_STEPS.',
                     lower_bound=1)
flags.DEFINE_boolean('train_only_on_new_data', False,
                     'TRAIN_ONLY_ON_NEW_DATA.')
# record
flags.DEFINE_enum('stage', None, ['built', 'trained'],
                  'What --fingerprint is stored as.')
# trainer, candidate
flags.DEFINE_integer('trainer_exit_code', None,
                     "deeplab-train's exit status.")
flags.DEFINE_string('trainer_logdir', None, "deeplab-train's logdir.")
flags.DEFINE_boolean('trained', False, 'Whether the round ran deeplab-train.')
# judge, metrics
flags.DEFINE_string('new_result', None,
                    "deeplab-eval's result JSON for the new checkpoint.")
flags.DEFINE_string('current_result', None,
                    "deeplab-eval's result JSON for the current model, "
                    'measured again in this round.')
flags.DEFINE_string('current_export', None, 'The exports/current symlink.')
flags.DEFINE_float('margin', None, 'MIOU_MARGIN: the mIoU drop allowed.',
                   lower_bound=0.0)
flags.DEFINE_string('split', None, 'The split the mIoU was measured on.')
flags.DEFINE_string('out', None, 'The metrics.json to write.')
# conclude
flags.DEFINE_enum('verdict', None, [policy.PROMOTE, policy.KEEP],
                  'What was done with the checkpoint.')
flags.DEFINE_string('export', None,
                    'The export exports/current points to after promotion.')
# prune
flags.DEFINE_integer('keep', None, 'How many of the newest names to keep.',
                     lower_bound=0)
flags.DEFINE_string('protect', None, 'A name never removed.')
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


def _end(outcome):
  """The answer lines that end the round with `outcome`."""
  return [('exit_code', outcome.exit_code), ('status', outcome.status),
          ('message', outcome.message)]


def _budget():
  return policy.Budget(steps_per_run=FLAGS.steps_per_run,
                       max_total_steps=FLAGS.max_total_steps,
                       only_on_new_data=FLAGS.train_only_on_new_data)


def _plan(answer, unused_args):
  decision = policy.plan_round(FLAGS.fingerprint, FLAGS.records_ready,
                               FLAGS.checkpoint_step,
                               state.load(FLAGS.state_dir), _budget())
  if isinstance(decision, policy.Outcome):
    answer.extend(_end(decision))
  else:
    answer.extend([('build', int(decision.build)),
                   ('train_steps', decision.train_steps)])


def _record(unused_answer, unused_args):
  name = {'built': state.BUILT, 'trained': state.TRAINED}[FLAGS.stage]
  state.record(FLAGS.state_dir, name, FLAGS.fingerprint)


def trainer_exit_codes():
  """deeplab-train's exit code of each status, from the trainer itself."""
  # Imported here, not at the top: it imports TensorFlow, which takes
  # seconds, and the script asks only when training failed.
  from deeplab_train.runtime import result  # pylint: disable=g-import-not-at-top
  return result.EXIT_CODES


def _trainer(answer, unused_args):
  outcome = policy.training_outcome(FLAGS.trainer_exit_code,
                                    trainer_exit_codes(), FLAGS.trainer_logdir)
  if outcome is not None:
    answer.extend(_end(outcome))


def _candidate(answer, unused_args):
  if FLAGS.checkpoint_step is not None:
    answer.append(('summary.global_step', FLAGS.checkpoint_step))
  outcome = policy.candidate_outcome(
      FLAGS.checkpoint_step, FLAGS.fingerprint, state.load(FLAGS.state_dir),
      FLAGS.trained, FLAGS.trainer_logdir)
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


def _metrics(unused_answer, unused_args):
  metrics = policy.export_metrics(
      state.read_miou(FLAGS.new_result), FLAGS.checkpoint_step,
      FLAGS.fingerprint, FLAGS.split, state.now_iso())
  state.write_metrics(FLAGS.out, metrics)


def _conclude(answer, unused_args):
  if FLAGS.verdict == policy.PROMOTE and not FLAGS.export:
    raise policy.RoundError('conclude --verdict=promote needs --export')
  state.record_decision(FLAGS.state_dir, FLAGS.checkpoint_step,
                        FLAGS.fingerprint)
  answer.extend(_end(policy.conclusion(FLAGS.verdict, FLAGS.message,
                                       FLAGS.export)))


def _prune(answer, names):
  for name in policy.to_prune(names, FLAGS.keep, FLAGS.protect or None):
    answer.append(('remove', name))


def _summary(unused_answer, unused_args):
  line = policy.summary(FLAGS.exit_code, FLAGS.status, FLAGS.log_file,
                        message=FLAGS.message, global_step=FLAGS.global_step,
                        miou=FLAGS.miou, current_miou=FLAGS.current_miou)
  if FLAGS.last_run and policy.keeps_summary(FLAGS.status):
    try:
      state.write_summary(FLAGS.last_run, line)
    except OSError as e:
      # The line on stdout still tells cron how the round went.
      logging.warning('could not write %s: %s', FLAGS.last_run, e)
  print(line)


# name -> (handler(answer, args), the flags it needs, whether it takes args)
_SUBCOMMANDS = {
    'plan': (_plan, ('state_dir', 'fingerprint', 'records_ready',
                     'steps_per_run', 'max_total_steps'), False),
    'record': (_record, ('state_dir', 'fingerprint', 'stage'), False),
    'trainer': (_trainer, ('trainer_exit_code', 'trainer_logdir'), False),
    'candidate': (_candidate, ('state_dir', 'fingerprint', 'trainer_logdir'),
                  False),
    'judge': (_judge, ('fingerprint', 'checkpoint_step', 'new_result',
                       'current_export', 'margin', 'split'), False),
    'metrics': (_metrics, ('out', 'new_result', 'checkpoint_step',
                           'fingerprint', 'split'), False),
    'conclude': (_conclude, ('state_dir', 'fingerprint', 'checkpoint_step',
                             'verdict', 'message'), False),
    'prune': (_prune, ('keep',), True),
    'summary': (_summary, ('exit_code', 'status', 'log_file'), False),
}


def _usage_problem(argv):
  """What is wrong with the subcommand and its flags, or None."""
  if len(argv) < 2 or argv[1] not in _SUBCOMMANDS:
    return 'expected a subcommand (%s), got %s' % (
        ', '.join(_SUBCOMMANDS), ' '.join(argv[1:2]) or 'none')
  _, required, takes_args = _SUBCOMMANDS[argv[1]]
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


def main(argv):
  problem = _usage_problem(argv)
  if problem:
    sys.stderr.write('%s: %s (see --help)\n' % (COMMAND, problem))
    return app.EXIT_BAD_INPUT
  handler = _SUBCOMMANDS[argv[1]][0]
  answer = []
  try:
    handler(answer, argv[2:])
  except policy.RoundError as e:
    answer.extend(_end(policy.failed(str(e))))
  _print_answer(answer)
  return app.EXIT_OK


def run():
  app.start(COMMAND, main, __doc__, (__name__,))


if __name__ == '__main__':
  run()
