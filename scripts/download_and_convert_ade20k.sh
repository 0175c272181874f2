#!/usr/bin/env bash
# Downloads the ADE20K scene parsing benchmark (ADEChallengeData2016.zip; or
# takes a local zip / extracted folder), verifies the zip's checksum,
# extracts it and converts its training and validation folders into the
# train and val splits of sharded TFRecords + dataset.json with
# deeplab-build-data (151 classes, "other" = 0 ignored, as the original
# DeepLab trains on it).
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

readonly DEFAULT_URL="http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip"
readonly OFFICIAL_ARCHIVE="ADEChallengeData2016.zip"
# SHA-1 of the official ADEChallengeData2016.zip (as published by the
# dataset loaders that verify it, e.g. GluonCV's ADE20K preparation).
readonly OFFICIAL_CHECKSUM="219e1696abb36c8ba3a3afe7fb2f4b4606a897c7"
readonly STEPS=(download verify extract tfrecord)
# deeplab-build-data's split names for the benchmark's folders.
readonly SPLITS=(train:training val:validation)

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [options] [SOURCE]

Builds ADE20K TFRecords and dataset.json for deeplab-train
(--dataset=ade20k: 151 classes, label 0 "other" ignored).

SOURCE (default \$ADE20K_SOURCE, else the official URL):
  an http(s)/ftp/file:// URL   downloaded into \$DOWNLOAD_DIR, then verified
  a local .zip file            verified, then extracted
  an extracted folder          ADEChallengeData2016/ or its parent
                               (images/ and annotations/, each with
                               training/ and validation/)

Options (each also settable by the environment variable in brackets):
  --work_dir DIR       where everything is written [WORK_DIR, ./ADE20K]
  --output_dir DIR     TFRecords + dataset.json [OUTPUT_DIR, \$WORK_DIR/tfrecord]
  --checksum HEX       expected MD5 (32 hex digits), SHA-1 (40) or SHA-256
                       (64) of the zip [CHECKSUM]. The official zip is
                       checked against its known SHA-1 by default; any other
                       zip without --checksum is used unverified, with a
                       warning.
  --num_shards N       shards per split [NUM_SHARDS, 4]
  -h, --help           this text

Other environment variables:
  DOWNLOAD_DIR         where a URL is downloaded to [\$WORK_DIR]
  BUILD_EXTRA_FLAGS    extra deeplab-build-data flags (space separated)
  PYTHON               the Python that extracts the zip [python3]

Re-running skips finished steps; delete \$WORK_DIR/.done to redo them all.
Example:
  $SCRIPT_NAME --work_dir /data/ADE20K
  $SCRIPT_NAME ~/Downloads/ADEChallengeData2016.zip
EOF
}

# Prints the ADEChallengeData2016-like folder (with images/training/) inside
# folder $1.
find_ade_root() {
  local candidate
  for candidate in "$1/ADEChallengeData2016" "$1"; do
    if [[ -d "$candidate/images/training" ]]; then
      printf '%s\n' "$candidate"
      return
    fi
  done
  candidate=$(find "$1" -maxdepth 4 -type d -path '*/images/training' -print -quit)
  if [[ -n $candidate ]]; then
    dirname "$(dirname "$candidate")"
  fi
}

# Unzips $1 into folder $2 (one line on stderr for a bad zip).
unzip_with_python() {
  "$PYTHON" - "$1" "$2" <<'PY'
import sys
import zipfile
try:
  with zipfile.ZipFile(sys.argv[1]) as archive:
    archive.extractall(sys.argv[2])
except (OSError, zipfile.BadZipFile) as e:
  sys.exit('%s: %s' % (sys.argv[1], e))
PY
}

check_ade_root() {
  local pair folder sub
  for pair in "${SPLITS[@]}"; do
    folder=${pair#*:}
    for sub in images annotations; do
      [[ -d "$ADE_ROOT/$sub/$folder" ]] || die "$ADE_ROOT/$sub/$folder is missing: is $SOURCE an ADE20K (ADEChallengeData2016) folder or zip?"
    done
  done
}

# Converts each split into a temp folder, renamed to $OUTPUT_DIR when all
# are done (a failed split leaves the earlier records in place).
build_tfrecords() {
  local key extra pair split folder
  split_words extra "$BUILD_EXTRA_FLAGS"
  key="$SOURCE_KEY|shards=$NUM_SHARDS|out=$OUTPUT_DIR|${extra[*]}"
  start_records "$key" || return 0
  for pair in "${SPLITS[@]}"; do
    split=${pair%%:*}
    folder=${pair#*:}
    log "tfrecord: converting $ADE_ROOT/images/$folder into the $split split"
    run deeplab-build-data \
      --image_folder="$ADE_ROOT/images/$folder" \
      --masks_folder="$ADE_ROOT/annotations/$folder" \
      --split_name="$split" \
      --output_dir="$RECORDS_TMP" \
      --num_shards="$NUM_SHARDS" \
      --dataset_name=ade20k --num_classes=151 --ignore_label=0 \
      ${extra[@]+"${extra[@]}"} || die "deeplab-build-data failed on the $folder folder (see above); nothing was replaced"
  done
  finish_records "$key"
}

# --- main ----------------------------------------------------------------------

# Option -> variable (parse_options reads it by name).
# shellcheck disable=SC2034
declare -A OPTIONS=([--work_dir]=WORK_DIR [--output_dir]=OUTPUT_DIR
  [--checksum]=CHECKSUM [--num_shards]=NUM_SHARDS)

main() {
  WORK_DIR=${WORK_DIR:-./ADE20K}
  OUTPUT_DIR=${OUTPUT_DIR:-}
  CHECKSUM=${CHECKSUM:-}
  NUM_SHARDS=${NUM_SHARDS:-4}
  BUILD_EXTRA_FLAGS=${BUILD_EXTRA_FLAGS:-}
  PYTHON=${PYTHON:-python3}
  parse_source_args ADE20K_SOURCE "$@"
  SOURCE=${SOURCE:-$DEFAULT_URL}
  OUTPUT_DIR=${OUTPUT_DIR:-$WORK_DIR/tfrecord}
  need_cmd deeplab-build-data "$PYTHON" sha1sum sha256sum md5sum flock

  open_work_dir
  resolve_source

  if [[ $SOURCE_KIND == folder ]]; then
    ADE_ROOT=$(find_ade_root "$SOURCE")
    [[ -n $ADE_ROOT ]] || die "$SOURCE holds no images/training folder: pass ADEChallengeData2016/ or its parent"
    ADE_ROOT=$(realpath "$ADE_ROOT")
    check_ade_root
    SOURCE_KEY="folder|$ADE_ROOT|$(folder_key "$ADE_ROOT")"
    log "source: using the extracted folder $ADE_ROOT as it is"
  else
    verify_archive
    ADE_ROOT="$WORK_DIR/ADEChallengeData2016"
    extract_archive "$ADE_ROOT" unzip_with_python find_ade_root zip \
      'ADE20K folder (expected ADEChallengeData2016/images/training)'
    check_ade_root
    SOURCE_KEY="archive|$(file_key "$ARCHIVE")"
  fi
  build_tfrecords
  log "done: TFRecords and dataset.json in $OUTPUT_DIR"
}

main "$@"
