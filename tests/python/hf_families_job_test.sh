#!/bin/bash
# Runs hf_families_job_test.py with the project venv (transformers 5.25, torch 2.11).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/hf_families_job_test.py \
  --trainer worker/trainer/loom-trainer --consolidate storage/checkpoint/loom-consolidate \
  --hf_load_export tests/python/hf_load_export.py
