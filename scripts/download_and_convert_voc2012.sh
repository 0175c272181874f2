#!/usr/bin/env bash
# Downloads PASCAL VOC 2012 (or takes a local tarball / extracted folder),
# verifies the tarball's checksum, extracts it and converts it into sharded
# TFRecords + dataset.json with deeplab-build-data (palette labels become
# class-id labels there). Optionally adds the SBD `train_aug` split.
#
# Every step ends by writing a marker under $WORK_DIR/.done (atomically, after
# its output is renamed into place); a re-run skips the steps whose marker
# matches their inputs, and an interrupted run leaves only temp names behind.
set -euo pipefail

SCRIPT_NAME=$(basename "$0")
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source-path=SCRIPTDIR source=fetch.sh
source "$(dirname "${BASH_SOURCE[0]}")/fetch.sh"

readonly DEFAULT_URL="http://host.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar"
readonly OFFICIAL_ARCHIVE="VOCtrainval_11-May-2012.tar"
# MD5 of the official VOCtrainval_11-May-2012.tar (as published by the
# dataset loaders that verify it, e.g. torchvision's VOC dataset).
readonly OFFICIAL_CHECKSUM="6cd6e144f989b92b3379bac3b3de84fd"

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [options] [SOURCE]

Builds PASCAL VOC 2012 TFRecords and dataset.json for deeplab-train.

SOURCE (default \$VOC_SOURCE, else the official URL):
  an http(s)/ftp/file:// URL   downloaded into \$DOWNLOAD_DIR, then verified
  a local .tar file            verified, then extracted
  an extracted folder          VOCdevkit/, its parent, or VOC2012/ itself
                               (JPEGImages, SegmentationClass, ImageSets)

Options (each also settable by the environment variable in brackets):
  --work_dir DIR       where everything is written [WORK_DIR, ./pascal_voc_seg]
  --output_dir DIR     TFRecords + dataset.json [OUTPUT_DIR, \$WORK_DIR/tfrecord]
  --checksum HEX       expected MD5 (32 hex digits), SHA-1 (40) or SHA-256
                       (64) of the tarball [CHECKSUM]. The official tarball
                       is checked against its known MD5 by default; any other
                       tarball without --checksum is used unverified, with a
                       warning.
  --sbd_labels DIR     SBD labels as PNGs of class ids or palette indices
                       (e.g. SegmentationClassAug) [SBD_LABELS]; adds the
                       train_aug split (VOC labels win where both exist)
  --train_aug_list F   ids of train_aug [TRAIN_AUG_LIST]; default: the SBD
                       ids plus VOC train, minus VOC val
  --num_shards N       shards per split [NUM_SHARDS, 4]
  -h, --help           this text

Other environment variables:
  DOWNLOAD_DIR         where a URL is downloaded to [\$WORK_DIR]
  BUILD_EXTRA_FLAGS    extra deeplab-build-data flags (space separated)

Re-running skips finished steps; delete \$WORK_DIR/.done to redo them all.
Example:
  $SCRIPT_NAME --work_dir /data/pascal_voc_seg
  $SCRIPT_NAME ~/Downloads/VOCtrainval_11-May-2012.tar
EOF
}

readonly STEPS=(download verify extract lists tfrecord)

# Prints the VOC2012-like folder (with JPEGImages/) inside folder $1.
find_voc_root() {
  local candidate
  for candidate in "$1/VOCdevkit/VOC2012" "$1/VOC2012" "$1"; do
    if [[ -d "$candidate/JPEGImages" ]]; then
      printf '%s\n' "$candidate"
      return
    fi
  done
  candidate=$(find "$1" -maxdepth 4 -type d -name JPEGImages -print -quit)
  if [[ -n $candidate ]]; then
    dirname "$candidate"
  fi
}

untar() { tar -xf "$1" -C "$2"; }

check_voc_root() {
  local sub
  for sub in JPEGImages SegmentationClass ImageSets/Segmentation; do
    [[ -d "$VOC_ROOT/$sub" ]] || die "$VOC_ROOT/$sub is missing: is $SOURCE a PASCAL VOC 2012 folder or tarball?"
  done
}

# --- lists and labels --------------------------------------------------------

# Prints the train_aug ids: SBD ids plus VOC train, minus VOC val, keeping
# only ids that have an image.
default_train_aug_ids() {
  local seg=$VOC_ROOT/ImageSets/Segmentation id
  {
    find -L "$SBD_LABELS" -maxdepth 1 -name '*.png' -printf '%f\n' | sed 's/\.png$//'
    cat "$seg/train.txt"
  } | tr -d '\r' | LC_ALL=C sort -u | LC_ALL=C comm -23 - <(tr -d '\r' <"$seg/val.txt" | LC_ALL=C sort -u) |
    while IFS= read -r id; do
      if [[ -n $id && -f "$VOC_ROOT/JPEGImages/$id.jpg" ]]; then
        printf '%s\n' "$id"
      fi
    done
}

