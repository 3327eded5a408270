#!/usr/bin/env bash
# A local Loom cluster on loopback: loom-scheduler, loom-checkpoint, loom-gateway (REST) and N
# loom-worker daemons, each on OS-chosen ports (the gateway's HTTP port: $LOOM_GATEWAY_PORT, else
# any free one). State lives under $LOOM_HOME (default ./.loom): SQLite file,
# checkpoints, rank logs, daemon logs, ready files (cluster/*.json) that loomctl reads.
#
#   scripts/local_cluster.sh start [--workers N] [--slots S]   start (builds nothing; see README)
#   scripts/local_cluster.sh add-worker [--slots S]             one more worker (e.g. to replace one)
#   scripts/local_cluster.sh status                             print daemons, their metrics, health
#                                                               and readiness URLs, one per line
#   scripts/local_cluster.sh restart NAME                       stop (if alive) and start again one
#                                                               daemon: scheduler, checkpoint,
#                                                               gateway or worker-N, with the flags
#                                                               of its first start, on the address
#                                                               its ready file holds (gRPC, HTTP and
#                                                               metrics ports): the first start
#                                                               binds port 0, a restart re-binds
#                                                               what it got (docs/operations.md)
# Authentication (optional): LOOM_AUTH_TOKENS_FILE (tokens file, docs/operations.md) and
# LOOM_WORKER_TOKEN_FILE (the workers' token) turn it on for the scheduler, gateway and workers.
# Data a job may name (docs/operations.md "Paths a job may name"): LOOM_DATA_ROOTS, comma-
# separated directories (default: the fortunes corpus, /usr/share/games/fortunes; list it too to
# keep the examples), is what the workers allow (--data_roots) and, unless LOOM_QUEUES_CONFIG
# names the scheduler's own --queues_config, what the scheduler allows (start writes
# $LOOM_HOME/queues.yaml with these data_roots): one setting for your own data.
# LOOM_SCRATCH_ROOTS: the workers' --scratch_roots (where DeepSpeed's nvme_path may point; in the
# written queues config too), default none.
# These three are the cluster's settings: start saves them in $LOOM_HOME/settings.env, and a later
# start or add-worker in a shell without them uses the saved values (and says so), so a restart
# keeps the data a running job reads; set one (even to "") to change it.
# start records the cluster's directory in ${XDG_CONFIG_HOME:-~/.config}/loom/cluster (stop
# removes it), where loomctl finds the cluster from any directory; LOOM_RECORD_CLUSTER=0 skips
# that (scripts/run_main_job.sh: its own cluster must not replace the user's).
#   scripts/local_cluster.sh stop                               SIGTERM all, SIGKILL stragglers
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOOM_HOME="${LOOM_HOME:-$ROOT/.loom}"
BIN="${LOOM_BIN:-$ROOT/bazel-bin}"
. "$ROOT/scripts/binaries.sh"
CLUSTER="$LOOM_HOME/cluster"
LOGS="$LOOM_HOME/logs"
SETTINGS="$LOOM_HOME/settings.env"
POINTER="${XDG_CONFIG_HOME:-${HOME:-/nonexistent}/.config}/loom/cluster"
SETTING_NAMES=(LOOM_QUEUES_CONFIG LOOM_DATA_ROOTS LOOM_SCRATCH_ROOTS)

load_settings() {  # the saved value of each setting this shell does not set
  [ -f "$SETTINGS" ] || return 0
  local name line value
  while IFS= read -r line; do
    name=${line%%=*}
    case " ${SETTING_NAMES[*]} " in *" $name "*) ;; *) continue ;; esac
    [ -z "${!name+x}" ] || continue
    eval "value=${line#*=}"  # written by save_settings with printf %q
    export "$name=$value"
    echo "local_cluster: $name=$value (saved in $SETTINGS; set it to change)" >&2
  done < "$SETTINGS"
}

save_settings() {
  local name tmp="$SETTINGS.tmp"
  : > "$tmp"
  for name in "${SETTING_NAMES[@]}"; do
    [ -z "${!name+x}" ] || printf '%s=%q\n' "$name" "${!name}" >> "$tmp"
  done
  mv "$tmp" "$SETTINGS"
}

