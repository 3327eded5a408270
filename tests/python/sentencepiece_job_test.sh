#!/bin/bash
# Runs sentencepiece_job_test.py with the project venv's torch 2.11 (not the first python3 on PATH).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/sentencepiece_job_test.py \
  --trainer worker/trainer/loom-trainer --consolidate storage/checkpoint/loom-consolidate \
  --check_export tests/python/check_export.py --example_dir examples/fortunes-sentencepiece
