#!/usr/bin/env bash
# Runs every Loom test: installs what is missing, then `bazel test //...`, then prints one line
# "N passed, N failed" counted from the test cases in Bazel's test.xml files.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install_deps.sh || exit 1

bazel test //... "$@"
rc=$?

# Count test cases (not targets) from the JUnit XML each test wrote.
counts=$(/usr/bin/python3 - "$(bazel info bazel-testlogs 2>/dev/null)" <<'PY'
import os, sys, xml.etree.ElementTree as ET
root = sys.argv[1]
passed = failed = 0
for dirpath, _, files in os.walk(root):
    if "test.xml" not in files:
        continue
    try:
        tree = ET.parse(os.path.join(dirpath, "test.xml"))
    except ET.ParseError:
        failed += 1
        continue
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is None and case.get("status", "run") != "notrun":
            passed += 1
print(passed, failed)
PY
)
bazel shutdown 2>/dev/null || true
passed=${counts% *}
failed=${counts#* }
if [ "$rc" -ne 0 ] && [ "${failed:-0}" -eq 0 ]; then
  failed=1  # a build failure or a test that died before writing its XML
fi
echo "${passed:-0} passed, ${failed:-0} failed"
exit $rc