write_queues_config() {  # write_queues_config FILE: data_roots (and scratch_roots) for everyone
  local roots=() scratch=() r
  IFS=, read -r -a roots <<< "${LOOM_DATA_ROOTS:-}"
  IFS=, read -r -a scratch <<< "${LOOM_SCRATCH_ROOTS:-}"
  yaml_list() {  # the /path entries of "$@" (tenant=/path ones are per-tenant: not here)
    local out="" x
    for x in "$@"; do
      case "$x" in /*) out="${out:+$out, }\"$x\"" ;; esac
    done
    echo "[$out]"
  }
  {
    echo "# Written by scripts/local_cluster.sh from LOOM_DATA_ROOTS / LOOM_SCRATCH_ROOTS;"
    echo "# set LOOM_QUEUES_CONFIG to use a queues config of your own."
    echo "data_roots: $(yaml_list "${roots[@]+"${roots[@]}"}")"
    [ ${#scratch[@]} -eq 0 ] || echo "scratch_roots: $(yaml_list "${scratch[@]}")"
    echo "queues:"
    echo "  - name: default"
  } > "$1"
}

record_cluster() {  # where loomctl finds this cluster from any directory
  [ "${LOOM_RECORD_CLUSTER:-1}" != 0 ] || return 0
  mkdir -p "$(dirname "$POINTER")" 2>/dev/null || return 0
  (cd "$CLUSTER" && pwd) > "$POINTER" 2>/dev/null || true
}

forget_cluster() {
  [ -f "$POINTER" ] || return 0
  [ "$(cat "$POINTER" 2>/dev/null)" = "$(cd "$CLUSTER" 2>/dev/null && pwd)" ] && rm -f "$POINTER"
  return 0
}

ready_field() {  # ready_field FILE FIELD
  sed -n "s/.*\"$2\":\"\\([^\"]*\\)\".*/\\1/p" "$1"
}

alive() {  # alive PID: running (a zombie, exited but not yet reaped, is not)
  kill -0 "$1" 2>/dev/null || return 1
  local state; state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ "$state" != Z ]
}

wait_ready() {  # wait_ready NAME FILE PID
  local deadline=$((SECONDS + 30))
  while [ ! -s "$2" ]; do
    if ! alive "$3"; then
      echo "local_cluster: $1 exited during startup; last log lines:" >&2
      tail -n 20 "$LOGS/$1.log" >&2 || true
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "local_cluster: $1 not ready after 30 s (see $LOGS/$1.log)" >&2
      return 1
    fi
    sleep 0.1
  done
}

start_daemon() {  # start_daemon NAME BINARY ARGS...
  # The command line is kept (NUL-separated) for `restart NAME`.
  printf '%s\0' "$@" > "$CLUSTER/$1.cmd"
  launch_daemon "$@"
}

launch_daemon() {  # launch_daemon NAME BINARY ARGS...
  local name=$1; shift
  local bin=$1; shift
  if [ ! -x "$bin" ]; then
    echo "local_cluster: $bin is missing; build first: scripts/build.sh" >&2
    return 1
  fi
  rm -f "$CLUSTER/$name.json"
  setsid "$bin" "$@" --ready_file="$CLUSTER/$name.json" >"$LOGS/$name.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$CLUSTER/$name.pid"
  wait_ready "$name" "$CLUSTER/$name.json" "$pid"
}

