# shellcheck shell=bash
# The PASCAL VOC recipes, in one place: the model flags of each recipe
# (RECIPE=xception_65 or mobilenet_v2), the training and inference flags
# built on them, and the folder layout. Sourced by train_voc.sh,
# eval_voc.sh, vis_voc.sh, export_voc.sh, demo.sh and cron_retrain.sh (it
# sources common.sh); not meant to be run on its own.

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Sets the model variables of a recipe unless the caller already set them.
# A variable set to the empty string (ATROUS_RATES=) switches that part off.
#   xception_65:  ASPP rates 6,12,18 and the decoder at stride 4 (the
#                 original's local_test.sh)
#   mobilenet_v2: no ASPP rates and no decoder (local_test_mobilenetv2.sh and
#                 the model-zoo mobilenet_v2 PASCAL checkpoints)
set_recipe_defaults() {
  RECIPE=${RECIPE:-xception_65}
  case $RECIPE in
    xception_65)
      MODEL_VARIANT=${MODEL_VARIANT:-xception_65}
      ATROUS_RATES=${ATROUS_RATES-6,12,18}
      DECODER_OUTPUT_STRIDE=${DECODER_OUTPUT_STRIDE-4}
      ;;
    mobilenet_v2)
      MODEL_VARIANT=${MODEL_VARIANT:-mobilenet_v2}
      ATROUS_RATES=${ATROUS_RATES-}
      DECODER_OUTPUT_STRIDE=${DECODER_OUTPUT_STRIDE-}
      ;;
    *) die "RECIPE must be xception_65 or mobilenet_v2, got '$RECIPE'" ;;
  esac
  OUTPUT_STRIDE=${OUTPUT_STRIDE:-16}
  DEPTH_MULTIPLIER=${DEPTH_MULTIPLIER:-}
}

# Fills the array MODEL_FLAGS with the recipe's model flags.
build_model_flags() {
  local rates rate
  MODEL_FLAGS=(--model_variant="$MODEL_VARIANT" --output_stride="$OUTPUT_STRIDE")
  IFS=', ' read -r -a rates <<<"$ATROUS_RATES"
  for rate in "${rates[@]}"; do
    MODEL_FLAGS+=(--atrous_rates="$rate")
  done
  if [[ -n $DECODER_OUTPUT_STRIDE ]]; then
    MODEL_FLAGS+=(--decoder_output_stride="$DECODER_OUTPUT_STRIDE")
  fi
  if [[ -n $DEPTH_MULTIPLIER ]]; then
    MODEL_FLAGS+=(--depth_multiplier="$DEPTH_MULTIPLIER")
  fi
}

# Fills MODEL_FLAGS for eval/vis/export reading checkpoints from folder $1:
# empty when deeplab-train saved its model options there (they are read back,
# and repeating them could only contradict them), else the recipe's flags
# (e.g. a model-zoo checkpoint).
model_flags_for_checkpoint_dir() {
  if [[ -f "$1/deeplab_config.json" ]]; then
    MODEL_FLAGS=()
  else
    build_model_flags
  fi
}

# Fills TRAIN_FLAGS with the deeplab-train flags of both training scripts
# (train_voc.sh, cron_retrain.sh): dataset $1 in folder $2, split $3,
# logdir $4, the recipe's model flags, then TRAIN_CROP_SIZE [513,513] and
# TRAIN_BATCH_SIZE, BASE_LEARNING_RATE and FINE_TUNE_BATCH_NORM, whose
# defaults differ by script: $5, $6 and $7.
# shellcheck disable=SC2034  # read by the scripts that source this file
recipe_train_flags() {
  build_model_flags
  TRAIN_FLAGS=(
    --dataset="$1" --dataset_dir="$2" --train_split="$3" --train_logdir="$4"
    "${MODEL_FLAGS[@]}"
    --train_crop_size="${TRAIN_CROP_SIZE:-513,513}"
    --train_batch_size="${TRAIN_BATCH_SIZE:-$5}"
    --base_learning_rate="${BASE_LEARNING_RATE:-$6}"
    --fine_tune_batch_norm="${FINE_TUNE_BATCH_NORM:-$7}"
  )
}

# Fills INFERENCE_FLAGS with the flags deeplab-eval ($1=eval) and deeplab-vis
# ($1=vis) share: dataset $2 in folder $3, split $4, checkpoints $5 (a
# folder or a prefix), logdir $6, and the crop $7 (none when empty: each
# image is padded to the next size the network accepts).
# shellcheck disable=SC2034  # read by the scripts that source this file
inference_flags() {
  INFERENCE_FLAGS=(--dataset="$2" --dataset_dir="$3" --"$1"_split="$4"
    --checkpoint_dir="$5" --"$1"_logdir="$6")
  if [[ -n $7 ]]; then
    INFERENCE_FLAGS+=(--"$1"_crop_size="$7")
  fi
}

