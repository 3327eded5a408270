#!/bin/bash
set -euo pipefail
exec /usr/bin/python3 tests/scripts/count_tests_test.py scripts/count_tests.py
