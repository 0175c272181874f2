# shellcheck shell=bash
# Helpers sourced by the scripts (through voc_recipe.sh for the PASCAL VOC
# ones, the demo and cron_retrain.sh): logging, option parsing, checkpoint
# look-up, atomic writes, flag lists. Not meant to be run on its own.

# Prints a timestamped message on stderr.
# A log line (time, script, words) on stdout.
log_line() {
  printf '%s [%s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "${SCRIPT_NAME:-deeplab}" "$*"
}

# Logs to stderr. A line that cannot be written (a full disk under the log)
# is lost, and the script goes on: it must still end with its own message.
log() {
  log_line "$@" >&2 || true
}

# Prints an error and exits with status 1 (or $2).
die() {
  log "ERROR: $1"
  exit "${2:-1}"
}

# A bad command line ($1 says what): `die`, unless the script defines its
# own (cron_retrain.sh prints its JSON summary first).
usage_error() {
  die "$1"
}

# Logs a command (shell-quoted, so it can be pasted) and runs it; returns
# its exit status. A SIGTERM, SIGINT or SIGHUP meanwhile is handed on to the
# command (SIGHUP as SIGTERM; deeplab-train takes the copy a signal sent to
# the whole process group also brings as the same one), and the script waits
# for the command to end (deeplab-train saves its final checkpoint) before
# the signal ends the script as it would have: its trap, else exit 128+N.
# Before, bash exited at once while the command ran on, never told of a
# signal sent to the script alone.
run() {
  log "+ $(printf '%q ' "$@")"
  local child status=0 signal='' interrupted traps
  traps=$(trap -p TERM INT HUP)
  "$@" &
  child=$!
  trap 'signal=TERM interrupted=1; kill -TERM "$child" 2>/dev/null || true' TERM
  trap 'signal=INT interrupted=1; kill -INT "$child" 2>/dev/null || true' INT
  trap 'signal=HUP interrupted=1; kill -TERM "$child" 2>/dev/null || true' HUP
  while :; do
    interrupted=''
    wait "$child" && status=0 || status=$?
    # A trap that ran ended the wait, not the command: wait again.
    [[ -n $interrupted ]] || break
  done
  trap - TERM INT HUP
  eval "$traps"
  if [[ -n $signal ]]; then
    log "stopped by SIG$signal; the command ended with exit status $status"
    kill -s "$signal" "$BASHPID"
  fi
  return "$status"
}

# Exits with a clear message when a command is not on PATH.
need_cmd() {
  local cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 ||
      die "'$cmd' not found on PATH (activate the deeplab-train virtualenv, or run 'pip install .' in the repository)"
  done
}

