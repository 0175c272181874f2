#!/usr/bin/env bash
# A short end-to-end run of the PASCAL VOC scripts, like the original
# local_test.sh: convert, train a few steps, evaluate, visualise, export.
# By default it runs on the bundled sample data (data/, in VOC layout) with a
# tiny mobilenet_v2, so it finishes in a minute or two on a CPU.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$SCRIPTS_DIR/common.sh"

maybe_usage "${1:-}" <<EOF
Usage: $SCRIPT_NAME

Runs download_and_convert_voc2012.sh, train_voc.sh, eval_voc.sh, vis_voc.sh
and export_voc.sh in turn. Any variable those scripts read can be set; the
defaults here are small:
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

main() {
  local repo
  repo=$(dirname "$SCRIPTS_DIR")
  export VOC_SOURCE=${VOC_SOURCE:-$repo/data}
  export WORK_DIR=${WORK_DIR:-$repo/work/local_test}
  export RECIPE=${RECIPE:-mobilenet_v2}
  export DEPTH_MULTIPLIER=${DEPTH_MULTIPLIER-0.25}
  export TRAIN_STEPS=${TRAIN_STEPS:-10}
  export TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-4}
  export TRAIN_CROP_SIZE=${TRAIN_CROP_SIZE:-129,129}
  export TRAIN_SPLIT=${TRAIN_SPLIT:-train}
  export EVAL_CROP_SIZE=${EVAL_CROP_SIZE-}
  export VIS_CROP_SIZE=${VIS_CROP_SIZE-}
  export EXPORT_CROP_SIZE=${EXPORT_CROP_SIZE:-289,289}
  export NUM_SHARDS=${NUM_SHARDS:-2}
  export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

  log "1/5 convert $VOC_SOURCE"
  bash "$SCRIPTS_DIR/download_and_convert_voc2012.sh" "$VOC_SOURCE"
  log "2/5 train $TRAIN_STEPS steps"
  bash "$SCRIPTS_DIR/train_voc.sh"
  log "3/5 evaluate"
  bash "$SCRIPTS_DIR/eval_voc.sh"
  log "4/5 visualise"
  bash "$SCRIPTS_DIR/vis_voc.sh"
  log "5/5 export"
  bash "$SCRIPTS_DIR/export_voc.sh"
  set_recipe_defaults
  set_voc_paths
  log "done: checkpoints in $TRAIN_LOGDIR, results in $EVAL_LOGDIR, pictures in $VIS_LOGDIR, graph in $EXPORT_DIR"
}

main "$@"
