#!/usr/bin/env bash
# Nightly retraining: rebuild the TFRecords when the data folder changed,
# train N more steps from the latest checkpoint within a time budget,
# evaluate, and promote the new model (export + atomic switch of the
# `current` symlink) only when its mIoU did not drop by more than a margin.
# See docs/cron.md for the folder layout, the exit codes and a crontab line.
set -euo pipefail

SCRIPT_NAME=cron_retrain.sh
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly EXIT_SUCCESS=0 EXIT_FAILURE=1 EXIT_NOTHING_TO_DO=10 EXIT_BUSY=75

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

# --- ending: one summary, one exit code ----------------------------------------

FINISHED=0
SUMMARY_EXTRA=""

# Writes the JSON summary to $WORK_DIR/last_run.json and stdout, then exits
# with $1. $2: status word, $3: message.
finish() {
  local code=$1 status=$2 message=$3 line
  log "$status: $message"
  message=${message//\\/\\\\}
  line=$(printf '{"status": "%s", "exit_code": %d, "message": "%s", "log": "%s"%s}' \
    "$status" "$code" "${message//\"/\\\"}" "$LOG_FILE" "$SUMMARY_EXTRA")
  # A busy run must not overwrite the summary of the run holding the lock.
  if [[ $status != busy ]]; then
    printf '%s\n' "$line" | write_atomic "$WORK_DIR/last_run.json" || true
  fi
  printf '%s\n' "$line" >&3
  FINISHED=1
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
    printf '{"status": "failed", "exit_code": 1, "log": "%s"}\n' "$LOG_FILE" >&3
    exit "$EXIT_FAILURE"
  fi
}

# Adds "key": value pairs (value already JSON) to the summary.
summary_add() { SUMMARY_EXTRA+=", \"$1\": $2"; }

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

read_state() { cat "$STATE_DIR/$1" 2>/dev/null || true; }
write_state() { printf '%s\n' "$2" | write_atomic "$STATE_DIR/$1"; }

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

# Trains $1 more steps from the latest checkpoint.
train_more() {
  local steps=$1 flags extra rc=0
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
  run deeplab-train "${flags[@]}" ${extra[@]+"${extra[@]}"} || rc=$?
  case $rc in
    0) ;;
    75) finish "$EXIT_BUSY" busy "$TRAIN_LOGDIR is locked by another deeplab-train run" ;;
    3) fail "training stopped on a NaN loss (no NaN checkpoint was saved); lower BASE_LEARNING_RATE?" ;;
    2) fail "deeplab-train rejected its input (exit 2, see the log)" ;;
    *) fail "deeplab-train failed with exit status $rc (see the log)" ;;
  esac
}

# Evaluates checkpoint prefix $1 on the eval split (logs in eval/$2) and
# sets EVAL_MIOU.
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
  [[ -f $result ]] || fail "deeplab-eval wrote no $result"
  EVAL_MIOU=$(json_get "$result" miou)
  [[ $EVAL_MIOU =~ ^[0-9.eE+-]+$ ]] || fail "no numeric miou in $result (got '$EVAL_MIOU')"
}

# --- promotion -----------------------------------------------------------------

# Exports checkpoint $1 (mIoU $2) into exports/<stamp>-step<N>, with a copy
# of the checkpoint and its metrics, then switches `current` to it.
promote() {
  local checkpoint=$1 miou=$2 step name tmp extra rc=0 f
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
  printf '{"miou": %s, "global_step": %s, "data_fingerprint": "%s", "eval_split": "%s", "promoted_at": "%s"}\n' \
    "$miou" "$step" "$FINGERPRINT" "$EVAL_SPLIT" "$(date -Iseconds)" >"$tmp/metrics.json"
  mv "$tmp" "$EXPORTS_DIR/$name"
  switch_symlink "$name" "$CURRENT_LINK"
  log "promoted: exports/current -> $name"
  prune_exports
}

