#!/bin/bash
# ALST max-sequence ablation ladder under a per-rank cgroup memory cap (see bench/alst_search.py).
# Run from the repository root, as root (cgroup v1):  bench/alst_bench.sh [alst_search.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //worker/trainer:loom-trainer  # .bazelrc builds with -O2
exec /opt/loom/venv/bin/python3 bench/alst_search.py --trainer=bazel-bin/worker/trainer/loom-trainer "$@"
