# shellcheck shell=bash
# Helpers sourced by the dataset download scripts (after common.sh): options
# and SOURCE, the work folder and its lock, step markers, download, checksum
# verification, extraction, and the TFRecords folder replaced whole. Not
# meant to be run on its own.
#
# The sourcing script sets STEPS (its step names, in order), OPTIONS (its
# options, for parse_source_args), WORK_DIR, OUTPUT_DIR, CHECKSUM, and
# OFFICIAL_ARCHIVE with OFFICIAL_CHECKSUM (the known checksum of the
# dataset's own archive); parse_source_args sets SOURCE, open_work_dir
# resolves the folders, resolve_source sets SOURCE_KIND and ARCHIVE.

# --- steps and markers ---------------------------------------------------------

# Every step ends by writing a marker under $WORK_DIR/.done (atomically, after
# its output is renamed into place); a re-run skips the steps whose marker
# matches their inputs.
marker_path() { printf '%s/.done/%s\n' "$WORK_DIR" "$1"; }

# Succeeds when step $1 finished earlier with the same inputs (key $2).
step_done() {
  local marker
  marker=$(marker_path "$1")
  [[ -f $marker ]] && [[ $(cat "$marker") == "$(key_hash "$2")" ]]
}

# Records that step $1 finished with inputs $2; written last, atomically.
mark_done() {
  key_hash "$2" | write_atomic "$(marker_path "$1")"
}

# Forgets step $1 and every later step (they used its output).
invalidate_from() {
  local step found=0
  for step in "${STEPS[@]}"; do
    if [[ $step == "$1" ]]; then
      found=1
    fi
    if ((found)); then
      rm -f "$(marker_path "$step")"
    fi
  done
}

key_hash() { printf '%s' "$1" | sha256sum | cut -d ' ' -f 1; }

# "path|size|mtime": changes when the file is replaced or modified.
file_key() { stat -L -c '%n|%s|%Y' "$1"; }

# Hash of a folder's file list with sizes and mtimes (content changes show).
folder_key() {
  (cd "$1" && find -L . -type f -printf '%P\t%s\t%T@\n' | LC_ALL=C sort | sha256sum | cut -d ' ' -f 1)
}

# --- options, work folder, source ----------------------------------------------

# Parses the options of OPTIONS and at most one SOURCE argument (default: the
# environment variable named $1), and checks the shared ones now, before a
# download of gigabytes: WORK_DIR, CHECKSUM's form and NUM_SHARDS.
parse_source_args() {
  local env_name=$1 arg given=0
  shift
  SOURCE=${!env_name:-}
  parse_options OPTIONS "$@"
  for arg in ${POSITIONAL[@]+"${POSITIONAL[@]}"}; do
    [[ $arg != -* ]] || die "unknown option '$arg' (see -h)"
    ((!given)) || die "only one SOURCE may be given (got '$SOURCE' and '$arg')"
    SOURCE=$arg
    given=1
  done
  [[ -n $WORK_DIR ]] || die "--work_dir (WORK_DIR) is empty: give the folder to work in"
  [[ -z $CHECKSUM || $CHECKSUM =~ ^([[:xdigit:]]{32}|[[:xdigit:]]{40}|[[:xdigit:]]{64})$ ]] ||
    die "--checksum must be an MD5 (32 hex digits), SHA-1 (40) or SHA-256 (64), got '$CHECKSUM'"
  require_positive_int "NUM_SHARDS (--num_shards)" "$NUM_SHARDS"
}

# Creates $WORK_DIR/.done, makes WORK_DIR, OUTPUT_DIR and DOWNLOAD_DIR
# absolute and takes $WORK_DIR/.lock for the rest of the run (exits when
# another run holds it).
open_work_dir() {
  mkdir -p "$WORK_DIR/.done"
  WORK_DIR=$(realpath "$WORK_DIR")
  OUTPUT_DIR=$(realpath -m "$OUTPUT_DIR")
  DOWNLOAD_DIR=$(realpath -m "${DOWNLOAD_DIR:-$WORK_DIR}")
  exec 9>>"$WORK_DIR/.lock"
  flock -n 9 || die "another $SCRIPT_NAME is working in $WORK_DIR (lock $WORK_DIR/.lock)"
}

# Sets SOURCE_KIND to url, folder or archive; for a URL (downloaded now) or
# an archive, ARCHIVE to the file.
resolve_source() {
  if is_url "$SOURCE"; then
    SOURCE_KIND=url
    fetch_archive
  elif [[ -d $SOURCE ]]; then
    SOURCE_KIND=folder
  elif [[ -f $SOURCE ]]; then
    SOURCE_KIND=archive
    ARCHIVE=$(realpath "$SOURCE")
  else
    die "SOURCE '$SOURCE' is not a URL, a file or a folder (see -h)"
  fi
}

