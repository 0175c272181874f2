#!/usr/bin/env bash
# Writes colored predictions of the latest PASCAL VOC checkpoint of
# train_voc.sh. Extra arguments go to deeplab-vis as they are.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=voc_recipe.sh
source "$(dirname "${BASH_SOURCE[0]}")/voc_recipe.sh"

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
  set_voc_paths
  run_on_train_logdir vis MAX_NUMBER_OF_ITERATIONS ALSO_SAVE_RAW_PREDICTIONS "$@"
}

main "$@"
