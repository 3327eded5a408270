#!/bin/bash
# bazel run //storage/checkpoint:deepspeed_consolidate_bench -- [--size_gb=2.1] [--runs=3]
# Runs bench/deepspeed_consolidate_bench.py (the project venv's torch 2.11) against this build's loomctl.
set -euo pipefail
LOOMCTL="$PWD/services/cli/loomctl"
exec /opt/loom/venv/bin/python3 "${BUILD_WORKSPACE_DIRECTORY:?run it with bazel run}/bench/deepspeed_consolidate_bench.py" \
  --loomctl="$LOOMCTL" "$@"
