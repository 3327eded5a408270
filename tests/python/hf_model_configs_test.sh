#!/bin/bash
# Runs hf_model_configs_test.py with the project venv (transformers 5.25, torch 2.11).
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/hf_model_configs_test.py spec/rope_dump
