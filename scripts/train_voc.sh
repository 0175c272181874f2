#!/usr/bin/env bash
# Trains DeepLab on PASCAL VOC 2012 with one of the original's two recipes
# (xception_65 or mobilenet_v2). Extra arguments go to deeplab-train as they
# are; every path and number below can be set from the environment.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=voc_recipe.sh
source "$(dirname "${BASH_SOURCE[0]}")/voc_recipe.sh"

maybe_usage "${1:-}" <<EOF
Usage: $SCRIPT_NAME [extra deeplab-train flags]

Trains on the TFRecords made by download_and_convert_voc2012.sh; resumes from
the latest checkpoint in \$TRAIN_LOGDIR when there is one.

Training (environment variables, with their defaults):
  TRAIN_SPLIT           train_aug when its TFRecords exist, else train
  TRAIN_STEPS           --training_number_of_steps            [30000]
  TRAIN_BATCH_SIZE      [16] (over all clones; with FINE_TUNE_BATCH_NORM=true
                        keep it >= 12, as the original's documentation says)
  BASE_LEARNING_RATE    [0.007] (train_aug from an ImageNet checkpoint)
  FINE_TUNE_BATCH_NORM  [true]
  TRAIN_CROP_SIZE       [513,513]
  NUM_CLONES            towers, e.g. one per GPU            [1]
  MAX_RUN_SECONDS       stop (with a checkpoint) after this many seconds [unset]
  INIT_CHECKPOINT       checkpoint prefix to start from     [unset: scratch]
  INIT_CHECKPOINT_URL   a model-zoo tarball to download into \$WORK_DIR/init_models
                        and start from, e.g. (xception_65, ImageNet)
                        http://download.tensorflow.org/models/deeplabv3_xception_2018_01_04.tar.gz
                        or (PASCAL train_aug, for fine-tuning)
                        http://download.tensorflow.org/models/deeplabv3_pascal_train_aug_2018_01_04.tar.gz
                        http://download.tensorflow.org/models/deeplabv3_mnv2_pascal_train_aug_2018_01_29.tar.gz
  TRAIN_EXTRA_FLAGS     more deeplab-train flags (space separated)

Fine-tuning on trainval with a small batch, as the original's local_test.sh:
  TRAIN_SPLIT=trainval BASE_LEARNING_RATE=0.0001 TRAIN_BATCH_SIZE=4 \\
  FINE_TUNE_BATCH_NORM=false INIT_CHECKPOINT_URL=... $SCRIPT_NAME
EOF

# Downloads and unpacks tarball URL $1 into folder $2 (once), then prints the
# checkpoint prefix found inside it.
fetch_init_checkpoint() {
  local url=$1 dir=$2 name tmp index status
  name=$(basename "${url%%\?*}")
  name=${name%.tar.gz}
  name=${name%.tgz}
  name=${name%.tar}
  if [[ ! -d "$dir/$name" ]]; then
    mkdir -p "$dir"
    tmp="$dir/.$name.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    log "downloading the initial checkpoint $url"
    # This runs in a command substitution, where errexit does not apply:
    # each step is checked, and only a complete folder is moved into place
    # (a re-run skips the download when it is there).
    if command -v curl >/dev/null 2>&1; then
      curl -fL --retry 3 -o "$tmp/download" "$url" >&2
    else
      wget -O "$tmp/download" "$url" >&2
    fi || {
      status=$?
      rm -rf "$tmp"
      die "downloading $url failed (exit status $status): check the URL and the network, or download it yourself and set INIT_CHECKPOINT to the checkpoint prefix inside"
    }
    tar -xf "$tmp/download" -C "$tmp" || {
      rm -rf "$tmp"
      die "cannot unpack $url (not a tarball, or truncated); nothing was kept"
    }
    rm -f "$tmp/download"
    index=$(find "$tmp" -name '*.index' -print | LC_ALL=C sort | tail -n 1)
    if [[ -z $index ]]; then
      rm -rf "$tmp"
      die "$url holds no TensorFlow checkpoint (*.index file); nothing was kept"
    fi
    mv "$tmp" "$dir/$name"
  fi
  index=$(find "$dir/$name" -name '*.index' -print | LC_ALL=C sort | tail -n 1)
  [[ -n $index ]] || die "$dir/$name (from $url) holds no TensorFlow checkpoint (*.index file): remove that folder to download it again"
  printf '%s\n' "${index%.index}"
}

main() {
  set_voc_paths
  if [[ -z ${TRAIN_SPLIT:-} ]]; then
    if compgen -G "$DATASET_DIR/train_aug-*.tfrecord" >/dev/null; then
      TRAIN_SPLIT=train_aug
    else
      TRAIN_SPLIT=train
      log "no train_aug TFRecords in $DATASET_DIR: training on 'train' (build train_aug with download_and_convert_voc2012.sh --sbd_labels)"
    fi
  fi
  local steps=${TRAIN_STEPS:-30000} batch=${TRAIN_BATCH_SIZE:-16}
  local clones=${NUM_CLONES:-1} init=${INIT_CHECKPOINT:-}
  require_int TRAIN_STEPS "$steps"
  require_int TRAIN_BATCH_SIZE "$batch"
  require_int NUM_CLONES "$clones"
  need_cmd deeplab-train
  [[ -f "$DATASET_DIR/dataset.json" ]] ||
    die "no dataset.json in DATASET_DIR=$DATASET_DIR: run download_and_convert_voc2012.sh first"
  if [[ -z $init && -n ${INIT_CHECKPOINT_URL:-} ]]; then
    init=$(fetch_init_checkpoint "$INIT_CHECKPOINT_URL" "$WORK_DIR/init_models")
  fi

  local extra
  recipe_train_flags "$DATASET" "$DATASET_DIR" "$TRAIN_SPLIT" "$TRAIN_LOGDIR" \
    16 0.007 true
  local flags=("${TRAIN_FLAGS[@]}" --num_clones="$clones"
    --training_number_of_steps="$steps")
  if [[ -n $init ]]; then
    flags+=(--tf_initial_checkpoint="$init")
  elif [[ -z $(latest_checkpoint "$TRAIN_LOGDIR") ]]; then
    log "WARNING: no INIT_CHECKPOINT or INIT_CHECKPOINT_URL: training from scratch (see -h for the model-zoo checkpoints)"
  fi
  if [[ -n ${MAX_RUN_SECONDS:-} ]]; then
    require_int MAX_RUN_SECONDS "$MAX_RUN_SECONDS"
    flags+=(--max_run_seconds="$MAX_RUN_SECONDS")
  fi
  split_words extra "${TRAIN_EXTRA_FLAGS:-}"
  mkdir -p "$TRAIN_LOGDIR"
  run deeplab-train "${flags[@]}" ${extra[@]+"${extra[@]}"} "$@"
}

main "$@"
