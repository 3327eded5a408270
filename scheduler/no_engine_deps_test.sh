#!/bin/bash
# The scheduler must not depend on the training engine (//worker/engine: LibTorch, the trainer).
# $1 is the genquery output (one label a line: deps() of every target of the package, see
# no_engine_deps.bzl); $2 a label that must be in it (the query is not empty or stale). Fails
# naming each //worker/engine label found.
set -euo pipefail
deps="$1"
[[ -s "$deps" ]] || { echo "FAIL: $deps is empty or missing" >&2; exit 1; }
echo "$(wc -l < "$deps") labels in deps(//scheduler targets)"
if grep -E '^//worker/engine([/:]|$)' "$deps"; then
  echo "FAIL: //scheduler depends on //worker/engine through the labels above" >&2
  exit 1
fi
grep -qxF "$2" "$deps" || { echo "FAIL: $2 not in $deps" >&2; exit 1; }
echo "PASS: no //worker/engine label in deps(//scheduler)"
