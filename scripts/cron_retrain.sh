#!/usr/bin/env bash
# Nightly retraining: rebuild the TFRecords when the data folder changed,
# train N more steps from the latest checkpoint within a time budget,
# evaluate, and promote the new model (export + atomic switch of the
# `current` symlink) only when its mIoU did not drop by more than a margin.
# This script runs the commands and moves the files; it asks every decision
# between them (what to rebuild and train, promote or keep, the exit code,
# the JSON summary) of the round's policy, deeplab_train/retrain, through
# `python -m deeplab_train.retrain` (deeplab_train/cli/retrain.py).
# See docs/cron.md for the folder layout, the exit codes and a crontab line.
set -euo pipefail

SCRIPT_NAME=cron_retrain.sh
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The exit codes this script sets without asking the policy (which defines
# them all, in deeplab_train/retrain/policy.py).
readonly EXIT_FAILURE=1 EXIT_BUSY=75

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --data_dir DIR --work_dir DIR [options]

One retraining round (see docs/cron.md). Options, each also settable by the
environment variable in brackets:
  --data_dir DIR         images + labels in VOC layout [DATA_DIR]
  --work_dir DIR         TFRecords, checkpoints, exports, logs [WORK_DIR]
  --steps N              training steps per run [STEPS_PER_RUN, 1000]
  --max_run_seconds S    training time budget; the trainer saves a checkpoint
                         and stops when it is used up [MAX_RUN_SECONDS, 14400]
  --margin M             promote unless mIoU drops by more than M (absolute,
                         on deeplab-eval's scale) [MIOU_MARGIN, 0.005]
  --keep K               newest exports kept; the current one always is
                         [KEEP_EXPORTS, 5]
  -h, --help             this text

Data (environment variables, with their defaults):
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

# --- configuration -----------------------------------------------------------

parse_args() {
  local arg
  while (($#)); do
    arg=$1
    shift
    if [[ $arg == --*=* ]]; then
      set -- "${arg#*=}" "$@"
      arg=${arg%%=*}
    fi
    case $arg in
      -h | --help) usage; exit 0 ;;
      --data_dir | --work_dir | --steps | --max_run_seconds | --margin | --keep)
        (($#)) || die "$arg needs a value (see -h)"
        case $arg in
          --data_dir) DATA_DIR=$1 ;;
          --work_dir) WORK_DIR=$1 ;;
          --steps) STEPS_PER_RUN=$1 ;;
          --max_run_seconds) MAX_RUN_SECONDS=$1 ;;
          --margin) MIOU_MARGIN=$1 ;;
          --keep) KEEP_EXPORTS=$1 ;;
        esac
        shift
        ;;
      *) die "unknown argument '$arg' (see -h)" ;;
    esac
  done
}

set_defaults() {
  DATA_DIR=${DATA_DIR:-}
  WORK_DIR=${WORK_DIR:-}
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
  RECIPE=${RECIPE:-mobilenet_v2}
  PYTHON=${PYTHON:-python3}
}

check_config() {
  [[ -n $DATA_DIR ]] || die "--data_dir (or DATA_DIR) is required (see -h)"
  [[ -n $WORK_DIR ]] || die "--work_dir (or WORK_DIR) is required (see -h)"
  local name
  for name in NUM_CLASSES IGNORE_LABEL NUM_SHARDS STEPS_PER_RUN MAX_TOTAL_STEPS \
    MAX_RUN_SECONDS KEEP_EXPORTS KEEP_LOGS; do
    require_int "$name" "${!name}"
  done
  ((MAX_TOTAL_STEPS > 0)) || die "MAX_TOTAL_STEPS must be at least 1"
  [[ $TRAIN_ONLY_ON_NEW_DATA =~ ^[01]$ ]] || die "TRAIN_ONLY_ON_NEW_DATA must be 0 or 1"
  [[ $MIOU_MARGIN =~ ^[0-9]*\.?[0-9]+$ ]] || die "--margin must be a non-negative number, got '$MIOU_MARGIN'"
  set_recipe_defaults
}

