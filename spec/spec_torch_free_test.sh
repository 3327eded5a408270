#!/bin/bash
# //spec must stay torch-free: the scheduler links it. $1 is the genquery output (one label a
# line: deps of every //spec library). Fails naming each LibTorch label found.
set -euo pipefail
deps="$1"
[[ -s "$deps" ]] || { echo "FAIL: $deps is empty or missing" >&2; exit 1; }
echo "$(wc -l < "$deps") labels in deps(//spec libraries)"
if grep -E '^@libtorch|libtorch' "$deps"; then
  echo "FAIL: //spec reaches LibTorch through the labels above" >&2
  exit 1
fi
grep -q '^//spec:ds_config$' "$deps" || { echo "FAIL: //spec:ds_config not in $deps" >&2; exit 1; }
echo "PASS: no LibTorch label in deps(//spec)"
