#!/bin/bash
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/observability/check_promql_names_test.py
