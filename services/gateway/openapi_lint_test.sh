#!/bin/bash
# Checks services/gateway/openapi.json (the document loom-gateway embeds and serves at
# /v1/openapi.json) with openapi_check.py: openapi-spec-validator (the project venv,
# /opt/loom/venv, from scripts/python-requirements.txt) and the project's rules (every operation
# declares a 2xx, a 4xx and a 500 response; operationIds unique; path parameters declared; every
# $ref resolves). Then the self-test: broken copies of the document (a 500 dropped, an invalid
# schema type, a dangling $ref, ...) must each fail, naming the operation.
# LOOM_OPENAPI_DOC=/path/to/doc.json checks another document (the self-test still uses it).
set -euo pipefail
python=/opt/loom/venv/bin/python3
if ! "$python" -c 'import openapi_spec_validator' 2>/dev/null; then
  echo "openapi_lint_test: openapi-spec-validator is not in /opt/loom/venv: run scripts/install_deps.sh" >&2
  exit 1
fi
dir=services/gateway
[ -z "${TEST_SRCDIR:-}" ] || dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/services/gateway"
doc="${LOOM_OPENAPI_DOC:-$dir/openapi.json}"
"$python" "$dir/openapi_check.py" "$doc"
"$python" "$dir/openapi_check.py" --self_test "$doc"
echo "PASS"
