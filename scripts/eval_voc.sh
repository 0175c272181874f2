#!/usr/bin/env bash
# Evaluates the latest PASCAL VOC checkpoint of train_voc.sh (mIoU over a
# split). Extra arguments go to deeplab-eval as they are.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

maybe_usage "${1:-}" <<EOF
Usage: $SCRIPT_NAME [extra deeplab-eval flags]

Evaluates the checkpoints in \$TRAIN_LOGDIR on \$EVAL_SPLIT. The model flags are
read from the deeplab_config.json that deeplab-train saved there (the recipe's
flags are passed only when there is none, e.g. for a model-zoo checkpoint).

Evaluation (environment variables, with their defaults):
  EVAL_SPLIT                 [val]
  EVAL_CROP_SIZE             [513,513] (must cover the largest image; empty:
                             pad each image to the next size that fits)
  EVAL_SCALES                [1.0] (e.g. 0.5,0.75,1.0,1.25,1.5,1.75)
  ADD_FLIPPED_IMAGES         [false]
  MAX_NUMBER_OF_EVALUATIONS  [1] (0: follow the train logdir forever)
  EVAL_EXTRA_FLAGS           more deeplab-eval flags (space separated)
EOF

main() {
  set_recipe_defaults
  set_voc_paths
  local evals=${MAX_NUMBER_OF_EVALUATIONS:-1} extra
  require_int MAX_NUMBER_OF_EVALUATIONS "$evals"
  need_cmd deeplab-eval
  [[ -n $(latest_checkpoint "$TRAIN_LOGDIR") || $evals == 0 ]] ||
    die "no checkpoint in TRAIN_LOGDIR=$TRAIN_LOGDIR: run train_voc.sh first"
  model_flags_for_checkpoint_dir "$TRAIN_LOGDIR"
  optional_flag eval_crop_size "${EVAL_CROP_SIZE-513,513}"
  repeat_flag eval_scales "${EVAL_SCALES:-1.0}"
  split_words extra "${EVAL_EXTRA_FLAGS:-}"
  mkdir -p "$EVAL_LOGDIR"
  run deeplab-eval \
    --dataset="$DATASET" \
    --dataset_dir="$DATASET_DIR" \
    --eval_split="${EVAL_SPLIT:-val}" \
    --checkpoint_dir="$TRAIN_LOGDIR" \
    --eval_logdir="$EVAL_LOGDIR" \
    ${OPTIONAL_FLAGS[@]+"${OPTIONAL_FLAGS[@]}"} \
    "${REPEATED_FLAGS[@]}" \
    --add_flipped_images="${ADD_FLIPPED_IMAGES:-false}" \
    --max_number_of_evaluations="$evals" \
    ${MODEL_FLAGS[@]+"${MODEL_FLAGS[@]}"} \
    ${extra[@]+"${extra[@]}"} "$@"
}

main "$@"
