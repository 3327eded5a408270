#!/bin/bash
# Runs check_export_test.py with the project venv's torch 2.11 (not the first python3 on PATH).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/check_export_test.py \
  --trainer worker/trainer/loom-trainer --consolidate storage/checkpoint/loom-consolidate \
  --check_export tests/python/check_export.py --hf_load_export tests/python/hf_load_export.py
