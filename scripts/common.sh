# shellcheck shell=bash
# Helpers sourced by the PASCAL VOC scripts and cron_retrain.sh: logging,
# the two training recipes (model flags), checkpoint look-up, atomic writes.
# Not meant to be run on its own.

# Prints a timestamped message on stderr.
log() {
  printf '%s [%s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "${SCRIPT_NAME:-deeplab}" "$*" >&2
}

# Prints an error and exits with status 1 (or $2).
die() {
  log "ERROR: $1"
  exit "${2:-1}"
}

# Logs a command (shell-quoted, so it can be pasted) and runs it.
run() {
  log "+ $(printf '%q ' "$@")"
  "$@"
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

# Points symlink $2 at $1 atomically: a new link under a temp name renamed
# over the old one, so readers see either the old or the new target.
switch_symlink() {
  local target=$1 link=$2 tmp
  tmp="$(dirname "$link")/.$(basename "$link").tmp.$$"
  rm -f "$tmp"
  ln -s "$target" "$tmp"
  mv -T "$tmp" "$link"
}

# Prints the latest checkpoint prefix of folder $1 (from its `checkpoint`
# state file), or nothing when there is none. Relative paths are resolved
# against the folder; an absolute path that no longer exists (a moved folder)
# falls back to the same file name inside the folder.
latest_checkpoint() {
  local dir=$1 state path
  state="$dir/checkpoint"
  [[ -f $state ]] || return 0
  path=$(sed -n 's/^model_checkpoint_path: *"\(.*\)" *$/\1/p' "$state" | head -n 1)
  [[ -n $path ]] || return 0
  if [[ $path != /* ]]; then
    path="$dir/$path"
  elif [[ ! -e "$path.index" ]]; then
    path="$dir/$(basename "$path")"
  fi
  if [[ -e "$path.index" ]]; then
    printf '%s\n' "$path"
  fi
}

# Prints the global step of checkpoint prefix $1 (model.ckpt-1234 -> 1234),
# 0 for an empty argument.
checkpoint_step() {
  if [[ ${1:-} =~ -([0-9]+)$ ]]; then
    printf '%s\n' "${BASH_REMATCH[1]}"
  else
    printf '0\n'
  fi
}

# Prints key $2 of the JSON object in file $1 (empty when absent).
json_get() {
  "${PYTHON:-python3}" -c '
import json, sys
with open(sys.argv[1]) as f:
  value = json.load(f).get(sys.argv[2])
print("" if value is None else value)' "$1" "$2"
}

# Sets the model variables of a recipe unless the caller already set them.
# A variable set to the empty string (ATROUS_RATES=) switches that part off.
#   xception_65:  ASPP rates 6,12,18 and the decoder at stride 4 (local_test.sh)
#   mobilenet_v2: no ASPP rates and no decoder (local_test_mobilenetv2.sh and
#                 the model-zoo mobilenet_v2 PASCAL checkpoints)
set_recipe_defaults() {
  RECIPE=${RECIPE:-xception_65}
  case $RECIPE in
    xception_65)
      MODEL_VARIANT=${MODEL_VARIANT:-xception_65}
      ATROUS_RATES=${ATROUS_RATES-6,12,18}
      DECODER_OUTPUT_STRIDE=${DECODER_OUTPUT_STRIDE-4}
      ;;
    mobilenet_v2)
      MODEL_VARIANT=${MODEL_VARIANT:-mobilenet_v2}
      ATROUS_RATES=${ATROUS_RATES-}
      DECODER_OUTPUT_STRIDE=${DECODER_OUTPUT_STRIDE-}
      ;;
    *) die "RECIPE must be xception_65 or mobilenet_v2, got '$RECIPE'" ;;
  esac
  OUTPUT_STRIDE=${OUTPUT_STRIDE:-16}
  DEPTH_MULTIPLIER=${DEPTH_MULTIPLIER:-}
}

# Fills the array MODEL_FLAGS with the recipe's model flags.
build_model_flags() {
  local rates rate
  MODEL_FLAGS=(--model_variant="$MODEL_VARIANT" --output_stride="$OUTPUT_STRIDE")
  IFS=', ' read -r -a rates <<<"$ATROUS_RATES"
  for rate in "${rates[@]}"; do
    MODEL_FLAGS+=(--atrous_rates="$rate")
  done
  if [[ -n $DECODER_OUTPUT_STRIDE ]]; then
    MODEL_FLAGS+=(--decoder_output_stride="$DECODER_OUTPUT_STRIDE")
  fi
  if [[ -n $DEPTH_MULTIPLIER ]]; then
    MODEL_FLAGS+=(--depth_multiplier="$DEPTH_MULTIPLIER")
  fi
}

# Fills MODEL_FLAGS for eval/vis/export reading checkpoints from folder $1:
# empty when deeplab-train saved its model options there (they are read back,
# and repeating them could only contradict them), else the recipe's flags
# (e.g. a model-zoo checkpoint).
model_flags_for_checkpoint_dir() {
  if [[ -f "$1/deeplab_config.json" ]]; then
    MODEL_FLAGS=()
  else
    build_model_flags
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

# Sets the folder layout shared by the PASCAL VOC scripts (the original's
# pascal_voc_seg/{tfrecord,exp/...} tree) unless the caller set it.
set_voc_paths() {
  WORK_DIR=${WORK_DIR:-./pascal_voc_seg}
  DATASET=${DATASET:-pascal_voc_seg}
  DATASET_DIR=${DATASET_DIR:-$WORK_DIR/tfrecord}
  EXP_DIR=${EXP_DIR:-$WORK_DIR/exp/$RECIPE}
  TRAIN_LOGDIR=${TRAIN_LOGDIR:-$EXP_DIR/train}
  EVAL_LOGDIR=${EVAL_LOGDIR:-$EXP_DIR/eval}
  VIS_LOGDIR=${VIS_LOGDIR:-$EXP_DIR/vis}
  EXPORT_DIR=${EXPORT_DIR:-$EXP_DIR/export}
}

# The environment variables every PASCAL VOC script reads, for usage texts.
voc_paths_help() {
  cat <<'HELP'
Recipe and folders (environment variables, with their defaults):
  RECIPE                xception_65 | mobilenet_v2                [xception_65]
  MODEL_VARIANT, OUTPUT_STRIDE, ATROUS_RATES, DECODER_OUTPUT_STRIDE,
  DEPTH_MULTIPLIER      override the recipe's model flags; an empty value
                        (ATROUS_RATES=) switches that part off. xception_65:
                        OS 16, rates 6,12,18, decoder 4; mobilenet_v2: OS 16,
                        no rates, no decoder (as the model-zoo checkpoints).
  WORK_DIR              [./pascal_voc_seg]
  DATASET               [pascal_voc_seg]
  DATASET_DIR           TFRecords + dataset.json        [$WORK_DIR/tfrecord]
  EXP_DIR               [$WORK_DIR/exp/$RECIPE]
  TRAIN_LOGDIR          checkpoints                     [$EXP_DIR/train]
  EVAL_LOGDIR, VIS_LOGDIR, EXPORT_DIR                   [$EXP_DIR/{eval,vis,export}]
HELP
}

# Prints the usage text given on stdin plus the shared variables, when the
# first argument asks for help; exits then.
maybe_usage() {
  if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    cat
    echo
    voc_paths_help
    exit 0
  fi
}

# Fills OPTIONAL_FLAGS with --$1=$2, or nothing when $2 is empty (the
# command's own default applies).
# shellcheck disable=SC2034  # read by the scripts that source this file
optional_flag() {
  OPTIONAL_FLAGS=()
  if [[ -n ${2:-} ]]; then
    OPTIONAL_FLAGS=("--$1=$2")
  fi
}
