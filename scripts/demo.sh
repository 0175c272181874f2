#!/usr/bin/env bash
# The demo: the five steps of a DeepLab run on the bundled sample data
# (data/, made by scripts/make_sample_data.py, in PASCAL VOC layout), through
# the PASCAL VOC scripts: convert it to TFRecords, train mobilenet_v2 from
# scratch, evaluate (prints the mIoU), write coloured predictions and export
# a frozen graph + SavedModel. Re-running resumes: the conversion and a
# finished training run are not repeated.
#
# `make demo` runs it as it is; `--quick` is the short check of the VOC
# scripts that the original DeepLab called local_test.sh (local_test.sh
# runs it).
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$SCRIPTS_DIR")
# shellcheck source-path=SCRIPTDIR source=voc_recipe.sh
source "$SCRIPTS_DIR/voc_recipe.sh"

usage() {
  maybe_usage --help <<EOF
Usage: $SCRIPT_NAME [--quick]

Runs download_and_convert_voc2012.sh, train_voc.sh, eval_voc.sh, vis_voc.sh
and export_voc.sh in turn on the sample data. Any variable those scripts
read can be set; an empty value counts as set.

Without an option, the main job (what \`make demo\` runs), in 3 to 7 minutes
on two CPU cores: data/ converted as a 5-class dataset, a half-width
mobilenet_v2 trained from scratch; fails when the val mIoU is below MIN_MIOU.
  WORK       the outputs (tfrecord/, train/, eval/, vis/, export/)
             [work/demo, relative to the repository]
  STEPS      training steps                                  [3000]
  MIN_MIOU   [0.7]
  (and TRAIN_BATCH_SIZE [8], TRAIN_CROP_SIZE [129,129],
  BASE_LEARNING_RATE [0.02], DEPTH_MULTIPLIER [0.5], EXPORT_CROP_SIZE [289,289])

--quick: a short run of the VOC scripts in their own layout, like the
original's local_test.sh: the 21 VOC classes, a tiny model, no mIoU target.
  VOC_SOURCE        folder, tarball or URL to convert      [<repo>/data]
  WORK_DIR          [<repo>/work/local_test]
  RECIPE            [mobilenet_v2]
  DEPTH_MULTIPLIER  [0.25]
  TRAIN_STEPS       [10]
  TRAIN_BATCH_SIZE  [4]
  TRAIN_CROP_SIZE   [129,129]
  EVAL_CROP_SIZE, VIS_CROP_SIZE  [empty: each image padded to the next size
                    the network accepts]
  EXPORT_CROP_SIZE  [289,289] (the sample's images are at most 260 px)
  NUM_SHARDS        [2]
EOF
}

# Exports each NAME=VALUE argument unless NAME is set already.
default() {
  local setting name
  for setting in "$@"; do
    name=${setting%%=*}
    if [[ -z ${!name+set} ]]; then
      export "${setting?}"
    else
      export "${name?}"
    fi
  done
}

# The main job. The sample has background + 4 object classes drawn with
# PASCAL ids 1..4, so it is converted as a 5-class dataset: a 5-way
# classifier learns faster than a 21-way one that never sees 16 of its
# classes. Small crops and a half-width mobilenet_v2 keep this to a few
# minutes on two CPU cores; the model flags are saved in the train logdir's
# deeplab_config.json, so eval, vis and export need none.
demo_settings() {
  WORK=${WORK:-work/demo}
  [[ $WORK == /* ]] || WORK=$REPO/$WORK
  MIN_MIOU=${MIN_MIOU:-0.7}
  default VOC_SOURCE="$REPO/data" WORK_DIR="$WORK" EXP_DIR="$WORK" \
    DATASET=shapes RECIPE=mobilenet_v2 DEPTH_MULTIPLIER=0.5 \
    TRAIN_STEPS="${STEPS:-3000}" TRAIN_SPLIT=train TRAIN_BATCH_SIZE=8 \
    TRAIN_CROP_SIZE=129,129 BASE_LEARNING_RATE=0.02 EVAL_CROP_SIZE= \
    VIS_CROP_SIZE= ALSO_SAVE_RAW_PREDICTIONS=true EXPORT_CROP_SIZE=289,289 \
    SAVED_MODEL_DIR="$WORK/export/saved_model" \
    BUILD_EXTRA_FLAGS="--dataset_name=shapes --num_classes=5 --colormap=pascal --class_names=background,red_disk,green_striped_square,blue_dotted_triangle,yellow_ring"
  TRAIN_ARGS=(--min_scale_factor=0.5 --max_scale_factor=1.5 --log_steps=100
    --save_interval_secs=120 --result_json="$WORK/train_result.json")
  EVAL_RESULT=$WORK/eval_result.json
  VIS_ARGS=(--max_number_of_images=6)
}

# The original's local_test.sh: the VOC scripts' own layout and defaults,
# with a quarter-width model and a few steps.
quick_settings() {
  MIN_MIOU=
  default VOC_SOURCE="$REPO/data" WORK_DIR="$REPO/work/local_test" \
    RECIPE=mobilenet_v2 DEPTH_MULTIPLIER=0.25 TRAIN_STEPS=10 \
    TRAIN_BATCH_SIZE=4 TRAIN_CROP_SIZE=129,129 TRAIN_SPLIT=train \
    EVAL_CROP_SIZE= VIS_CROP_SIZE= EXPORT_CROP_SIZE=289,289 NUM_SHARDS=2
  TRAIN_ARGS=()
  EVAL_RESULT=
  VIS_ARGS=()
}

step() { printf '\n== %s\n' "$*"; }

# Prints the val mIoU and fails below MIN_MIOU (when there is a target).
check_miou() {
  local miou
  miou=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["miou"])' \
    "$EVAL_RESULT")
  if [[ -z $MIN_MIOU ]]; then
    printf '\nval mIoU %s\n' "$miou"
    return
  fi
  printf '\nval mIoU %s (demo target >= %s)\n' "$miou" "$MIN_MIOU"
  python -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' \
    "$miou" "$MIN_MIOU" || { echo "demo: mIoU below $MIN_MIOU" >&2; exit 1; }
}

main() {
  local preset=demo arg
  for arg in "$@"; do
    case $arg in
      -h | --help) usage ;;
      --quick) preset=quick ;;
      *) die "unknown argument '$arg' (see -h)" ;;
    esac
  done
  "${preset}_settings"
  # Checked now, not after the steps that come before their use.
  [[ -z $MIN_MIOU || $MIN_MIOU =~ ^[0-9]*\.?[0-9]+$ ]] ||
    die "MIN_MIOU must be a number (an mIoU between 0 and 1), got '$MIN_MIOU'"
  require_int "TRAIN_STEPS${STEPS+ (from STEPS)}" "$TRAIN_STEPS"
  export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
  # The same folders as the scripts below compute, for the messages.
  set_voc_paths
  export WORK_DIR DATASET DATASET_DIR EXP_DIR TRAIN_LOGDIR EVAL_LOGDIR \
    VIS_LOGDIR EXPORT_DIR
  default OUTPUT_DIR="$DATASET_DIR"
  EVAL_RESULT=${EVAL_RESULT:-$EVAL_LOGDIR/eval_result.json}

  # Each step through `run`: a signal to this script alone reaches the
  # step, which ends first (training saves a checkpoint), then this script.
  step "1/5 convert $VOC_SOURCE to TFRecords in $DATASET_DIR"
  run bash "$SCRIPTS_DIR/download_and_convert_voc2012.sh" "$VOC_SOURCE"
  step "2/5 train $MODEL_VARIANT for $TRAIN_STEPS steps in $TRAIN_LOGDIR"
  run bash "$SCRIPTS_DIR/train_voc.sh" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
  step "3/5 evaluate on the ${EVAL_SPLIT:-val} split"
  run bash "$SCRIPTS_DIR/eval_voc.sh" --eval_result_json="$EVAL_RESULT"
  step "4/5 coloured predictions in $VIS_LOGDIR"
  run bash "$SCRIPTS_DIR/vis_voc.sh" ${VIS_ARGS[@]+"${VIS_ARGS[@]}"}
  step "5/5 export a frozen graph to $EXPORT_DIR"
  run bash "$SCRIPTS_DIR/export_voc.sh"
  check_miou
  log "done: checkpoints in $TRAIN_LOGDIR, results in $EVAL_LOGDIR, pictures in $VIS_LOGDIR, graph in $EXPORT_DIR"
}

main "$@"