is_url() { [[ $1 =~ ^(https?|ftp|file):// ]]; }

download() {
  local url=$1 dest=$2
  if command -v curl >/dev/null 2>&1; then
    run curl -fL --retry 3 -C - -o "$dest.part" "$url" ||
      die "downloading $url failed (curl exit status $?); re-run to resume, or download it yourself and pass the file"
  elif command -v wget >/dev/null 2>&1; then
    run wget -c -O "$dest.part" "$url" ||
      die "downloading $url failed (wget exit status $?); re-run to resume, or download it yourself and pass the file"
  else
    die "neither curl nor wget is installed: download $url yourself and pass the file"
  fi
  mv -f "$dest.part" "$dest"
}

# Prints the expected checksum for archive $1 (from --checksum, or the known
# one for the official file), or nothing when it cannot be verified.
expected_checksum() {
  if [[ -n $CHECKSUM ]]; then
    printf '%s\n' "$CHECKSUM"
  elif [[ $(basename "$1") == "$OFFICIAL_ARCHIVE" ]]; then
    printf '%s\n' "$OFFICIAL_CHECKSUM"
  fi
}

# Prints the checksum of file $1 of the kind of checksum $2 (by its length).
checksum_of() {
  case ${#2} in
    32) md5sum "$1" | cut -d ' ' -f 1 ;;
    40) sha1sum "$1" | cut -d ' ' -f 1 ;;
    64) sha256sum "$1" | cut -d ' ' -f 1 ;;
    *) die "--checksum must be an MD5 (32 hex digits), SHA-1 (40) or SHA-256 (64), got '$2'" ;;
  esac
}

# Downloads $SOURCE into $DOWNLOAD_DIR (skipped when done before); sets
# ARCHIVE.
fetch_archive() {
  local name
  name=$(basename "${SOURCE%%\?*}")
  ARCHIVE="$DOWNLOAD_DIR/$name"
  mkdir -p "$DOWNLOAD_DIR"
  if [[ -f $ARCHIVE ]] && step_done download "$SOURCE"; then
    log "download: $ARCHIVE already downloaded, skipping"
    return
  fi
  invalidate_from download
  log "download: $SOURCE -> $ARCHIVE"
  download "$SOURCE" "$ARCHIVE"
  mark_done download "$SOURCE"
}

# Checks $ARCHIVE against its expected checksum (a download that fails is
# removed, so that a re-run downloads it again).
verify_archive() {
  local expected actual key
  expected=$(expected_checksum "$ARCHIVE")
  expected=${expected,,}
  if [[ -z $expected ]]; then
    log "WARNING: no checksum for $(basename "$ARCHIVE") (not the official $OFFICIAL_ARCHIVE): using it unverified; pass --checksum to verify it"
    return
  fi
  key="$(file_key "$ARCHIVE")|$expected"
  if step_done verify "$key"; then
    log "verify: checksum of $ARCHIVE checked earlier, skipping"
    return
  fi
  invalidate_from verify
  log "verify: checking the checksum of $ARCHIVE"
  actual=$(checksum_of "$ARCHIVE" "$expected")
  if [[ $actual != "$expected" ]]; then
    if [[ $SOURCE_KIND == url ]]; then
      rm -f "$ARCHIVE"
      die "checksum mismatch for the download of $SOURCE (expected $expected, got $actual); the file was removed, re-run to download it again"
    fi
    die "checksum mismatch for $ARCHIVE: expected $expected, got $actual (a truncated or different file?)"
  fi
  mark_done verify "$key"
}

# Unpacks $ARCHIVE into a temp folder with `$2 ARCHIVE FOLDER`, and moves the
# dataset folder `$3 FOLDER` prints to $1 (skipped when done before with the
# same archive). $4 names the archive's format, $5 the folder it must hold,
# for the messages.
extract_archive() {
  local dest=$1 unpack=$2 find_root=$3 format=$4 expected=$5 key tmp root
  key="$(file_key "$ARCHIVE")"
  if [[ -d $dest ]] && step_done extract "$key"; then
    log "extract: $dest extracted earlier, skipping"
    return
  fi
  invalidate_from extract
  tmp="$WORK_DIR/.extract.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "extract: $ARCHIVE -> $dest"
  # A failed extraction's part (up to the archive's size) is not kept.
  if ! "$unpack" "$ARCHIVE" "$tmp"; then
    rm -rf "$tmp"
    die "cannot extract $ARCHIVE (not a $format file, or truncated)"
  fi
  root=$("$find_root" "$tmp")
  if [[ -z $root ]]; then
    rm -rf "$tmp"
    die "$ARCHIVE holds no $expected"
  fi
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest"
  mv "$root" "$dest"
  rm -rf "$tmp"
  mark_done extract "$key"
}

# --- TFRecords -----------------------------------------------------------------

# Starts the tfrecord step with inputs $1: fails (after a log line) when
# $OUTPUT_DIR was built from them before; else forgets the step and sets
# RECORDS_TMP to an empty temp folder beside $OUTPUT_DIR for the new records.
start_records() {
  if [[ -f "$OUTPUT_DIR/dataset.json" ]] && step_done tfrecord "$1"; then
    log "tfrecord: $OUTPUT_DIR built earlier, skipping"
    return 1
  fi
  invalidate_from tfrecord
  RECORDS_TMP="$(dirname "$OUTPUT_DIR")/.$(basename "$OUTPUT_DIR").tmp"
  rm -rf "$RECORDS_TMP"
  mkdir -p "$RECORDS_TMP" || die "cannot create $RECORDS_TMP"
}

# Replaces $OUTPUT_DIR by the finished RECORDS_TMP and marks the tfrecord
# step done with inputs $1.
finish_records() {
  [[ -f "$RECORDS_TMP/dataset.json" ]] || die "deeplab-build-data wrote no dataset.json in $RECORDS_TMP"
  rm -rf "$OUTPUT_DIR"
  mv "$RECORDS_TMP" "$OUTPUT_DIR"
  mark_done tfrecord "$1"
}
