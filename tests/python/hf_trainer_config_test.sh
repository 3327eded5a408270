#!/bin/bash
# Runs hf_trainer_config_test.py with the project venv (transformers, accelerate, deepspeed).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/hf_trainer_config_test.py services/cli/loomctl
