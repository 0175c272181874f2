#!/usr/bin/env bash
# Trains on a local cluster of TensorFlow's distributed runtime, to try the
# multi-machine setup on one machine: 1 parameter server and 2 workers
# (worker 0 is the chief), each a separate deeplab-train process listening on
# a free 127.0.0.1 port, training a tiny mobilenet_v2 on the bundled sample
# data (data/, converted to TFRecords on the first run).
#
# Usage: scripts/launch_local_cluster.sh [EXTRA deeplab-train FLAGS...]
#   e.g. scripts/launch_local_cluster.sh --sync_replicas=false
#
# Environment overrides:
#   WORK     output folder (TFRecords, train logdir, logs)
#            [work/local_cluster in the repository]
#   STEPS    --training_number_of_steps                      [20]
#   TIMEOUT  seconds to wait for the workers before giving up [900]
#
# The logs of each task are in $WORK/logs, each worker's JSON result in
# $WORK/result_worker{0,1}.json, the checkpoints in $WORK/train. One launch
# at a time runs in a WORK folder (a second exits 75). Every process
# started here is stopped when the script exits, fails or is interrupted
# (Ctrl-C, SIGTERM to the script or its process group: the workers stop,
# the chief with a final checkpoint, then the parameter server; exit 130
# or 143; a SIGHUP 129), and dies with it where setpriv is installed (a
# kill -9). A worker that fails ends the script with its exit status (2:
# bad flags). The workers' result lines are printed at the end, whatever
# the end.
# See docs/distributed.md for a launch on several hosts.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
# A relative WORK is the caller's, not the repository's.
if [[ -n ${WORK:-} && $WORK != /* ]]; then
  WORK="$PWD/$WORK"
fi
cd "$(dirname "$0")/.."
SCRIPT_NAME=launch_local_cluster
# shellcheck source=scripts/common.sh
source scripts/common.sh

WORK="${WORK:-work/local_cluster}"
STEPS="${STEPS:-20}"
TIMEOUT="${TIMEOUT:-900}"
PYTHON="${PYTHON:-python3}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
require_positive_int STEPS "$STEPS"
require_positive_int TIMEOUT "$TIMEOUT"
# Decimal, whatever leading zeros (bash reads 010 as octal).
STEPS=$((10#$STEPS))
TIMEOUT=$((10#$TIMEOUT))
need_cmd deeplab-train deeplab-build-data "$PYTHON" setsid flock

RECORDS="$WORK/tfrecord"
LOGDIR="$WORK/train"
LOGS="$WORK/logs"
mkdir -p "$LOGS"
# A second launch here rewrote the running one's logs and results before
# its chief was refused the train logdir. The tasks keep the lock open
# until they end.
exec 9>>"$WORK/.lock"
flock -n 9 || die "another launch is running in $WORK, or a task an earlier one left (lock $WORK/.lock; \`fuser -v $WORK/.lock\` names the process)" 75

PS_PIDS=()
WORKER_PIDS=()

# Sends signal $1 to the pids that follow, then waits up to $2 seconds for
# them to exit.
stop_pids() {
  local sig=$1 secs=$2 pid alive deadline
  shift 2
  for pid in "$@"; do
    kill "-$sig" "$pid" 2>/dev/null || true
  done
  deadline=$((SECONDS + secs))
  while ((SECONDS < deadline)); do
    alive=0
    for pid in "$@"; do
      if kill -0 "$pid" 2>/dev/null; then alive=1; fi
    done
    ((alive)) || return 0
    sleep 0.2
  done
}

# Prints the JSON result line of each worker that wrote one.
print_results() {
  local i
  for i in 0 1; do
    if [[ -f "$WORK/result_worker$i.json" ]]; then
      printf 'worker %d: %s\n' "$i" "$(cat "$WORK/result_worker$i.json")"
    fi
  done
}

# Stops every task still running, each with SIGTERM (SIGKILL after 45 s):
# the chief first (it writes a final checkpoint, and a synchronous step
# needs the other worker's gradients until it ends), then worker 1 (which
# a synchronous chief has stopped already), then the parameter server.
cleanup() {
  local status=$?
  trap - EXIT INT TERM HUP
  local pid
  for pid in ${WORKER_PIDS[@]+"${WORKER_PIDS[@]}"}; do
    stop_pids TERM 45 "$pid"
    stop_pids KILL 5 "$pid"
  done
  if ((${#PS_PIDS[@]})); then
    # (A parameter server only ever stops this way: no "Killed" notice.)
    { stop_pids KILL 5 "${PS_PIDS[@]}"; wait "${PS_PIDS[@]}"; } 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  # What the workers said, on a failure or an interruption alike (a
  # success prints them at its end).
  if ((status != 0 && ${#WORKER_PIDS[@]})); then
    print_results
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'log "interrupted: stopping the cluster"; exit 130' INT
trap 'log "interrupted: stopping the cluster"; exit 143' TERM
trap 'log "hung up: stopping the cluster"; exit 129' HUP

if [[ ! -f "$RECORDS/dataset.json" ]]; then
  log "converting data/ to TFRecords in $RECORDS"
  run deeplab-build-data \
    --image_folder=data/JPEGImages \
    --semantic_segmentation_folder=data/SegmentationClass \
    --list_folder=data/ImageSets/Segmentation \
    --image_format=jpg --label_format=png \
    --output_dir="$RECORDS" \
    --dataset_name=shapes --num_classes=5 --ignore_label=255 \
    --num_shards=1 >"$LOGS/build_data.log" 2>&1 ||
    die "deeplab-build-data failed, see $LOGS/build_data.log"
fi

# Three distinct free ports: the sockets are held together until all three
# are known, so they cannot come out equal.
read -r PS_PORT W0_PORT W1_PORT < <("$PYTHON" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
  s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
  s.close()')
PS_HOSTS="127.0.0.1:$PS_PORT"
WORKER_HOSTS="127.0.0.1:$W0_PORT,127.0.0.1:$W1_PORT"
log "cluster: ps $PS_HOSTS, workers $WORKER_HOSTS (worker 0 is the chief)"

# The same flags for every task; only --job_name and --task differ.
# shellcheck disable=SC2054  # commas inside flag values, not separators
COMMON=(
  --ps_hosts="$PS_HOSTS" --worker_hosts="$WORKER_HOSTS"
  --train_logdir="$LOGDIR" --dataset=shapes --dataset_dir="$RECORDS"
  --model_variant=mobilenet_v2 --depth_multiplier=0.25 --output_stride=16
  --train_crop_size=65,65 --train_batch_size=2 --fine_tune_batch_norm=false
  --base_learning_rate=0.01 --training_number_of_steps="$STEPS"
  --log_steps=5 --save_interval_secs=60
  "$@"
)

# Only the chief runs in this script's process group; the parameter server
# and worker 1 run in sessions of their own. A Ctrl-C or a SIGTERM to the
# group then stops the chief, whose last step (synchronous: with worker 1's
# gradients) and final checkpoint (on the parameter server) need the others;
# `cleanup` stops them after it. Where setpriv can, they also die with this
# script (a kill -9 of the group no longer reaches them), and so does the
# chief (a kill -9 of the script alone left it waiting for the dead
# parameter server, holding the logdir).
DIE_WITH_SCRIPT=()
if setpriv --pdeathsig KILL true 2>/dev/null; then
  DIE_WITH_SCRIPT=(setpriv --pdeathsig KILL)
fi

start_task() {
  local job=$1 task=$2 out="$LOGS/$1$2.log"
  local extra=()
  local launcher=(setsid ${DIE_WITH_SCRIPT[@]+"${DIE_WITH_SCRIPT[@]}"})
  if [[ $job == worker ]]; then
    extra=(--result_json="$WORK/result_worker$task.json")
    rm -f "$WORK/result_worker$task.json"
  fi
  if [[ $job$task == worker0 ]]; then
    launcher=(${DIE_WITH_SCRIPT[@]+"${DIE_WITH_SCRIPT[@]}"})
  fi
  ${launcher[@]+"${launcher[@]}"} deeplab-train "${COMMON[@]}" \
    --job_name="$job" --task="$task" "${extra[@]}" >"$out" 2>&1 &
  if [[ $job == ps ]]; then PS_PIDS+=("$!"); else WORKER_PIDS+=("$!"); fi
  log "started $job $task (pid $!), log $out"
}

start_task ps 0
start_task worker 0
start_task worker 1
PS_PID=${PS_PIDS[0]}

# Waits for both workers; fails when one fails, the ps dies, or time is up.
deadline=$((SECONDS + TIMEOUT))
declare -A FINISHED=()
while ((${#FINISHED[@]} < 2)); do
  for i in 0 1; do
    pid=${WORKER_PIDS[$i]}
    [[ -n ${FINISHED[$i]:-} ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      status=0
      wait "$pid" || status=$?
      FINISHED[$i]=$status
      log "worker $i exited with status $status"
      ((status == 0)) || die "worker $i failed, see $LOGS/worker$i.log" "$status"
    fi
  done
  kill -0 "$PS_PID" 2>/dev/null || die "the parameter server died, see $LOGS/ps0.log"
  ((SECONDS < deadline)) || die "the workers did not finish within ${TIMEOUT} s (TIMEOUT)"
  sleep 0.5
done

print_results
log "done; checkpoints in $LOGDIR (the parameter server is stopped on exit)"