# Fails unless $2 is a non-negative integer; $1 names the variable.
require_int() {
  [[ $2 =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '$2'"
}

# Fails unless $2 is an integer >= 1; $1 names the variable.
require_positive_int() {
  [[ $2 =~ ^0*[1-9][0-9]*$ ]] || die "$1 must be an integer >= 1, got '$2'"
}

# Writes stdin to $1 atomically (temp file in the same folder, then rename).
write_atomic() {
  local dest=$1 tmp
  tmp=$(mktemp "$(dirname "$dest")/.$(basename "$dest").XXXXXX")
  # mktemp makes the file private; give it the mode a plain write would.
  chmod "$(printf '%o' $((8#666 & ~8#$(umask))))" "$tmp"
  if ! cat >"$tmp"; then
    rm -f "$tmp"
    return 1
  fi
  mv -f "$tmp" "$dest"
}

# The start of the temp names switch_symlink gives link $1.
symlink_temp_prefix() {
  printf '%s/.%s.tmp.' "$(dirname "$1")" "$(basename "$1")"
}

# Points symlink $2 at $1 atomically: a new link under a temp name renamed
# over the old one, so readers see either the old or the new target.
switch_symlink() {
  local target=$1 link=$2 tmp
  tmp="$(symlink_temp_prefix "$link")$$"
  rm -f "$tmp"
  ln -s "$target" "$tmp"
  mv -T "$tmp" "$link"
}

# Removes the temp links a killed or failed switch_symlink of link $1 left.
remove_symlink_temps() {
  local prefix
  prefix=$(symlink_temp_prefix "$1")
  rm -f "$prefix"*
}

# Prints the latest checkpoint prefix of folder $1 (from its `checkpoint`
# state file), or nothing when there is none. Relative paths are resolved
# against the folder; an absolute path that no longer exists (a moved folder)
# falls back to the same file name inside the folder. Without a state file
# naming one that is there (a model-zoo folder, a state file a crash left
# empty), the newest complete checkpoint on disk, as the deeplab commands
# take it.
latest_checkpoint() {
  local dir=$1 state path=
  state="$dir/checkpoint"
  if [[ -f $state ]]; then
    path=$(sed -n 's/^model_checkpoint_path: *"\(.*\)" *$/\1/p' "$state" 2>/dev/null | head -n 1) || path=
  fi
  if [[ -n $path ]]; then
    if [[ $path != /* ]]; then
      path="$dir/$path"
    elif [[ ! -e "$path.index" ]]; then
      path="$dir/$(basename "$path")"
    fi
    if [[ -e "$path.index" ]]; then
      printf '%s\n' "$path"
      return 0
    fi
  fi
  newest_complete_checkpoint "$dir"
}

# Prints the prefix of the newest complete checkpoint (its .index and a
# data file) of folder $1: model.ckpt-N of the largest N, else model.ckpt
# (a model-zoo folder); nothing when there is none.
newest_complete_checkpoint() {
  local dir=$1 index prefix step best=-1 found=
  for index in "$dir"/model.ckpt-*.index "$dir"/model.ckpt.index; do
    [[ -f $index ]] || continue
    prefix=${index%.index}
    compgen -G "$prefix.data-*" >/dev/null || continue
    step=${prefix##*/model.ckpt}
    step=${step#-}
    [[ -n $step ]] || step=0
    [[ $step =~ ^[0-9]+$ ]] || continue
    if ((10#$step > best)); then
      best=$((10#$step))
      found=$prefix
    fi
  done
  if [[ -n $found ]]; then
    printf '%s\n' "$found"
  fi
}

# Splits the string $2 on whitespace into the array named $1 (for the
# *_EXTRA_FLAGS variables; values cannot contain spaces).
split_words() {
  local -n _out=$1
  read -r -a _out <<<"${2:-}"
}

# Fills the array REPEATED_FLAGS with one --$1=V per value of the list $2
# ("513,513" -> --crop_size=513 --crop_size=513), for flags the commands
# define as repeated values (deeplab-export's --crop_size, --eval_scales).
repeat_flag() {
  local name=$1 values v
  IFS=', ' read -r -a values <<<"$2"
  REPEATED_FLAGS=()
  for v in "${values[@]}"; do
    REPEATED_FLAGS+=("--$name=$v")
  done
}

# Parses the options "--name VALUE" and "--name=VALUE": $1 names an
# associative array of option -> variable to set; -h and --help call the
# caller's `usage` and exit 0. Everything else (positional arguments and
# unknown options, in order) is left in the array POSITIONAL for the caller.
parse_options() {
  local -n _variables=$1
  local arg
  shift
  POSITIONAL=()
  while (($#)); do
    arg=$1
    shift
    if [[ $arg == --*=* ]]; then
      set -- "${arg#*=}" "$@"
      arg=${arg%%=*}
    fi
    if [[ $arg == -h || $arg == --help ]]; then
      usage
      exit 0
    elif [[ -n $arg && -n ${_variables[$arg]:-} ]]; then
      (($#)) || usage_error "$arg needs a value (see -h)"
      printf -v "${_variables[$arg]}" '%s' "$1"
      shift
    else
      POSITIONAL+=("$arg")
    fi
  done
}