set_paths() {
  mkdir -p "$WORK_DIR"
  WORK_DIR=$(realpath "$WORK_DIR")
  DATA_DIR=$(realpath -m "$DATA_DIR")
  TFRECORDS_DIR=$WORK_DIR/tfrecords
  TFRECORD_LINK=$WORK_DIR/tfrecord
  TRAIN_LOGDIR=$WORK_DIR/train
  EVAL_LOGDIR=$WORK_DIR/eval
  EXPORTS_DIR=$WORK_DIR/exports
  CURRENT_LINK=$EXPORTS_DIR/current
  STATE_DIR=$WORK_DIR/state
  LOG_DIR=${LOG_DIR:-$WORK_DIR/logs}
  LOCK_FILE=${LOCK_FILE:-$WORK_DIR/cron.lock}
  mkdir -p "$TFRECORDS_DIR" "$TRAIN_LOGDIR" "$EVAL_LOGDIR" "$EXPORTS_DIR" "$STATE_DIR" "$LOG_DIR"
}

# --- the policy: python -m deeplab_train.retrain ---------------------------------

policy() { "$PYTHON" -m deeplab_train.retrain "$@"; }

need_policy() {
  policy --help >/dev/null 2>&1 ||
    die "$PYTHON cannot run deeplab_train.retrain (put the deeplab-train virtualenv first on PATH, or set PYTHON to its python)"
}

declare -A DECISION=() SUMMARY=()

# Asks the policy for decision $1 (flags follow) and reads its answer, one
# key=value per line, into DECISION; summary.KEY values are kept in SUMMARY
# for the JSON summary, log lines are logged, and an answer with an
# exit_code ends the round.
decide() {
  local answer key value
  answer=$(policy "$@") || fail "the retraining policy failed on '$1' (see the log)"
  DECISION=()
  while IFS='=' read -r key value; do
    case $key in
      '') ;;
      log) log "$value" ;;
      summary.*) SUMMARY[${key#summary.}]=$value ;;
      *) DECISION[$key]=$value ;;
    esac
  done <<<"$answer"
  if [[ -n ${DECISION[exit_code]:-} ]]; then
    finish "${DECISION[exit_code]}" "${DECISION[status]}" "${DECISION[message]}"
  fi
}

# Fills ROUND_FLAGS with what most decisions need: the state folder, the
# data fingerprint and the step of checkpoint prefix $1 (when there is one).
round_flags() {
  ROUND_FLAGS=(--state_dir="$STATE_DIR" --fingerprint="$FINGERPRINT")
  if [[ -n $1 ]]; then
    ROUND_FLAGS+=(--checkpoint_step="$(checkpoint_step "$1")")
  fi
}

# --- ending: one summary, one exit code ----------------------------------------

FINISHED=0

