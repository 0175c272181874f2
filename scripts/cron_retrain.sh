#!/usr/bin/env bash
# Nightly retraining: rebuild the TFRecords when the data folder changed,
# train N more steps from the latest checkpoint within a time budget, take
# the best checkpoint the trainer's validation kept in train/best/ (or the
# latest one), evaluate it, and promote it (export + atomic switch of the
# `current` symlink) only when its mIoU did not drop by more than a margin.
# This script takes the lock, runs the commands and moves the files; it asks
# everything else (whether the settings are good, the data fingerprint, what
# to rebuild and train, promote or keep, what to delete, the exit code, the
# JSON summary) of the round's policy, deeplab_train/retrain, through
# `python -m deeplab_train.retrain` (deeplab_train/cli/retrain.py lists the
# questions in the order they are asked).
# See docs/cron.md for the folder layout, the exit codes and a crontab line.
set -euo pipefail

SCRIPT_NAME=cron_retrain.sh
# shellcheck source-path=SCRIPTDIR source=voc_recipe.sh
source "$(dirname "${BASH_SOURCE[0]}")/voc_recipe.sh"

# The exit codes this script sets without asking the policy (which defines
# them all, in deeplab_train/retrain/policy.py).
readonly EXIT_FAILURE=1 EXIT_BUSY=75

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --data_dir DIR --work_dir DIR [options]

