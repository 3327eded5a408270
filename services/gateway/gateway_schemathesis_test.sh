#!/bin/bash
# Runs gateway_schemathesis_test.py with the project venv's schemathesis (not the first python3
# on PATH): a live loom-checkpoint, loom-scheduler and loom-gateway on loopback, cross-tenant
# checks, then schemathesis with each tenant's token against openapi.json.
set -euo pipefail
exec /opt/loom/venv/bin/python3 services/gateway/gateway_schemathesis_test.py \
  --checkpoint services/checkpoint/loom-checkpoint --scheduler services/scheduler/loom-scheduler \
  --gateway services/gateway/loom-gateway --openapi services/gateway/openapi.json "$@"