cmd_start() {
  local workers=2 slots=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --workers) workers=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      *) echo "local_cluster: unknown option $1" >&2; exit 2 ;;
    esac
  done
  if ls "$CLUSTER"/*.pid >/dev/null 2>&1; then
    echo "local_cluster: a cluster seems to be running already (use stop first)" >&2
    exit 1
  fi
  local missing; missing=$(loom_missing_binaries "$BIN")
  if [ -n "$missing" ]; then
    echo "local_cluster: not built: $(echo $missing); build first: scripts/build.sh" >&2
    exit 1
  fi
  mkdir -p "$CLUSTER" "$LOGS" "$LOOM_HOME/checkpoints" "$LOOM_HOME/work"
  load_settings
  save_settings
  local queues_config="${LOOM_QUEUES_CONFIG:-}"
  if [ -z "$queues_config" ] && [ -n "${LOOM_DATA_ROOTS:-}" ]; then
    queues_config="$LOOM_HOME/queues.yaml"
    write_queues_config "$queues_config"
  fi
  trap 'echo "local_cluster: startup failed, stopping what started" >&2; cmd_stop' ERR
  local ckpt_auth=() sched_ckpt_token=()
  if [ -n "${LOOM_AUTH_TOKENS_FILE:-}" ]; then
    # The workers' token is the cluster's service token: the scheduler calls loom-checkpoint
    # with it; users need an admin token there.
    ckpt_auth=(--auth_tokens_file="$LOOM_AUTH_TOKENS_FILE" --service_token_file="${LOOM_WORKER_TOKEN_FILE:?LOOM_WORKER_TOKEN_FILE is required with LOOM_AUTH_TOKENS_FILE}")
    sched_ckpt_token=(--checkpoint_token_file="$LOOM_WORKER_TOKEN_FILE")
  fi
  start_daemon checkpoint "$BIN/services/checkpoint/loom-checkpoint" \
    --checkpoint_root="$LOOM_HOME/checkpoints" "${ckpt_auth[@]+"${ckpt_auth[@]}"}"
  # The scheduler finds resume checkpoints and applies retention through loom-checkpoint.
  local auth=()
  if [ -n "${LOOM_AUTH_TOKENS_FILE:-}" ]; then
    auth=(--auth_tokens_file="$LOOM_AUTH_TOKENS_FILE" --worker_token_file="${LOOM_WORKER_TOKEN_FILE:?LOOM_WORKER_TOKEN_FILE is required with LOOM_AUTH_TOKENS_FILE}")
    # Remembered for add-worker, which may run in a shell without the variable.
    printf 'LOOM_WORKER_TOKEN_FILE=%q\n' "$LOOM_WORKER_TOKEN_FILE" > "$CLUSTER/auth.env"
  fi
  start_daemon scheduler "$BIN/services/scheduler/loom-scheduler" \
    --db="$LOOM_HOME/loom.db" --checkpoint_root="$LOOM_HOME/checkpoints" \
    --checkpoint_service="$(ready_field "$CLUSTER/checkpoint.json" grpc_address)" \
    ${queues_config:+--queues_config="$queues_config"} \
    "${auth[@]+"${auth[@]}"}" "${sched_ckpt_token[@]+"${sched_ckpt_token[@]}"}"
  local gw_auth=()
  [ -z "${LOOM_AUTH_TOKENS_FILE:-}" ] || gw_auth=(--auth_tokens_file="$LOOM_AUTH_TOKENS_FILE")
  # --checkpoint: the /v1/jobs/{id}/checkpoints routes (without it they answer 501).
  start_daemon gateway "$BIN/services/gateway/loom-gateway" \
    --scheduler="$(ready_field "$CLUSTER/scheduler.json" grpc_address)" \
    --checkpoint="$(ready_field "$CLUSTER/checkpoint.json" grpc_address)" \
    --port="${LOOM_GATEWAY_PORT:-0}" "${gw_auth[@]+"${gw_auth[@]}"}"
  for i in $(seq 0 $((workers - 1))); do
    start_worker "$i" "$slots"
  done
  record_cluster
  trap - ERR
  cmd_status
}

start_worker() {  # start_worker INDEX SLOTS
  local sched
  sched=$(ready_field "$CLUSTER/scheduler.json" grpc_address)
  local token=()
  [ -z "${LOOM_WORKER_TOKEN_FILE:-}" ] || token=(--token_file="$LOOM_WORKER_TOKEN_FILE")
  start_daemon "worker-$1" "$BIN/services/worker/loom-worker" \
    --scheduler="$sched" --node_id="worker-$1" --slots="$2" \
    --trainer="$BIN/worker/trainer/loom-trainer" --work_dir="$LOOM_HOME/work/worker-$1" \
    --checkpoint_root="$LOOM_HOME/checkpoints" \
    --data_roots="${LOOM_DATA_ROOTS:-/usr/share/games/fortunes}" \
    --scratch_roots="${LOOM_SCRATCH_ROOTS:-}" \
    "${token[@]+"${token[@]}"}"
}

cmd_add_worker() {
  local slots=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --slots) slots=$2; shift 2 ;;
      *) echo "local_cluster: unknown option $1" >&2; exit 2 ;;
    esac
  done
  if [ ! -s "$CLUSTER/scheduler.json" ]; then
    echo "local_cluster: no running cluster under $LOOM_HOME (start one first)" >&2
    exit 1
  fi
  if [ -z "${LOOM_WORKER_TOKEN_FILE:-}" ] && [ -f "$CLUSTER/auth.env" ]; then
    . "$CLUSTER/auth.env"  # the cluster runs with authentication: the workers' token
  fi
  load_settings  # the data and scratch roots the other workers have
  local i=0
  while [ -e "$CLUSTER/worker-$i.pid" ] || [ -e "$LOOM_HOME/work/worker-$i" ]; do i=$((i + 1)); done
  start_worker "$i" "$slots"
  cmd_status
}

url_port() {  # url_port URL-OR-HOST:PORT -> PORT ("" if none)
  local rest=${1#*://}
  rest=${rest%%/*}
  case "$rest" in *:*) echo "${rest##*:}" ;; *) echo "" ;; esac
}

cmd_restart() {  # cmd_restart NAME
  local name=${1:-}
  if [ -z "$name" ] || [ ! -s "$CLUSTER/$name.cmd" ]; then
    echo "local_cluster: restart: no daemon '${name}' under $LOOM_HOME (one of:" \
      "$(cd "$CLUSTER" 2>/dev/null && ls ./*.cmd 2>/dev/null | sed 's|^\./||; s|\.cmd$||' | tr '\n' ' '))" >&2
    exit 2
  fi
  local ready="$CLUSTER/$name.json"
  if [ ! -s "$ready" ]; then
    echo "local_cluster: restart: $ready is missing: $name never became ready, so its address is" \
      "unknown (stop and start the cluster)" >&2
    exit 1
  fi
  # The address it serves on: the ready file outlives a crashed (kill -9) daemon.
  local grpc metrics http
  grpc=$(url_port "$(ready_field "$ready" grpc_address)")
  metrics=$(url_port "$(ready_field "$ready" metrics_url)")
  http=$(url_port "$(ready_field "$ready" http_url)")
  local keep=()  # the last occurrence of a flag wins
  [ -z "$metrics" ] || keep+=(--metrics_port="$metrics")
  if [ "$name" = gateway ]; then
    [ -z "$http" ] || keep+=(--port="$http")
  elif [ -n "$grpc" ]; then
    keep+=(--port="$grpc")
  fi
  local pid; pid=$(cat "$CLUSTER/$name.pid" 2>/dev/null || echo "")
  if [ -n "$pid" ] && alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if alive "$pid"; then
      echo "local_cluster: pid $pid ignored SIGTERM; killing its process group" >&2
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 5))
      while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    fi
  fi
  local cmd=()
  mapfile -d '' -t cmd < "$CLUSTER/$name.cmd"
  launch_daemon "${cmd[@]}" "${keep[@]+"${keep[@]}"}"
  echo "local_cluster: restarted $name (pid $(cat "$CLUSTER/$name.pid")) with" \
    "${keep[*]:-the flags of its first start}"
}

cmd_status() {
  # One header line per daemon, then one URL per line: metrics, health, readiness (and the
  # gateway's REST API), so that scripts can grep "metrics " lines.
  local any=0
  for f in "$CLUSTER"/*.json; do
    [ -e "$f" ] || continue
    any=1
    local name; name=$(basename "$f" .json)
    local pid; pid=$(cat "$CLUSTER/$name.pid" 2>/dev/null || echo "?")
    local grpc; grpc=$(ready_field "$f" grpc_address)
    local state=running
    alive "$pid" || state=dead
    local metrics; metrics=$(ready_field "$f" metrics_url)
    local base=${metrics%/metrics}
    printf '%-12s pid %-7s %-8s grpc %s\n' "$name" "$pid" "$state" "${grpc:--}"
    printf '  metrics  %s\n' "$metrics"
    printf '  healthz  %s/healthz\n' "$base"
    printf '  readyz   %s/readyz\n' "$base"
    if [ "$name" = gateway ]; then
      local api; api=$(ready_field "$f" http_url)
      printf '  rest     %s/v1/jobs\n' "${api:-?}"
    fi
  done
  [ $any -eq 1 ] || echo "local_cluster: no cluster under $LOOM_HOME"
}

cmd_stop() {
  local pids=()
  # Workers first (they stop their ranks), then the gateway, the checkpoint service and the
  # scheduler.
  for f in "$CLUSTER"/worker-*.pid "$CLUSTER"/gateway.pid "$CLUSTER"/checkpoint.pid "$CLUSTER"/scheduler.pid; do
    [ -e "$f" ] || continue
    local pid; pid=$(cat "$f")
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  local deadline=$((SECONDS + 15))
  for pid in "${pids[@]+"${pids[@]}"}"; do
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if alive "$pid"; then
      echo "local_cluster: pid $pid ignored SIGTERM; killing its process group" >&2
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  forget_cluster
  rm -f "$CLUSTER"/*.pid "$CLUSTER"/*.json "$CLUSTER"/*.cmd "$CLUSTER/auth.env"
  echo "local_cluster: stopped (${#pids[@]} daemons)"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  add-worker) shift; cmd_add_worker "$@" ;;
  status) cmd_status ;;
  restart) shift; cmd_restart "$@" ;;
  stop) cmd_stop ;;
  *) echo "usage: $0 start [--workers N] [--slots S] | add-worker [--slots S] | restart NAME | status | stop" >&2
     exit 2 ;;
esac
