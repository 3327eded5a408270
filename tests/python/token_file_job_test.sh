#!/bin/bash
# Runs token_file_job_test.py with Debian's python3 (numpy), not the first python3 on PATH.
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/token_file_job_test.py --trainer worker/trainer/loom-trainer
