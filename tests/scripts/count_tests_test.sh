#!/bin/bash
set -euo pipefail
exec /opt/loom/venv/bin/python3 tests/scripts/count_tests_test.py scripts/count_tests.py
