#!/usr/bin/env bash
# Builds every Loom binary the local cluster and the main job need (the list is
# scripts/binaries.sh). Extra arguments go to bazel build (e.g. -c opt).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/binaries.sh
bazel build "$@" "${LOOM_BINARY_LABELS[@]}"
