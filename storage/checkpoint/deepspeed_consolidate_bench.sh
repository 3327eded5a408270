#!/bin/bash
# bazel run //storage/checkpoint:deepspeed_consolidate_bench -- [--size_gb=2.1] [--runs=3]
# Runs bench/deepspeed_consolidate_bench.py (Debian's python3-torch) against this build's loomctl.
set -euo pipefail
LOOMCTL="$PWD/services/cli/loomctl"
exec /usr/bin/python3 "${BUILD_WORKSPACE_DIRECTORY:?run it with bazel run}/bench/deepspeed_consolidate_bench.py" \
  --loomctl="$LOOMCTL" "$@"
