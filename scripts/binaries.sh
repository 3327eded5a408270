# The one list of Loom's binaries: what scripts/build.sh builds, what scripts/local_cluster.sh
# starts (and checks for before it starts anything) and what the main job runs. Source it:
#   . scripts/binaries.sh
#   bazel build "${LOOM_BINARY_LABELS[@]}"
#   loom_binary_path loom-gateway      -> bazel-bin/services/gateway/loom-gateway
# Add a binary here and every script that builds or starts the cluster sees it.
LOOM_BINARY_LABELS=(
  //services/scheduler:loom-scheduler
  //services/checkpoint:loom-checkpoint
  //services/gateway:loom-gateway
  //services/worker:loom-worker
  //services/cli:loomctl
  //worker/trainer:loom-trainer
)

# loom_binary_path NAME [BIN_DIR]: the path of binary NAME under BIN_DIR (default bazel-bin).
loom_binary_path() {
  local label
  for label in "${LOOM_BINARY_LABELS[@]}"; do
    if [ "${label##*:}" = "$1" ]; then
      local pkg=${label#//}
      echo "${2:-bazel-bin}/${pkg%%:*}/$1"
      return 0
    fi
  done
  echo "binaries.sh: $1 is not in LOOM_BINARY_LABELS" >&2
  return 1
}

# loom_missing_binaries [BIN_DIR]: prints the binaries of the list that are not built yet.
loom_missing_binaries() {
  local label
  for label in "${LOOM_BINARY_LABELS[@]}"; do
    local path; path=$(loom_binary_path "${label##*:}" "${1:-bazel-bin}")
    [ -x "$path" ] || echo "$path"
  done
}
