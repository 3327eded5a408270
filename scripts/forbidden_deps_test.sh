#!/bin/bash
# Dependency-boundary check shared by //spec:spec_torch_free_test and
# //scheduler:scheduler_no_engine_test.
# Usage: forbidden_deps_test.sh DEPS_FILE FORBIDDEN_ERE REQUIRED_LABEL WHAT
#   DEPS_FILE: a genquery output (one label a line); FORBIDDEN_ERE: labels that must not appear
#   (grep -E); REQUIRED_LABEL: a label that must appear (the query is not empty or stale);
#   WHAT: the boundary, for the messages. Fails naming each forbidden label found.
set -euo pipefail
deps="$1" forbidden="$2" required="$3" what="$4"
[[ -s "$deps" ]] || { echo "FAIL: $deps is empty or missing" >&2; exit 1; }
echo "$(wc -l < "$deps") labels in $deps"
if grep -E "$forbidden" "$deps"; then
  echo "FAIL: $what: the labels above match $forbidden" >&2
  exit 1
fi
grep -qxF "$required" "$deps" || { echo "FAIL: $required not in $deps" >&2; exit 1; }
echo "PASS: $what"
