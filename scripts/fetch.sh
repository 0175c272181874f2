# shellcheck shell=bash
# Helpers sourced by the dataset download scripts (after common.sh): step
# markers, download, checksum verification. Not meant to be run on its own.
#
# The sourcing script sets STEPS (its step names, in order), WORK_DIR,
# SOURCE, SOURCE_KIND (url / archive / folder), DOWNLOAD_DIR, CHECKSUM, and
# OFFICIAL_ARCHIVE with OFFICIAL_CHECKSUM (the known checksum of the
# dataset's own archive). fetch_archive sets ARCHIVE.

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

# --- source ----------------------------------------------------------------

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
