#!/bin/bash
# ZenFlow vs synchronous ZeRO-Offload benchmark (see bench/zenflow_bench.py).
# Run from the repository root:  bench/zenflow_bench.sh [zenflow_bench.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //worker/trainer:loom-trainer  # .bazelrc builds with -O2
exec /opt/loom/venv/bin/python3 bench/zenflow_bench.py --trainer=bazel-bin/worker/trainer/loom-trainer "$@"
