#!/bin/bash
# Runs deepspeed_ckpt_test.py with Debian's python3-torch (not the first python3 on PATH).
set -euo pipefail
exec /usr/bin/python3 tests/python/deepspeed_ckpt_test.py
