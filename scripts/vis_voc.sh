#!/usr/bin/env bash
# Writes colored predictions of the latest PASCAL VOC checkpoint of
# train_voc.sh. Extra arguments go to deeplab-vis as they are.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

maybe_usage "${1:-}" <<EOF
Usage: $SCRIPT_NAME [extra deeplab-vis flags]

Writes colored prediction PNGs of the latest checkpoint in \$TRAIN_LOGDIR for
\$VIS_SPLIT into \$VIS_LOGDIR. Model flags are read from the deeplab_config.json
saved with the checkpoints (the recipe's flags are passed only without one).

Visualisation (environment variables, with their defaults):
  VIS_SPLIT                  [val]
  VIS_CROP_SIZE              [513,513] (must cover the largest image; empty:
                             pad each image to the next size that fits)
  EVAL_SCALES                [1.0]
  ALSO_SAVE_RAW_PREDICTIONS  [false] (raw label PNGs, e.g. for the test server)
  MAX_NUMBER_OF_ITERATIONS   [1] (accepted as in the original; deeplab-vis
                             draws the latest checkpoint once)
  VIS_EXTRA_FLAGS            more deeplab-vis flags (space separated)
EOF

main() {
  set_recipe_defaults
  set_voc_paths
  local iterations=${MAX_NUMBER_OF_ITERATIONS:-1} extra
  require_int MAX_NUMBER_OF_ITERATIONS "$iterations"
  need_cmd deeplab-vis
  [[ -n $(latest_checkpoint "$TRAIN_LOGDIR") || $iterations == 0 ]] ||
    die "no checkpoint in TRAIN_LOGDIR=$TRAIN_LOGDIR: run train_voc.sh first"
  model_flags_for_checkpoint_dir "$TRAIN_LOGDIR"
  optional_flag vis_crop_size "${VIS_CROP_SIZE-513,513}"
  repeat_flag eval_scales "${EVAL_SCALES:-1.0}"
  split_words extra "${VIS_EXTRA_FLAGS:-}"
  mkdir -p "$VIS_LOGDIR"
  run deeplab-vis \
    --dataset="$DATASET" \
    --dataset_dir="$DATASET_DIR" \
    --vis_split="${VIS_SPLIT:-val}" \
    --checkpoint_dir="$TRAIN_LOGDIR" \
    --vis_logdir="$VIS_LOGDIR" \
    ${OPTIONAL_FLAGS[@]+"${OPTIONAL_FLAGS[@]}"} \
    "${REPEATED_FLAGS[@]}" \
    --also_save_raw_predictions="${ALSO_SAVE_RAW_PREDICTIONS:-false}" \
    --max_number_of_iterations="$iterations" \
    ${MODEL_FLAGS[@]+"${MODEL_FLAGS[@]}"} \
    ${extra[@]+"${extra[@]}"} "$@"
}

main "$@"
