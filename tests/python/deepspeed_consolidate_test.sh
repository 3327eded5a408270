#!/bin/bash
# Runs deepspeed_consolidate_test.py with the project venv's torch 2.11 against the built loomctl.
# --large_mb=N: only the peak-RSS case, on a stage-3 checkpoint of about N MB (the >= 2 GB
# acceptance run is //tests/python:deepspeed_consolidate_2gb_test).
set -euo pipefail
export LOOMCTL="${LOOMCTL:-$PWD/services/cli/loomctl}"
for a in "$@"; do
  case "$a" in
    --large_mb=*) export DS_CONSOLIDATE_LARGE_MB="${a#--large_mb=}" DS_CONSOLIDATE_ONLY_LARGE=1 ;;
    *) echo "deepspeed_consolidate_test.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
exec /opt/loom/venv/bin/python3 tests/python/deepspeed_consolidate_test.py