# Runs deeplab-$1 (eval or vis) on the checkpoints of $TRAIN_LOGDIR, as
# eval_voc.sh and vis_voc.sh do. The command's variables are named after it
# (EVAL_SPLIT [val], EVAL_LOGDIR, EVAL_CROP_SIZE [513,513], EVAL_EXTRA_FLAGS;
# VIS_...). $2 and $3 name two variables that are named after their flag:
# the number of runs [1] (0 follows the logdir, so no checkpoint is needed
# yet) and a switch [false]. The script's own arguments follow.
run_on_train_logdir() {
  local kind=$1 count_name=$2 switch_name=$3 count prefix extra
  shift 3
  prefix=${kind^^}
  local split_name=${prefix}_SPLIT logdir_name=${prefix}_LOGDIR
  local crop_name=${prefix}_CROP_SIZE extra_name=${prefix}_EXTRA_FLAGS
  count=${!count_name:-1}
  require_int "$count_name" "$count"
  need_cmd "deeplab-$kind"
  if [[ -n $(latest_checkpoint "$TRAIN_LOGDIR") ]]; then
    model_flags_for_checkpoint_dir "$TRAIN_LOGDIR"
  elif ((10#$count == 0)); then
    # Following a run that has not saved yet: deeplab-train writes its
    # deeplab_config.json with the first checkpoint, and deeplab-$kind
    # waits for it; recipe flags would contradict another recipe's run.
    MODEL_FLAGS=()
  else
    die "no checkpoint in TRAIN_LOGDIR=$TRAIN_LOGDIR: run train_voc.sh first"
  fi
  inference_flags "$kind" "$DATASET" "$DATASET_DIR" "${!split_name:-val}" \
    "$TRAIN_LOGDIR" "${!logdir_name}" "${!crop_name-513,513}"
  repeat_flag eval_scales "${EVAL_SCALES:-1.0}"
  split_words extra "${!extra_name:-}"
  mkdir -p "${!logdir_name}"
  run "deeplab-$kind" "${INFERENCE_FLAGS[@]}" "${REPEATED_FLAGS[@]}" \
    --"${switch_name,,}"="${!switch_name:-false}" --"${count_name,,}"="$count" \
    ${MODEL_FLAGS[@]+"${MODEL_FLAGS[@]}"} ${extra[@]+"${extra[@]}"} "$@"
}

# Sets the recipe and the folder layout shared by the PASCAL VOC scripts
# (the original's pascal_voc_seg/{tfrecord,exp/...} tree) unless the caller
# set them.
set_voc_paths() {
  set_recipe_defaults
  WORK_DIR=${WORK_DIR:-./pascal_voc_seg}
  DATASET=${DATASET:-pascal_voc_seg}
  DATASET_DIR=${DATASET_DIR:-$WORK_DIR/tfrecord}
  EXP_DIR=${EXP_DIR:-$WORK_DIR/exp/$RECIPE}
  TRAIN_LOGDIR=${TRAIN_LOGDIR:-$EXP_DIR/train}
  EVAL_LOGDIR=${EVAL_LOGDIR:-$EXP_DIR/eval}
  VIS_LOGDIR=${VIS_LOGDIR:-$EXP_DIR/vis}
  EXPORT_DIR=${EXPORT_DIR:-$EXP_DIR/export}
}

# The environment variables every PASCAL VOC script reads, for usage texts.
voc_paths_help() {
  cat <<'HELP'
Recipe and folders (environment variables, with their defaults):
  RECIPE                xception_65 | mobilenet_v2                [xception_65]
  MODEL_VARIANT, OUTPUT_STRIDE, ATROUS_RATES, DECODER_OUTPUT_STRIDE,
  DEPTH_MULTIPLIER      override the recipe's model flags; an empty value
                        (ATROUS_RATES=) switches that part off. xception_65:
                        OS 16, rates 6,12,18, decoder 4; mobilenet_v2: OS 16,
                        no rates, no decoder (as the model-zoo checkpoints).
  WORK_DIR              [./pascal_voc_seg]
  DATASET               [pascal_voc_seg]
  DATASET_DIR           TFRecords + dataset.json        [$WORK_DIR/tfrecord]
  EXP_DIR               [$WORK_DIR/exp/$RECIPE]
  TRAIN_LOGDIR          checkpoints                     [$EXP_DIR/train]
  EVAL_LOGDIR, VIS_LOGDIR, EXPORT_DIR                   [$EXP_DIR/{eval,vis,export}]
HELP
}

# Prints the usage text given on stdin plus the shared variables, when the
# first argument asks for help; exits then.
maybe_usage() {
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    cat
    echo
    voc_paths_help
    exit 0
  fi
}