# Prints the JSON summary of exit code $1, status $2 and message $3 (none for
# an unexpected error) with the facts in SUMMARY; the policy also writes it
# to $WORK_DIR/last_run.json. When Python cannot run, a minimal line.
report() {
  local code=$1 status=$2 key flags=()
  if (($# > 2)); then
    flags+=(--message="$3")
  fi
  for key in "${!SUMMARY[@]}"; do
    flags+=("--$key=${SUMMARY[$key]}")
  done
  policy summary --exit_code="$code" --status="$status" --log_file="$LOG_FILE" \
    --last_run="$WORK_DIR/last_run.json" ${flags[@]+"${flags[@]}"} >&3 ||
    printf '{"status": "%s", "exit_code": %d, "log": "%s"}\n' "$status" "$code" "$LOG_FILE" >&3
}

# Logs, prints the summary and exits with $1. $2: status word, $3: message.
finish() {
  local code=$1 status=$2 message=$3
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
  if ((!FINISHED)); then
    FINISHED=1
    log "failed: unexpected error (exit status $rc), see the messages above"
    # This line has only status, exit code and log, as it always had.
    SUMMARY=()
    report "$EXIT_FAILURE" failed
    exit "$EXIT_FAILURE"
  fi
}

# --- data and TFRecords --------------------------------------------------------

check_data_dir() {
  local sub
  [[ -d $DATA_DIR ]] || fail "DATA_DIR=$DATA_DIR is not a folder"
  for sub in "$IMAGE_SUBDIR" "$LABEL_SUBDIR" "$LIST_SUBDIR"; do
    [[ -d "$DATA_DIR/$sub" ]] || fail "$DATA_DIR/$sub is missing (expected VOC layout: $IMAGE_SUBDIR, $LABEL_SUBDIR, $LIST_SUBDIR; see -h)"
  done
  for sub in "$TRAIN_SPLIT" "$EVAL_SPLIT"; do
    [[ -s "$DATA_DIR/$LIST_SUBDIR/$sub.txt" ]] || fail "$DATA_DIR/$LIST_SUBDIR/$sub.txt is missing or empty"
  done
}

# Hash of the data folder's file list with sizes and mtimes, and of the
# conversion settings: any change means the TFRecords must be rebuilt.
data_fingerprint() {
  {
    (cd "$DATA_DIR" && find -L . -type f -printf '%P\t%s\t%T@\n' | LC_ALL=C sort)
    printf 'settings\t%s\n' "$IMAGE_SUBDIR" "$LABEL_SUBDIR" "$LIST_SUBDIR" "$IMAGE_FORMAT" \
      "$DATASET_NAME" "$NUM_CLASSES" "$IGNORE_LABEL" "$NUM_SHARDS" "${BUILD_EXTRA_FLAGS:-}"
  } | sha256sum | cut -d ' ' -f 1
}

# Converts the data folder into a new tfrecords/<stamp> folder and points
# the `tfrecord` symlink at it; the old records stay in use until then.
build_tfrecords() {
  local out="$TFRECORDS_DIR/$STAMP" tmp="$TFRECORDS_DIR/.tmp-$STAMP" extra old
  split_words extra "${BUILD_EXTRA_FLAGS:-}"
  CLEANUP+=("$tmp")
  log "data changed: converting $DATA_DIR"
  run deeplab-build-data \
    --image_folder="$DATA_DIR/$IMAGE_SUBDIR" \
    --semantic_segmentation_folder="$DATA_DIR/$LABEL_SUBDIR" \
    --list_folder="$DATA_DIR/$LIST_SUBDIR" \
    --image_format="$IMAGE_FORMAT" \
    --output_dir="$tmp" \
    --num_shards="$NUM_SHARDS" \
    --dataset_name="$DATASET_NAME" \
    --num_classes="$NUM_CLASSES" \
    --ignore_label="$IGNORE_LABEL" \
    ${extra[@]+"${extra[@]}"} || fail "deeplab-build-data failed on $DATA_DIR (see the log); the previous TFRecords and model are untouched"
  [[ -f "$tmp/dataset.json" ]] || fail "deeplab-build-data wrote no dataset.json"
  mv "$tmp" "$out"
  switch_symlink "tfrecords/$STAMP" "$TFRECORD_LINK"
  # Only the records in use are kept (older ones, and any left by a round
  # killed between the rename and the switch).
  for old in "$TFRECORDS_DIR"/*; do
    if [[ $old != "$out" ]]; then
      rm -rf "$old"
    fi
  done
}

# --- training and evaluation ---------------------------------------------------

# Trains $1 more steps from the latest checkpoint; the policy reads a
# failure through the trainer's own exit codes.
train_more() {
  local steps=$1 flags extra
  build_model_flags
  flags=(
    --dataset="$DATASET_NAME"
    --dataset_dir="$TFRECORD_LINK"
    --train_split="$TRAIN_SPLIT"
    --train_logdir="$TRAIN_LOGDIR"
    "${MODEL_FLAGS[@]}"
    --train_crop_size="${TRAIN_CROP_SIZE:-513,513}"
    --train_batch_size="${TRAIN_BATCH_SIZE:-8}"
    --base_learning_rate="${BASE_LEARNING_RATE:-0.0001}"
    --fine_tune_batch_norm="${FINE_TUNE_BATCH_NORM:-false}"
    --num_steps_more="$steps"
    --training_number_of_steps="$MAX_TOTAL_STEPS"
    --max_run_seconds="$MAX_RUN_SECONDS"
    --result_json="$STATE_DIR/train_result.json"
  )
  # Only for the first round: later rounds resume from train/ anyway.
  if [[ -n ${INIT_CHECKPOINT:-} && -z $(latest_checkpoint "$TRAIN_LOGDIR") ]]; then
    flags+=(--tf_initial_checkpoint="$INIT_CHECKPOINT")
  fi
  split_words extra "${TRAIN_EXTRA_FLAGS:-}"
  log "training $steps more steps (at most $MAX_RUN_SECONDS s)"
  run deeplab-train "${flags[@]}" ${extra[@]+"${extra[@]}"} ||
    decide trainer --trainer_exit_code="$?" --trainer_logdir="$TRAIN_LOGDIR"
}

# Evaluates checkpoint prefix $1 on the eval split into eval/$2/, whose
# result.json the policy reads.
evaluate() {
  local checkpoint=$1 name=$2 result extra rc=0
  result="$EVAL_LOGDIR/$name/result.json"
  rm -f "$result"
  optional_flag eval_crop_size "${EVAL_CROP_SIZE-513,513}"
  split_words extra "${EVAL_EXTRA_FLAGS:-}"
  run deeplab-eval \
    --dataset="$DATASET_NAME" \
    --dataset_dir="$TFRECORD_LINK" \
    --eval_split="$EVAL_SPLIT" \
    --checkpoint_dir="$checkpoint" \
    --eval_logdir="$EVAL_LOGDIR/$name" \
    --max_number_of_evaluations=1 \
    --eval_result_json="$result" \
    ${OPTIONAL_FLAGS[@]+"${OPTIONAL_FLAGS[@]}"} \
    ${extra[@]+"${extra[@]}"} || rc=$?
  ((rc == 0)) || fail "deeplab-eval failed with exit status $rc on $checkpoint (see the log)"
}

# --- promotion -----------------------------------------------------------------

# Exports checkpoint $1 into exports/<stamp>-step<N>, with a copy of the
# checkpoint and its metrics, then switches `current` to it; sets
# EXPORT_NAME.
promote() {
  local checkpoint=$1 step name tmp extra rc=0 f
  step=$(checkpoint_step "$checkpoint")
  name="$STAMP-step$step"
  [[ ! -e "$EXPORTS_DIR/$name" ]] || name+="-$$"
  tmp="$EXPORTS_DIR/.tmp-$name"
  CLEANUP+=("$tmp")
  mkdir -p "$tmp/checkpoint"
  split_words extra "${EXPORT_EXTRA_FLAGS:-}"
  # The model options (classes included) come from the deeplab_config.json
  # that deeplab-train saved beside the checkpoint.
  run deeplab-export \
    --checkpoint_path="$checkpoint" \
    --export_path="$tmp/frozen_inference_graph.pb" \
    --saved_model_dir="$tmp/saved_model" \
    --crop_size="${EXPORT_CROP_SIZE:-513,513}" \
    ${extra[@]+"${extra[@]}"} || rc=$?
  ((rc == 0)) || fail "deeplab-export failed with exit status $rc (see the log); current model untouched"
  # The checkpoint travels with the export so that a later run can
  # re-evaluate the current model when the evaluation data changes.
  for f in "$checkpoint".*; do
    cp "$f" "$tmp/checkpoint/"
  done
  cp "$TRAIN_LOGDIR/deeplab_config.json" "$tmp/checkpoint/"
  printf 'model_checkpoint_path: "%s"\nall_model_checkpoint_paths: "%s"\n' \
    "$(basename "$checkpoint")" "$(basename "$checkpoint")" >"$tmp/checkpoint/checkpoint"
  decide metrics "${ROUND_FLAGS[@]}" --out="$tmp/metrics.json" \
    --new_result="$EVAL_LOGDIR/new/result.json" --split="$EVAL_SPLIT"
  mv "$tmp" "$EXPORTS_DIR/$name"
  switch_symlink "$name" "$CURRENT_LINK"
  log "promoted: exports/current -> $name"
  EXPORT_NAME=$name
  prune "$EXPORTS_DIR" "$KEEP_EXPORTS" "$name" \
    -mindepth 1 -maxdepth 1 -type d -name '[0-9]*-step*'
}

# Removes from folder $1 all but the newest $2 of the entries that `find`
# selects with the arguments after $3 (never $3), as the policy chooses.
prune() {
  local folder=$1 keep=$2 protect=$3 names answer key name
  shift 3
  mapfile -t names < <(find "$folder" "$@" -printf '%f\n')
  ((${#names[@]})) || return 0
  answer=$(policy prune --keep="$keep" --protect="$protect" -- "${names[@]}") ||
    fail "the retraining policy failed on 'prune' (see the log)"
  while IFS='=' read -r key name; do
    if [[ $key == remove ]]; then
      log "removing old $folder/$name"
      rm -rf "${folder:?}/$name"
    fi
  done <<<"$answer"
}

# Evaluates the new checkpoint $1 (and the current model when the policy
# asks for it), then promotes or keeps it as the policy decides.
judge() {
  local checkpoint=$1 flags verdict message
  flags=("${ROUND_FLAGS[@]}" --new_result="$EVAL_LOGDIR/new/result.json"
    --current_export="$CURRENT_LINK" --margin="$MIOU_MARGIN" --split="$EVAL_SPLIT")
  evaluate "$checkpoint" new
  decide judge "${flags[@]}"
  if [[ ${DECISION[action]} == reevaluate ]]; then
    evaluate "$(latest_checkpoint "$CURRENT_LINK/checkpoint")" current
    decide judge "${flags[@]}" --current_result="$EVAL_LOGDIR/current/result.json"
  fi
  verdict=${DECISION[action]}
  message=${DECISION[message]}
  EXPORT_NAME=
  if [[ $verdict == promote ]]; then
    promote "$checkpoint"
  fi
  decide conclude "${ROUND_FLAGS[@]}" --verdict="$verdict" --message="$message" \
    --export="$EXPORT_NAME"
}

# --- main ------------------------------------------------------------------------

main() {
  set_defaults
  parse_args "$@"
  check_config
  set_paths
  STAMP=$(date '+%Y%m%d-%H%M%S')
  LOG_FILE="$LOG_DIR/cron-$STAMP.log"
  [[ ! -e $LOG_FILE ]] || LOG_FILE="$LOG_DIR/cron-$STAMP-$$.log"
  CLEANUP=()
  exec 3>&1
  exec >>"$LOG_FILE" 2>&1
  trap on_exit EXIT
  # The running command finishes first (deeplab-train saves a checkpoint on
  # SIGTERM), then the round ends as a failure (exit 1).
  trap 'fail "interrupted by a signal"' TERM INT HUP
  log "start: data $DATA_DIR, work $WORK_DIR, log $LOG_FILE"

  exec 9>>"$LOCK_FILE"
  flock -n 9 || finish "$EXIT_BUSY" busy "another $SCRIPT_NAME holds $LOCK_FILE"
  need_cmd deeplab-build-data deeplab-train deeplab-eval deeplab-export
  need_policy
  # Left by a run that was killed: nothing else writes here while we hold
  # the lock.
  rm -rf "$TFRECORDS_DIR"/.tmp-* "$EXPORTS_DIR"/.tmp-*
  prune "$LOG_DIR" "$KEEP_LOGS" "$(basename "$LOG_FILE")" \
    -maxdepth 1 -type f -name 'cron-*.log'
  check_data_dir

  FINGERPRINT=$(data_fingerprint)
  local checkpoint records_ready=false build steps trained=false
  checkpoint=$(latest_checkpoint "$TRAIN_LOGDIR")
  if [[ -f "$TFRECORD_LINK/dataset.json" ]]; then
    records_ready=true
  fi
  round_flags "$checkpoint"
  decide plan "${ROUND_FLAGS[@]}" --records_ready="$records_ready" \
    --steps_per_run="$STEPS_PER_RUN" --max_total_steps="$MAX_TOTAL_STEPS" \
    --train_only_on_new_data="$TRAIN_ONLY_ON_NEW_DATA"
  build=${DECISION[build]}
  steps=${DECISION[train_steps]}

  if ((build)); then
    build_tfrecords
    decide record "${ROUND_FLAGS[@]}" --stage=built
  fi
  if ((steps > 0)); then
    train_more "$steps"
    decide record "${ROUND_FLAGS[@]}" --stage=trained
    trained=true
    checkpoint=$(latest_checkpoint "$TRAIN_LOGDIR")
    round_flags "$checkpoint"
  fi
  decide candidate "${ROUND_FLAGS[@]}" --trained="$trained" --trainer_logdir="$TRAIN_LOGDIR"
  judge "$checkpoint"
}

main "$@"
