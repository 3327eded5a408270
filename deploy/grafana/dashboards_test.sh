#!/bin/bash
# The checked-in dashboards are exactly what generate_dashboards.py produces.
set -euo pipefail
/opt/loom/venv/bin/python3 deploy/grafana/generate_dashboards.py "$TEST_TMPDIR"
for f in deploy/grafana/*.json; do
  if ! diff -u "$f" "$TEST_TMPDIR/$(basename "$f")"; then
    echo "FAIL: $f differs from generate_dashboards.py's output; rerun it" >&2
    exit 1
  fi
done
n=$(ls "$TEST_TMPDIR"/*.json | wc -l)
[ "$n" -eq "$(ls deploy/grafana/*.json | wc -l)" ] || { echo "FAIL: generator writes $n files"; exit 1; }
echo "dashboards_test: PASS ($n dashboards)"
