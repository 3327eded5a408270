#!/bin/bash
# Runs deepspeed_ckpt_test.py with the project venv's torch 2.11 (not the first python3 on PATH).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/deepspeed_ckpt_test.py
