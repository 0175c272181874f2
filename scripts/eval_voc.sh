#!/usr/bin/env bash
# Evaluates the latest PASCAL VOC checkpoint of train_voc.sh (mIoU over a
# split). Extra arguments go to deeplab-eval as they are.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=voc_recipe.sh
source "$(dirname "${BASH_SOURCE[0]}")/voc_recipe.sh"

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
  MAX_NUMBER_OF_EVALUATIONS  [1] (0: follow the train logdir forever; started
                             before its first checkpoint, the model comes
                             from the deeplab_config.json saved with it)
  EVAL_EXTRA_FLAGS           more deeplab-eval flags (space separated)
EOF

main() {
  set_voc_paths
  run_on_train_logdir eval MAX_NUMBER_OF_EVALUATIONS ADD_FLIPPED_IMAGES "$@"
}

main "$@"
