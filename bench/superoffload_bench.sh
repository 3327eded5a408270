#!/bin/bash
# SuperOffload vs synchronous ZeRO-Offload benchmark (see bench/superoffload_bench.py).
# Run from the repository root:  bench/superoffload_bench.sh [superoffload_bench.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //worker/trainer:loom-trainer  # .bazelrc builds with -O2
exec /opt/loom/venv/bin/python3 bench/superoffload_bench.py --trainer=bazel-bin/worker/trainer/loom-trainer "$@"
