#!/bin/bash
# Runs bible_alst_job_test.py with Debian's python3-torch (not the first python3 on PATH).
set -euo pipefail
exec /usr/bin/python3 tests/python/bible_alst_job_test.py \
  --trainer worker/trainer/loom-trainer --consolidate storage/checkpoint/loom-consolidate \
  --check_export tests/python/check_export.py --example_dir examples/bible-alst
