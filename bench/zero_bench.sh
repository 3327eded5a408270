#!/bin/bash
# Loom ZeRO vs PyTorch DDP / ZeroRedundancyOptimizer benchmark (see bench/zero_bench.py).
# Run from the repository root:  bench/zero_bench.sh [zero_bench.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //worker/trainer:loom-trainer  # .bazelrc builds with -O2
exec /opt/loom/venv/bin/python3 bench/zero_bench.py --trainer=bazel-bin/worker/trainer/loom-trainer "$@"