# Keeps the newest $KEEP_EXPORTS exports plus the current one.
prune_exports() {
  local current dirs i
  current=$(readlink "$CURRENT_LINK" || true)
  mapfile -t dirs < <(find "$EXPORTS_DIR" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*-step*' -printf '%f\n' | LC_ALL=C sort -r)
  for ((i = KEEP_EXPORTS; i < ${#dirs[@]}; i++)); do
    if [[ ${dirs[i]} != "$current" ]]; then
      log "removing old export ${dirs[i]}"
      rm -rf "${EXPORTS_DIR:?}/${dirs[i]}"
    fi
  done
}

prune_logs() {
  local logs i
  mapfile -t logs < <(find "$LOG_DIR" -maxdepth 1 -type f -name 'cron-*.log' -printf '%f\n' | LC_ALL=C sort -r)
  for ((i = KEEP_LOGS; i < ${#logs[@]}; i++)); do
    rm -f "${LOG_DIR:?}/${logs[i]}"
  done
}

# Prints number $1 with 4 decimals (for messages).
fmt4() { awk -v x="$1" 'BEGIN { printf "%.4f", x }'; }

# Succeeds when $1 >= $2 - $3 (floats).
no_worse_than() {
  awk -v new="$1" -v old="$2" -v margin="$3" 'BEGIN { exit !(new + 0 >= old - margin) }'
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
  # Left by a run that was killed: nothing else writes here while we hold
  # the lock.
  rm -rf "$TFRECORDS_DIR"/.tmp-* "$EXPORTS_DIR"/.tmp-*
  prune_logs
  check_data_dir

  FINGERPRINT=$(data_fingerprint)
  local needs_build=0 needs_train=0 checkpoint step steps decided
  if [[ $(read_state built.fingerprint) != "$FINGERPRINT" || ! -f "$TFRECORD_LINK/dataset.json" ]]; then
    needs_build=1
  fi
  checkpoint=$(latest_checkpoint "$TRAIN_LOGDIR")
  step=$(checkpoint_step "$checkpoint")
  steps=$STEPS_PER_RUN
  if ((step + steps > MAX_TOTAL_STEPS)); then
    steps=$((MAX_TOTAL_STEPS > step ? MAX_TOTAL_STEPS - step : 0))
  fi
  if ((TRAIN_ONLY_ON_NEW_DATA)) && [[ $(read_state trained.fingerprint) == "$FINGERPRINT" ]]; then
    steps=0
  fi
  if ((steps > 0)); then
    needs_train=1
  fi
  decided=$(read_state decided)
  if ((!needs_build && !needs_train)) && [[ -z $checkpoint || $decided == "$step $FINGERPRINT" ]]; then
    if [[ -n $checkpoint ]]; then
      finish "$EXIT_NOTHING_TO_DO" nothing_to_do "data unchanged, no steps to train, checkpoint step $step already evaluated"
    fi
    finish "$EXIT_NOTHING_TO_DO" nothing_to_do "data unchanged, no steps to train and no checkpoint yet"
  fi

  if ((needs_build)); then
    build_tfrecords
    write_state built.fingerprint "$FINGERPRINT"
  fi
  if ((needs_train)); then
    train_more "$steps"
    write_state trained.fingerprint "$FINGERPRINT"
    checkpoint=$(latest_checkpoint "$TRAIN_LOGDIR")
    [[ -n $checkpoint ]] || fail "deeplab-train wrote no checkpoint in $TRAIN_LOGDIR"
    step=$(checkpoint_step "$checkpoint")
  fi
  [[ -n $checkpoint ]] || finish "$EXIT_SUCCESS" rebuilt "TFRecords rebuilt; no steps to train and no checkpoint to evaluate"
  summary_add global_step "$step"
  if [[ $(read_state decided) == "$step $FINGERPRINT" ]]; then
    finish "$EXIT_SUCCESS" unchanged "no new checkpoint (still step $step); nothing to promote"
  fi

  local miou current current_miou current_step="" metrics
  evaluate "$checkpoint" new
  miou=$EVAL_MIOU
  summary_add miou "$miou"
  log "checkpoint step $step: mIoU $(fmt4 "$miou") on $EVAL_SPLIT"
  current=$(readlink "$CURRENT_LINK" || true)
  if [[ -z $current ]]; then
    promote "$checkpoint" "$miou"
    write_state decided "$step $FINGERPRINT"
    finish "$EXIT_SUCCESS" promoted "first model, mIoU $(fmt4 "$miou") (step $step): exports/current -> $(readlink "$CURRENT_LINK")"
  fi
  metrics="$CURRENT_LINK/metrics.json"
  current_step=$(json_get "$metrics" global_step)
  if [[ $current_step == "$step" ]]; then
    write_state decided "$step $FINGERPRINT"
    finish "$EXIT_SUCCESS" kept "the current model already is checkpoint step $step"
  fi
  if [[ $(json_get "$metrics" data_fingerprint) == "$FINGERPRINT" ]]; then
    current_miou=$(json_get "$metrics" miou)
  else
    log "the data changed since the current model was measured: re-evaluating it"
    evaluate "$(latest_checkpoint "$CURRENT_LINK/checkpoint")" current
    current_miou=$EVAL_MIOU
  fi
  summary_add current_miou "$current_miou"
  if no_worse_than "$miou" "$current_miou" "$MIOU_MARGIN"; then
    promote "$checkpoint" "$miou"
    write_state decided "$step $FINGERPRINT"
    finish "$EXIT_SUCCESS" promoted "mIoU $(fmt4 "$miou") (step $step) vs $(fmt4 "$current_miou") (step $current_step): exports/current -> $(readlink "$CURRENT_LINK")"
  fi
  write_state decided "$step $FINGERPRINT"
  finish "$EXIT_SUCCESS" kept "mIoU $(fmt4 "$miou") (step $step) is more than $MIOU_MARGIN below the current model's $(fmt4 "$current_miou") (step $current_step): current model kept"
}

main "$@"
