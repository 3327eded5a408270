#!/bin/bash
# See zenflow_adamw_test.py.
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/python/zenflow_adamw_test.py worker/engine/optim/zenflow_adamw_tool
