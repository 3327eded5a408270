#!/usr/bin/env bash
# Runs every Loom test: installs what is missing, then `bazel test //...`, then prints one line
# "N passed, N failed, N skipped" counted by scripts/count_tests.py from this invocation's build
# event file (only the targets this run configured; a target that failed to build or died without
# its XML counts as failed).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install_deps.sh || exit 1

bep_dir=$(mktemp -d)
trap 'rm -rf "$bep_dir"' EXIT
bazel test //... --build_event_json_file="$bep_dir/bep.json" "$@"
rc=$?

/opt/loom/venv/bin/python3 scripts/count_tests.py "$bep_dir/bep.json" --bazel_rc "$rc"
count_rc=$?
bazel shutdown 2>/dev/null || true
if [ "$rc" -eq 0 ] && [ "$count_rc" -ne 0 ]; then rc=1; fi
exit $rc
