#!/bin/bash
set -euo pipefail
exec /usr/bin/python3 tests/observability/check_promql_names_test.py
