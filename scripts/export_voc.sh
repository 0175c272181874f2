#!/usr/bin/env bash
# Exports a PASCAL VOC checkpoint of train_voc.sh as a frozen inference graph
# (ImageTensor:0 -> SemanticPredictions:0). Extra arguments go to
# deeplab-export as they are.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=voc_recipe.sh
source "$(dirname "${BASH_SOURCE[0]}")/voc_recipe.sh"

maybe_usage "${1:-}" <<EOF
Usage: $SCRIPT_NAME [extra deeplab-export flags]

Export (environment variables, with their defaults):
  CHECKPOINT_PATH     [the latest checkpoint in \$TRAIN_LOGDIR]
  EXPORT_PATH         [\$EXPORT_DIR/frozen_inference_graph.pb]
  SAVED_MODEL_DIR     also write a SavedModel there        [unset]
  NUM_CLASSES         [21] (only for checkpoints without deeplab_config.json)
  EXPORT_CROP_SIZE    largest input the graph accepts     [513,513]
  INFERENCE_SCALES    [1.0]
  EXPORT_EXTRA_FLAGS  more deeplab-export flags (space separated)
Model flags come from the deeplab_config.json beside the checkpoint (the
recipe's flags are passed only without one, e.g. for a model-zoo checkpoint).
EOF

main() {
  set_voc_paths
  local checkpoint=${CHECKPOINT_PATH:-} export_path extra export_flags=()
  if [[ -z $checkpoint ]]; then
    checkpoint=$(latest_checkpoint "$TRAIN_LOGDIR")
    [[ -n $checkpoint ]] || die "no checkpoint in TRAIN_LOGDIR=$TRAIN_LOGDIR: run train_voc.sh first (or set CHECKPOINT_PATH)"
  fi
  export_path=${EXPORT_PATH:-$EXPORT_DIR/frozen_inference_graph.pb}
  need_cmd deeplab-export
  # A folder (deeplab-export takes its latest checkpoint) holds the config.
  if [[ -d $checkpoint ]]; then
    model_flags_for_checkpoint_dir "$checkpoint"
  else
    model_flags_for_checkpoint_dir "$(dirname "$checkpoint")"
  fi
  if ((${#MODEL_FLAGS[@]})); then
    # No saved model options: the flags describe the network.
    export_flags=(--num_classes="${NUM_CLASSES:-21}")
  fi
  repeat_flag inference_scales "${INFERENCE_SCALES:-1.0}"
  if [[ -n ${SAVED_MODEL_DIR:-} ]]; then
    export_flags+=(--saved_model_dir="$SAVED_MODEL_DIR")
  fi
  split_words extra "${EXPORT_EXTRA_FLAGS:-}"
  mkdir -p "$(dirname "$export_path")"
  run deeplab-export \
    --checkpoint_path="$checkpoint" \
    --export_path="$export_path" \
    --crop_size="${EXPORT_CROP_SIZE:-513,513}" \
    ${export_flags[@]+"${export_flags[@]}"} \
    "${REPEATED_FLAGS[@]}" \
    ${MODEL_FLAGS[@]+"${MODEL_FLAGS[@]}"} \
    ${extra[@]+"${extra[@]}"} "$@"
}

main "$@"
