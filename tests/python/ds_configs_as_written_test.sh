#!/bin/bash
# Runs ds_configs_as_written_test.py with the project venv (transformers, accelerate, deepspeed).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/ds_configs_as_written_test.py services/cli/loomctl \
  tests/python/testdata/ds_configs