# Symlinks SBD labels, then VOC labels over them, into folder $1.
merge_labels() {
  local out=$1 f
  mkdir -p "$out"
  for f in "$(realpath "$SBD_LABELS")"/*.png "$(realpath "$VOC_ROOT/SegmentationClass")"/*.png; do
    if [[ -e $f ]]; then
      ln -sfn "$f" "$out/$(basename "$f")"
    fi
  done
}

make_lists() {
  local key tmp
  key="$SOURCE_KEY|sbd=$SBD_KEY"
  LIST_DIR="$WORK_DIR/lists"
  LABEL_DIR="$VOC_ROOT/SegmentationClass"
  if [[ -n $SBD_LABELS ]]; then
    LABEL_DIR="$WORK_DIR/SegmentationClassAug"
  fi
  if [[ -d $LIST_DIR && -d $LABEL_DIR ]] && step_done lists "$key"; then
    log "lists: split lists made earlier, skipping"
    return
  fi
  invalidate_from lists
  log "lists: collecting the split lists into $LIST_DIR"
  tmp="$WORK_DIR/.lists.tmp"
  rm -rf "$tmp" "$tmp.labels"
  mkdir -p "$tmp"
  cp "$VOC_ROOT"/ImageSets/Segmentation/*.txt "$tmp/"
  if [[ -n $SBD_LABELS ]]; then
    log "lists: adding the SBD train_aug split from $SBD_LABELS"
    if [[ -n $TRAIN_AUG_LIST ]]; then
      cp "$TRAIN_AUG_LIST" "$tmp/train_aug.txt"
    else
      default_train_aug_ids >"$tmp/train_aug.txt"
    fi
    [[ -s "$tmp/train_aug.txt" ]] || die "train_aug would be empty: no SBD label in $SBD_LABELS has an image in $VOC_ROOT/JPEGImages"
    merge_labels "$tmp.labels"
    rm -rf "$LABEL_DIR"
    mv "$tmp.labels" "$LABEL_DIR"
  fi
  rm -rf "$LIST_DIR"
  mv "$tmp" "$LIST_DIR"
  mark_done lists "$key"
}

# --- TFRecords ---------------------------------------------------------------

build_tfrecords() {
  local key extra
  split_words extra "$BUILD_EXTRA_FLAGS"
  key="$SOURCE_KEY|sbd=$SBD_KEY|shards=$NUM_SHARDS|out=$OUTPUT_DIR|${extra[*]}"
  start_records "$key" || return 0
  log "tfrecord: converting $VOC_ROOT into $OUTPUT_DIR"
  run deeplab-build-data \
    --image_folder="$VOC_ROOT/JPEGImages" \
    --semantic_segmentation_folder="$LABEL_DIR" \
    --list_folder="$LIST_DIR" \
    --image_format=jpg \
    --output_dir="$RECORDS_TMP" \
    --num_shards="$NUM_SHARDS" \
    --dataset_name=pascal_voc_seg \
    ${extra[@]+"${extra[@]}"} || die "deeplab-build-data failed (see above); nothing was replaced"
  finish_records "$key"
}

# --- main ----------------------------------------------------------------------

# Option -> variable (parse_options reads it by name).
# shellcheck disable=SC2034
declare -A OPTIONS=([--work_dir]=WORK_DIR [--output_dir]=OUTPUT_DIR
  [--checksum]=CHECKSUM [--sbd_labels]=SBD_LABELS
  [--train_aug_list]=TRAIN_AUG_LIST [--num_shards]=NUM_SHARDS)

main() {
  WORK_DIR=${WORK_DIR:-./pascal_voc_seg}
  OUTPUT_DIR=${OUTPUT_DIR:-}
  CHECKSUM=${CHECKSUM:-}
  SBD_LABELS=${SBD_LABELS:-}
  TRAIN_AUG_LIST=${TRAIN_AUG_LIST:-}
  NUM_SHARDS=${NUM_SHARDS:-4}
  BUILD_EXTRA_FLAGS=${BUILD_EXTRA_FLAGS:-}
  parse_source_args VOC_SOURCE "$@"
  SOURCE=${SOURCE:-$DEFAULT_URL}
  OUTPUT_DIR=${OUTPUT_DIR:-$WORK_DIR/tfrecord}
  if [[ -n $SBD_LABELS ]]; then
    [[ -d $SBD_LABELS ]] || die "--sbd_labels=$SBD_LABELS is not a folder"
    SBD_KEY="$(realpath "$SBD_LABELS")|$(folder_key "$SBD_LABELS")"
    if [[ -n $TRAIN_AUG_LIST ]]; then
      [[ -f $TRAIN_AUG_LIST ]] || die "--train_aug_list=$TRAIN_AUG_LIST is not a file"
      SBD_KEY+="|$(file_key "$TRAIN_AUG_LIST")"
    fi
  else
    SBD_KEY=none
    [[ -z $TRAIN_AUG_LIST ]] || die "--train_aug_list needs --sbd_labels"
  fi
  need_cmd deeplab-build-data tar sha256sum md5sum flock

  open_work_dir
  resolve_source

  if [[ $SOURCE_KIND == folder ]]; then
    VOC_ROOT=$(find_voc_root "$SOURCE")
    [[ -n $VOC_ROOT ]] || die "$SOURCE holds no JPEGImages folder: pass VOCdevkit/, its parent or VOC2012/"
    VOC_ROOT=$(realpath "$VOC_ROOT")
    check_voc_root
    SOURCE_KEY="folder|$VOC_ROOT|$(folder_key "$VOC_ROOT")"
    log "source: using the extracted folder $VOC_ROOT as it is"
  else
    verify_archive
    VOC_ROOT="$WORK_DIR/VOCdevkit/VOC2012"
    extract_archive "$VOC_ROOT" untar find_voc_root tar \
      'VOC folder (expected VOCdevkit/VOC2012/JPEGImages)'
    check_voc_root
    SOURCE_KEY="tarball|$(file_key "$ARCHIVE")"
  fi
  make_lists
  build_tfrecords
  log "done: TFRecords and dataset.json in $OUTPUT_DIR"
}

main "$@"
