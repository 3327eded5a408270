#!/bin/bash
# Runs monitor_test.py with the venv's python3 (tensorboard, numpy).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/monitor_test.py --trainer worker/trainer/loom-trainer