One retraining round (see docs/cron.md). Options, each also settable by the
environment variable in brackets:
  --data_dir DIR         images + labels in VOC layout, or a Cityscapes root
                         (DATA_LAYOUT below) [DATA_DIR]
  --work_dir DIR         TFRecords, checkpoints, exports, logs [WORK_DIR]
  --steps N              training steps per run [STEPS_PER_RUN, 1000]
  --max_run_seconds S    training time budget; the trainer saves a checkpoint
                         and stops when it is used up [MAX_RUN_SECONDS, 14400]
  --margin M             promote unless mIoU drops by more than M (absolute,
                         on deeplab-eval's scale) [MIOU_MARGIN, 0.005]
  --keep K               newest exports kept; the current one always is
                         [KEEP_EXPORTS, 5]
  --candidate C          the checkpoint judged: best (the one deeplab-train's
                         validation keeps in train/best/; needs
                         --eval_interval_steps=N in TRAIN_EXTRA_FLAGS), latest,
                         or auto: best/'s when training validates and best/
                         holds one, else the latest [CANDIDATE, auto]
  -h, --help             this text

Data (environment variables, with their defaults):
  DATA_LAYOUT [voc]: voc (the folders below) or cityscapes (DATA_DIR holds
  Cityscapes' leftImg8bit/ and gtFine/; its train and val splits are
  converted, and the defaults become DATASET_NAME=cityscapes, NUM_CLASSES=19,
  TRAIN_CROP_SIZE=769,769, EVAL_CROP_SIZE and EXPORT_CROP_SIZE 1025,2049)
  IMAGE_SUBDIR [JPEGImages]  LABEL_SUBDIR [SegmentationClass]
  LIST_SUBDIR [ImageSets/Segmentation]  IMAGE_FORMAT [jpg]
  DATASET_NAME [custom]  NUM_CLASSES [21]  IGNORE_LABEL [255]  NUM_SHARDS [4]
  TRAIN_SPLIT [train]  EVAL_SPLIT [val]
Training:
  RECIPE [mobilenet_v2] and the model variables of the VOC scripts
  (MODEL_VARIANT, OUTPUT_STRIDE, ATROUS_RATES, DECODER_OUTPUT_STRIDE,
  DEPTH_MULTIPLIER); TRAIN_CROP_SIZE [513,513]  TRAIN_BATCH_SIZE [8]
  BASE_LEARNING_RATE [0.0001]  FINE_TUNE_BATCH_NORM [false]
  INIT_CHECKPOINT (first run only)
  MAX_TOTAL_STEPS [1000000] (training stops for good at this global step;
  also the horizon over which the poly learning rate decays)
  TRAIN_ONLY_ON_NEW_DATA [0] (1: train only when the data changed)
Evaluation and export:
  EVAL_CROP_SIZE [513,513] (empty: pad each image to the next size the
  network accepts)  EXPORT_CROP_SIZE [513,513] (largest accepted input)
Extra command flags (space separated): BUILD_EXTRA_FLAGS, TRAIN_EXTRA_FLAGS,
  EVAL_EXTRA_FLAGS, EXPORT_EXTRA_FLAGS
Housekeeping: LOG_DIR [\$WORK_DIR/logs]  KEEP_LOGS [30]
  LOCK_FILE [\$WORK_DIR/cron.lock]
  PYTHON [python3] (the deeplab-train virtualenv's Python: it makes the
  round's decisions)

Exit status: 0 success (promoted, or kept because mIoU dropped), 10 nothing to
do, 75 busy (another run holds the lock), 1 failure (current model untouched).
The last line on stdout (and \$WORK_DIR/last_run.json) is a JSON summary.
EOF
}

# --- settings ------------------------------------------------------------------

# Option -> variable (parse_options reads it by name).
# shellcheck disable=SC2034
declare -A OPTIONS=([--data_dir]=DATA_DIR [--work_dir]=WORK_DIR
  [--steps]=STEPS_PER_RUN [--max_run_seconds]=MAX_RUN_SECONDS
  [--margin]=MIOU_MARGIN [--keep]=KEEP_EXPORTS [--candidate]=CANDIDATE)

parse_args() {
  parse_options OPTIONS "$@"
  ((${#POSITIONAL[@]} == 0)) ||
    usage_error "unknown argument '${POSITIONAL[0]}' (see -h)"
}

# A bad command line: the round's summary line too, as for bad settings (a
# typo in a crontab line left a monitor nothing to read).
usage_error() {
  policy summary --exit_code="$EXIT_FAILURE" --status=failed --log_file= \
    --message="$1" ||
    printf '{"status": "failed", "exit_code": %d, "log": ""}\n' "$EXIT_FAILURE"
  die "$1"
}

set_defaults() {
  DATA_DIR=${DATA_DIR:-}
  WORK_DIR=${WORK_DIR:-}
  DATA_LAYOUT=${DATA_LAYOUT:-voc}
  if [[ $DATA_LAYOUT == cityscapes ]]; then
    # Cityscapes' own classes, and crops of its 1024x2048 images.
    DATASET_NAME=${DATASET_NAME:-cityscapes}
    NUM_CLASSES=${NUM_CLASSES:-19}
    TRAIN_CROP_SIZE=${TRAIN_CROP_SIZE:-769,769}
    EVAL_CROP_SIZE=${EVAL_CROP_SIZE-1025,2049}
    EXPORT_CROP_SIZE=${EXPORT_CROP_SIZE:-1025,2049}
  fi
  IMAGE_SUBDIR=${IMAGE_SUBDIR:-JPEGImages}
  LABEL_SUBDIR=${LABEL_SUBDIR:-SegmentationClass}
  LIST_SUBDIR=${LIST_SUBDIR:-ImageSets/Segmentation}
  IMAGE_FORMAT=${IMAGE_FORMAT:-jpg}
  DATASET_NAME=${DATASET_NAME:-custom}
  NUM_CLASSES=${NUM_CLASSES:-21}
  IGNORE_LABEL=${IGNORE_LABEL:-255}
  NUM_SHARDS=${NUM_SHARDS:-4}
  TRAIN_SPLIT=${TRAIN_SPLIT:-train}
  EVAL_SPLIT=${EVAL_SPLIT:-val}
  STEPS_PER_RUN=${STEPS_PER_RUN:-1000}
  MAX_TOTAL_STEPS=${MAX_TOTAL_STEPS:-1000000}
  MAX_RUN_SECONDS=${MAX_RUN_SECONDS:-14400}
  TRAIN_ONLY_ON_NEW_DATA=${TRAIN_ONLY_ON_NEW_DATA:-0}
  MIOU_MARGIN=${MIOU_MARGIN:-0.005}
  KEEP_EXPORTS=${KEEP_EXPORTS:-5}
  KEEP_LOGS=${KEEP_LOGS:-30}
  CANDIDATE=${CANDIDATE:-auto}
  TRAIN_EXTRA_FLAGS=${TRAIN_EXTRA_FLAGS:-}
  RECIPE=${RECIPE:-mobilenet_v2}
  PYTHON=${PYTHON:-python3}
}

# Stops (exit 1, before any log is written) on a setting the policy finds
# bad, or when $PYTHON cannot ask it; the summary line (no log yet) still
# tells cron why.
check_settings() {
  local name answer settings=()
  for name in DATA_DIR WORK_DIR NUM_CLASSES IGNORE_LABEL NUM_SHARDS \
    STEPS_PER_RUN MAX_TOTAL_STEPS MAX_RUN_SECONDS KEEP_EXPORTS KEEP_LOGS \
    TRAIN_ONLY_ON_NEW_DATA MIOU_MARGIN CANDIDATE TRAIN_EXTRA_FLAGS \
    DATA_LAYOUT; do
    settings+=("$name=${!name}")
  done
  if ! answer=$(policy check -- "${settings[@]}"); then
    # Python cannot write this line: it has only status, exit code and log.
    printf '{"status": "failed", "exit_code": %d, "log": ""}\n' "$EXIT_FAILURE"
    die "$PYTHON cannot run deeplab_train.retrain (put the deeplab-train virtualenv first on PATH, or set PYTHON to its python)"
  fi
  if [[ -n $answer ]]; then
    policy summary --exit_code="$EXIT_FAILURE" --status=failed --log_file= \
      --message="${answer#problem=}"
    die "${answer#problem=}"
  fi
  set_recipe_defaults
}

# A folder that cannot be made (a file in its place, a full disk, a
# read-only file system) sets PATHS_PROBLEM: the round ends on it once its
# summary can be printed (set -e ended it here without one).
set_paths() {
  local error
  PATHS_PROBLEM=
  error=$(mkdir -p "$WORK_DIR" 2>&1) ||
    PATHS_PROBLEM="cannot create the work folder ($error)"
  WORK_DIR=$(realpath -m "$WORK_DIR")
  DATA_DIR=$(realpath -m "$DATA_DIR")
  TFRECORDS_DIR=$WORK_DIR/tfrecords
  TFRECORD_LINK=$WORK_DIR/tfrecord
  TRAIN_LOGDIR=$WORK_DIR/train
  BEST_DIR=$TRAIN_LOGDIR/best
  EVAL_LOGDIR=$WORK_DIR/eval
  EXPORTS_DIR=$WORK_DIR/exports
  CURRENT_LINK=$EXPORTS_DIR/current
  STATE_DIR=$WORK_DIR/state
  LOG_DIR=${LOG_DIR:-$WORK_DIR/logs}
  LOCK_FILE=${LOCK_FILE:-$WORK_DIR/cron.lock}
  if [[ -z $PATHS_PROBLEM ]] && ! error=$(mkdir -p "$TFRECORDS_DIR" "$TRAIN_LOGDIR" \
      "$EVAL_LOGDIR" "$EXPORTS_DIR" "$STATE_DIR" "$LOG_DIR" 2>&1); then
    PATHS_PROBLEM="cannot create the round's folders ($error)"
  fi
  [[ -z $PATHS_PROBLEM ]] ||
    PATHS_PROBLEM+=": free space, make $WORK_DIR writable, or move what is in the way; nothing else was done"
}

# From here on, stdout and stderr go to this round's log; the summary goes
# to the original stdout (fd 3). When the log's first line cannot be
# written (a full disk, a read-only folder), they stay on stderr and
# LOG_PROBLEM says why: the round then ends there, once it holds the lock.
open_log() {
  local error
  STAMP=$(date '+%Y%m%d-%H%M%S')
  LOG_FILE="$LOG_DIR/cron-$STAMP.log"
  [[ ! -e $LOG_FILE ]] || LOG_FILE="$LOG_DIR/cron-$STAMP-$$.log"
  CLEANUP=()
  LOG_PROBLEM=
  exec 3>&1
  if error=$(log_line "start: data $DATA_DIR, work $WORK_DIR, log $LOG_FILE" 2>&1 >>"$LOG_FILE"); then
    exec >>"$LOG_FILE" 2>&1
  else
    LOG_PROBLEM="cannot write the log $LOG_FILE (${error##*: }): free space in $LOG_DIR or make it writable; nothing else was done"
    exec >&2
  fi
}

# Runs a command as `run` does, in this shell (so that a signal to the
# script is handed on to it; a command substitution would hold the signal
# until the command ended by itself), its stdout kept in a file in memory
# (/dev/shm; a log on a full disk could not hold it) until it ends, then
# logged. COMMAND_MESSAGE is then the message of the JSON result line every
# deeplab command ends with, for the summary (empty when there is none).
capture_dir() {
  if [[ -d /dev/shm && -w /dev/shm ]]; then echo /dev/shm; else echo "${TMPDIR:-/tmp}"; fi
}

run_keeping_message() {
  local rc=0
  RUNNING_COMMAND=$1
  COMMAND_MESSAGE=
  # Named with this round's pid: remove_dead_captures knows them by it.
  if CAPTURE_FILE=$(mktemp "$(capture_dir)/$SCRIPT_NAME.$$.XXXXXX" 2>/dev/null); then
    CLEANUP+=("$CAPTURE_FILE")
    run "$@" >"$CAPTURE_FILE" || rc=$?
    release_output
  else
    run "$@" || rc=$?
  fi
  RUNNING_COMMAND=
  return "$rc"
}

# Removes the stdout kept of a command whose round was killed (kill -9: no
# trap ran), logging what it holds (its result line).
remove_dead_captures() {
  local file pid
  for file in "$(capture_dir)/$SCRIPT_NAME".*.*; do
    [[ -f $file ]] || continue
    pid=${file##*/"$SCRIPT_NAME".}
    pid=${pid%%.*}
    if [[ ! $pid =~ ^[0-9]+$ ]] || kill -0 "$pid" 2>/dev/null; then
      continue   # another name, or a round still running
    fi
    log "a killed round (pid $pid) left its command's output in $file, removed now: $(tr '\n' ' ' <"$file" 2>/dev/null)"
    rm -f "$file"
  done
}

# Logs the stdout kept of the running command (also when a signal ends the
# round during it) and sets COMMAND_MESSAGE from it.
release_output() {
  local out
  [[ -n ${CAPTURE_FILE:-} ]] || return 0
  out=$(cat "$CAPTURE_FILE") || true
  rm -f "$CAPTURE_FILE"
  CAPTURE_FILE=
  # To stderr: a trap may run this while stdout is still the file.
  [[ -z $out ]] || printf '%s\n' "$out" >&2 || true
  COMMAND_MESSAGE=$("$PYTHON" -c '
import json, sys
for line in reversed(sys.argv[1].splitlines()):
  try:
    result = json.loads(line)
  except ValueError:
    continue
  if isinstance(result, dict) and result.get("event") == "result":
    print(" ".join(str(result.get("message") or "").split()))
    break
' "$out" 2>/dev/null) || COMMAND_MESSAGE=
}

# The trap of signal $1 (TERM, INT, HUP): `run` has let the running command
# end first (deeplab-train saves a checkpoint); the round fails, saying
# what the command said.
interrupted() {
  local during=''
  release_output
  if [[ -n ${RUNNING_COMMAND:-} ]]; then
    during=" while $RUNNING_COMMAND ran$(command_said)"
  fi
  fail "interrupted by SIG$1$during"
}

# ": MESSAGE" of the command run last when it said one, else " (see the log)".
command_said() {
  if [[ -n $COMMAND_MESSAGE ]]; then
    printf ': %s' "$COMMAND_MESSAGE"
  else
    printf ' (see the log)'
  fi
}

# --- the policy: python -m deeplab_train.retrain ---------------------------------

policy() { "$PYTHON" -m deeplab_train.retrain "$@"; }

declare -A FACTS=() ANSWER=()

# Fills FACT_FLAGS with --KEY=VALUE for each fact the policy told so far.
fact_flags() {
  local key
  FACT_FLAGS=()
  for key in "${!FACTS[@]}"; do
    FACT_FLAGS+=("--$key=${FACTS[$key]}")
  done
}

# Asks the policy question $1 (its flags follow; the facts are added) and
# does what the answer says, one key=value per line (the format is in
# deeplab_train/cli/retrain.py): log lines are logged, `remove` paths
# deleted, round.KEY and summary.KEY facts kept, the rest left in ANSWER;
# an answer with an exit_code ends the round.
ask() {
  local reply key value
  fact_flags
  reply=$(policy "$@" ${FACT_FLAGS[@]+"${FACT_FLAGS[@]}"}) ||
    fail "the retraining policy failed on '$1' (see the log)"
  ANSWER=()
  while IFS='=' read -r key value; do
    case $key in
      '') ;;
      log) log "$value" ;;
      remove) rm -rf -- "$value" ;;
      round.* | summary.*) FACTS[${key#*.}]=$value ;;
      *) ANSWER[$key]=$value ;;
    esac
  done <<<"$reply"
  if [[ -n ${ANSWER[exit_code]:-} ]]; then
    finish "${ANSWER[exit_code]}" "${ANSWER[status]}" "${ANSWER[message]}"
  fi
}

# --- ending: one summary, one exit code ----------------------------------------

FINISHED=0
UNPUBLISHED=
# The export `current` was switched to in this round, once it was, and
# the records the `tfrecord` link was switched to until they are recorded.
PROMOTED_TO=
RECORDS_SWITCHED_TO=

# Prints the JSON summary of exit code $1, status $2 and message $3 (none for
# an unexpected error) with the facts; the policy also writes it to
# $WORK_DIR/last_run.json. When Python cannot run, a minimal line.
report() {
  local code=$1 status=$2 message_flag=() log=$LOG_FILE
  if (($# > 2)); then
    message_flag=(--message="$3")
  fi
  # A log that could not be written is not named as the round's log.
  [[ -z ${LOG_PROBLEM:-} ]] || log=
  fact_flags
  policy summary --exit_code="$code" --status="$status" --log_file="$log" \
    --last_run="$WORK_DIR/last_run.json" ${message_flag[@]+"${message_flag[@]}"} \
    ${FACT_FLAGS[@]+"${FACT_FLAGS[@]}"} >&3 ||
    printf '{"status": "%s", "exit_code": %d, "log": "%s"}\n' "$status" "$code" "$log" >&3
}

# What a failure leaves in use that it did not before (it came after a
# switch: a full disk, a signal), as the end of its message; empty when
# nothing.
switched_note() {
  if [[ -n $RECORDS_SWITCHED_TO ]]; then
    printf '; the new TFRecords were put in use before this (tfrecord -> %s)' "$RECORDS_SWITCHED_TO"
  fi
  if [[ -n $PROMOTED_TO ]]; then
    printf '; the new model was promoted before this (exports/current -> %s)' "$PROMOTED_TO"
  fi
}

# Logs, prints the summary and exits with $1. $2: status word, $3: message.
finish() {
  local code=$1 status=$2 message=$3
  [[ $status != failed ]] || message+=$(switched_note)
  log "$status: $message"
  FINISHED=1
  report "$code" "$status" "$message"
  exit "$code"
}

fail() { finish "$EXIT_FAILURE" failed "$1"; }

# shellcheck disable=SC2317  # invoked by the EXIT trap
on_exit() {
  local rc=$?
  rm -rf "${CLEANUP[@]}"
  if [[ -n ${UNPUBLISHED:-} && $(readlink "$CURRENT_LINK" 2>/dev/null) != "$UNPUBLISHED" ]]; then
    rm -rf "${EXPORTS_DIR:?}/$UNPUBLISHED"
  fi
  if ((!FINISHED)); then
    FINISHED=1
    local message="unexpected error (exit status $rc"
    if [[ -n ${FAILED_AT:-} && ${FAILED_RC:-} == "$rc" ]]; then
      message+=" at $FAILED_AT"
    fi
    message+="), see the log$(switched_note)"
    log "failed: $message"
    # The facts of a round that ended half-way are left out.
    FACTS=()
    report "$EXIT_FAILURE" failed "$message"
    exit "$EXIT_FAILURE"
  fi
}

# --- the commands ----------------------------------------------------------------

# Converts the data folder into a new tfrecords/<stamp> folder and points
# the `tfrecord` symlink at it; the old records stay in use until then.
build_tfrecords() {
  local name=$STAMP tmp extra
  # The clock can repeat a stamp (a daylight-saving fall-back, a clock set
  # back): mv would then put the new records inside the old folder.
  [[ ! -e "$TFRECORDS_DIR/$name" ]] || name+="-$$"
  tmp="$TFRECORDS_DIR/.tmp-$name"
  local input=(--cityscapes_root="$DATA_DIR")
  if [[ $DATA_LAYOUT == voc ]]; then
    input=(--image_folder="$DATA_DIR/$IMAGE_SUBDIR"
      --semantic_segmentation_folder="$DATA_DIR/$LABEL_SUBDIR"
      --list_folder="$DATA_DIR/$LIST_SUBDIR" --image_format="$IMAGE_FORMAT")
  fi
  split_words extra "${BUILD_EXTRA_FLAGS:-}"
  CLEANUP+=("$tmp")
  log "data changed: converting $DATA_DIR"
  run_keeping_message deeplab-build-data "${input[@]}" \
    --output_dir="$tmp" --num_shards="$NUM_SHARDS" \
    --dataset_name="$DATASET_NAME" --num_classes="$NUM_CLASSES" \
    --ignore_label="$IGNORE_LABEL" \
    ${extra[@]+"${extra[@]}"} || fail "deeplab-build-data failed on $DATA_DIR$(command_said); the previous TFRecords and model are untouched"
  [[ -f "$tmp/dataset.json" ]] || fail "deeplab-build-data wrote no dataset.json"
  mv -T "$tmp" "$TFRECORDS_DIR/$name"
  switch_symlink "tfrecords/$name" "$TFRECORD_LINK"
  RECORDS_SWITCHED_TO=tfrecords/$name
  ask built --state_dir="$STATE_DIR" --records_dir="$TFRECORDS_DIR" \
    --records_in_use="$name"
  RECORDS_SWITCHED_TO=
}

# Trains $1 more steps from the latest checkpoint; the policy reads a
# failure through the trainer's own exit codes.
train_more() {
  local steps=$1 extra rc=0
  recipe_train_flags "$DATASET_NAME" "$TFRECORD_LINK" "$TRAIN_SPLIT" \
    "$TRAIN_LOGDIR" 8 0.0001 false
  local flags=("${TRAIN_FLAGS[@]}" --num_steps_more="$steps"
    --training_number_of_steps="$MAX_TOTAL_STEPS"
    --max_run_seconds="$MAX_RUN_SECONDS"
    --result_json="$STATE_DIR/train_result.json")
  # Only for the first round: later rounds resume from train/ anyway.
  if [[ -n ${INIT_CHECKPOINT:-} && -z $LATEST_CHECKPOINT ]]; then
    flags+=(--tf_initial_checkpoint="$INIT_CHECKPOINT")
  fi
  split_words extra "$TRAIN_EXTRA_FLAGS"
  log "training $steps more steps (at most $MAX_RUN_SECONDS s)"
  run_keeping_message deeplab-train "${flags[@]}" ${extra[@]+"${extra[@]}"} || rc=$?
  TRAINER_EXIT_CODE=(--trainer_exit_code="$rc" --trainer_message="$COMMAND_MESSAGE")
}

# Evaluates checkpoint prefix $1 on the eval split into eval/$2/, whose
# result.json the policy reads.
evaluate() {
  local checkpoint=$1 name=$2 result extra rc=0
  result="$EVAL_LOGDIR/$name/result.json"
  rm -f "$result"
  inference_flags eval "$DATASET_NAME" "$TFRECORD_LINK" "$EVAL_SPLIT" \
    "$checkpoint" "$EVAL_LOGDIR/$name" "${EVAL_CROP_SIZE-513,513}"
  split_words extra "${EVAL_EXTRA_FLAGS:-}"
  run_keeping_message deeplab-eval "${INFERENCE_FLAGS[@]}" --max_number_of_evaluations=1 \
    --eval_result_json="$result" ${extra[@]+"${extra[@]}"} || rc=$?
  ((rc == 0)) || fail "deeplab-eval failed with exit status $rc on $checkpoint$(command_said)"
}

# Exports $CHECKPOINT (in train/ or train/best/) into
# exports/<stamp>-step<N>, with a copy of the checkpoint, the
# deeplab_config.json beside it and its metrics, then switches `current` to
# it; sets EXPORT_NAME.
promote() {
  local name="$STAMP-step${FACTS[global_step]}" tmp extra rc=0 error
  [[ ! -e "$EXPORTS_DIR/$name" ]] || name+="-$$"
  tmp="$EXPORTS_DIR/.tmp-$name"
  CLEANUP+=("$tmp")
  mkdir -p "$tmp/checkpoint"
  split_words extra "${EXPORT_EXTRA_FLAGS:-}"
  # The model options (classes included) come from the deeplab_config.json
  # that deeplab-train saved beside the checkpoint.
  run_keeping_message deeplab-export --checkpoint_path="$CHECKPOINT" \
    --export_path="$tmp/frozen_inference_graph.pb" \
    --saved_model_dir="$tmp/saved_model" \
    --crop_size="${EXPORT_CROP_SIZE:-513,513}" ${extra[@]+"${extra[@]}"} || rc=$?
  ((rc == 0)) || fail "deeplab-export failed with exit status $rc$(command_said); current model untouched"
  # The checkpoint travels with the export so that a later run can
  # re-evaluate the current model when the evaluation data changes.
  error=$(cp "$CHECKPOINT".* "$(dirname "$CHECKPOINT")/deeplab_config.json" \
    "$tmp/checkpoint/" 2>&1) ||
    fail "cannot copy $CHECKPOINT into the export (${error##*: }); current model untouched"
  ask describe_export --export_dir="$tmp" --checkpoint="$CHECKPOINT" \
    --new_result="$EVAL_LOGDIR/new/result.json" --split="$EVAL_SPLIT"
  mv -T "$tmp" "$EXPORTS_DIR/$name"
  # Removed at exit unless `current` points at it: a complete export never
  # published (a failed switch, a signal) stayed, and a later round kept
  # it among the KEEP_EXPORTS newest and deleted the published one.
  UNPUBLISHED=$name
  switch_symlink "$name" "$CURRENT_LINK"
  UNPUBLISHED=
  PROMOTED_TO=$name
  log "promoted: exports/current -> $name"
  EXPORT_NAME=$name
}

# Evaluates $CHECKPOINT (and the current model when the policy asks for
# it), then promotes or keeps it as the policy decides.
judge() {
  local verdict message promoted=()
  local flags=(--new_result="$EVAL_LOGDIR/new/result.json"
    --current_export="$CURRENT_LINK" --margin="$MIOU_MARGIN" --split="$EVAL_SPLIT")
  evaluate "$CHECKPOINT" new
  ask judge "${flags[@]}"
  if [[ ${ANSWER[action]} == reevaluate ]]; then
    evaluate "$(latest_checkpoint "$CURRENT_LINK/checkpoint")" current
    ask judge "${flags[@]}" --current_result="$EVAL_LOGDIR/current/result.json"
  fi
  verdict=${ANSWER[action]}
  message=${ANSWER[message]}
  if [[ $verdict == promote ]]; then
    promote
    promoted=(--export="$EXPORT_NAME" --exports_dir="$EXPORTS_DIR"
      --keep_exports="$KEEP_EXPORTS")
  fi
  ask conclude --state_dir="$STATE_DIR" --verdict="$verdict" \
    --message="$message" ${promoted[@]+"${promoted[@]}"}
}

# Sets LATEST_CHECKPOINT and BEST_CHECKPOINT (the checkpoint deeplab-train's
# validation keeps in best/), empty when there is none, and CHECKPOINT_FLAGS:
# what the policy needs to choose the round's candidate among them.
find_checkpoints() {
  LATEST_CHECKPOINT=$(latest_checkpoint "$TRAIN_LOGDIR")
  BEST_CHECKPOINT=$(latest_checkpoint "$BEST_DIR")
  CHECKPOINT_FLAGS=(--checkpoint="$LATEST_CHECKPOINT"
    --best_checkpoint="$BEST_CHECKPOINT" --candidate="$CANDIDATE"
    --train_extra_flags="$TRAIN_EXTRA_FLAGS")
}

# --- main ------------------------------------------------------------------------

main() {
  set_defaults
  parse_args "$@"
  check_settings
  set_paths
  open_log
  trap on_exit EXIT
  # Where an unguarded command failed (set -e then ends the round), for
  # the summary's message; -E: also inside functions.
  set -E
  trap 'FAILED_RC=$?; FAILED_AT="${BASH_SOURCE[0]##*/} line $LINENO: $BASH_COMMAND"' ERR
  # The running command finishes first (deeplab-train saves a checkpoint on
  # SIGTERM), then the round ends as a failure (exit 1).
  trap 'interrupted TERM' TERM
  trap 'interrupted INT' INT
  trap 'interrupted HUP' HUP

  # No round can run there (the lock and the log may be what is missing).
  [[ -z $PATHS_PROBLEM ]] || fail "$PATHS_PROBLEM"
  exec 9>>"$LOCK_FILE" ||
    fail "cannot open the lock file $LOCK_FILE${LOG_PROBLEM:+; $LOG_PROBLEM}"
  flock -n 9 || finish "$EXIT_BUSY" busy "another $SCRIPT_NAME round, or a command it started that still runs, holds $LOCK_FILE"
  [[ -z $LOG_PROBLEM ]] || fail "$LOG_PROBLEM"
  need_cmd deeplab-build-data deeplab-train deeplab-eval deeplab-export
  # Left by a run that was killed: nothing else writes here while we hold
  # the lock.
  rm -rf "$TFRECORDS_DIR"/.tmp-* "$EXPORTS_DIR"/.tmp-*
  remove_symlink_temps "$TFRECORD_LINK"
  remove_symlink_temps "$CURRENT_LINK"
  remove_dead_captures

  find_checkpoints
  ask plan --state_dir="$STATE_DIR" --data_dir="$DATA_DIR" \
    --data_layout="$DATA_LAYOUT" --image_subdir="$IMAGE_SUBDIR" \
    --label_subdir="$LABEL_SUBDIR" --list_subdir="$LIST_SUBDIR" \
    --train_split="$TRAIN_SPLIT" --eval_split="$EVAL_SPLIT" \
    --image_format="$IMAGE_FORMAT" \
    --dataset_name="$DATASET_NAME" --num_classes="$NUM_CLASSES" \
    --ignore_label="$IGNORE_LABEL" --num_shards="$NUM_SHARDS" \
    --build_extra_flags="${BUILD_EXTRA_FLAGS:-}" --records="$TFRECORD_LINK" \
    "${CHECKPOINT_FLAGS[@]}" --steps_per_run="$STEPS_PER_RUN" \
    --max_total_steps="$MAX_TOTAL_STEPS" \
    --train_only_on_new_data="$TRAIN_ONLY_ON_NEW_DATA" --log_folder="$LOG_DIR" \
    --log_file="$LOG_FILE" --keep_logs="$KEEP_LOGS"
  local build=${ANSWER[build]} steps=${ANSWER[train_steps]}

  if ((build)); then
    build_tfrecords
  fi
  TRAINER_EXIT_CODE=()
  if ((steps > 0)); then
    train_more "$steps"
    find_checkpoints
  fi
  ask candidate --state_dir="$STATE_DIR" "${CHECKPOINT_FLAGS[@]}" \
    --trainer_logdir="$TRAIN_LOGDIR" ${TRAINER_EXIT_CODE[@]+"${TRAINER_EXIT_CODE[@]}"}
  CHECKPOINT=${ANSWER[checkpoint]}
  judge
}

main "$@"
