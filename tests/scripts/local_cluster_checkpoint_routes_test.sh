#!/bin/bash
# scripts/local_cluster.sh gives loom-gateway the checkpoint service (--checkpoint), so the REST
# checkpoint routes answer from loom-checkpoint instead of 501. Starts the real daemons (no
# workers: nothing trains), then through the gateway's HTTP port: GET /v1/jobs/<id>/checkpoints
# of a job directory that exists (200, a JSON object) and of one that does not (404 naming it).
set -euo pipefail
export LOOM_HOME="$TEST_TMPDIR/loom" LOOM_BIN="$PWD"
cleanup() { bash scripts/local_cluster.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
bash scripts/local_cluster.sh start --workers 0
mkdir -p "$LOOM_HOME/checkpoints/route-job"
api=$(sed -n 's/.*"http_url":"\([^"]*\)".*/\1/p' "$LOOM_HOME/cluster/gateway.json")
[ -n "$api" ] || { echo "FAIL: no http_url in $LOOM_HOME/cluster/gateway.json"; exit 1; }
get() {  # get PATH -> "<status> <body>"
  /opt/loom/venv/bin/python3 - "$api$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=30) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}
out=$(get /v1/jobs/route-job/checkpoints)
echo "GET /v1/jobs/route-job/checkpoints -> $out"
[[ "$out" == "200 {"* ]] || { echo "FAIL: want 200 and a JSON object (501: no --checkpoint)"; exit 1; }
out=$(get /v1/jobs/no-such-job/checkpoints)
echo "GET /v1/jobs/no-such-job/checkpoints -> $out"
[[ "$out" == "404 "*no-such-job* ]] || { echo "FAIL: want 404 naming no-such-job"; exit 1; }
echo "PASS"
