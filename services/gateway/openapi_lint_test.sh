#!/usr/bin/env bash
# Lints services/gateway/openapi.json (the document loom-gateway embeds and serves at
# /v1/openapi.json) with Redocly's CLI and services/gateway/redocly.yaml; fails on any error or
# warning. The CLI comes from scripts/install_deps.sh (/opt/loom/redocly; override with
# LOOM_REDOCLY=/path/to/redocly).
set -euo pipefail
redocly="${LOOM_REDOCLY:-/opt/loom/redocly/node_modules/.bin/redocly}"
if [ ! -x "$redocly" ]; then
  echo "openapi_lint_test: Redocly's CLI is not at $redocly: run scripts/install_deps.sh" >&2
  exit 1
fi
dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/services/gateway"
doc="${LOOM_OPENAPI_DOC:-$dir/openapi.json}"
export HOME="${TEST_TMPDIR:-/tmp}" REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true
set +e
out="$("$redocly" lint --config "$dir/redocly.yaml" --format stylish "$doc" 2>&1)"
rc=$?
set -e
echo "$out"
if [ "$rc" -ne 0 ]; then
  echo "openapi_lint_test: redocly lint failed (exit $rc) on $doc" >&2
  exit 1
fi
if echo "$out" | grep -Eq '[0-9]+ warnings?'; then
  echo "openapi_lint_test: redocly lint reported warnings on $doc" >&2
  exit 1
fi
echo "openapi_lint_test: $doc is valid with no warnings"
