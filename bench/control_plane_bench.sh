#!/bin/bash
# Control-plane benchmark at cluster scale (see bench/control_plane_bench.py): a real
# loom-scheduler daemon, simulated nodes heartbeating from a separate load-generator process, and
# submissions against a local Slurm controller. Run from anywhere:
#   bench/control_plane_bench.sh [control_plane_bench.py flags, e.g. --nodes=2000 --sweep]
set -euo pipefail
cd "$(dirname "$0")/.."
# The Slurm peer: Debian's slurmctld, sbatch and munge (no slurmd: the jobs stay pending).
if ! dpkg -s slurmctld slurm-client munge >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y --no-install-recommends \
    slurmctld slurm-client munge
fi
bazel build //services/scheduler:loom-scheduler //services/scheduler:control_plane_loadgen  # .bazelrc builds with -O2
exec /opt/loom/venv/bin/python3 bench/control_plane_bench.py \
  --scheduler=bazel-bin/services/scheduler/loom-scheduler \
  --loadgen=bazel-bin/services/scheduler/control_plane_loadgen "$@"
