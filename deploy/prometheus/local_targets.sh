#!/usr/bin/env bash
# Writes Prometheus file-discovery targets for the local cluster (scripts/local_cluster.sh) to
# deploy/prometheus/targets/local.json, one target per daemon labelled loom_daemon=loom-<kind>,
# from the daemons' ready files ($LOOM_HOME/cluster/*.json). Rerun after every cluster start.
#   deploy/prometheus/local_targets.sh [OUTPUT]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOOM_HOME="${LOOM_HOME:-$ROOT/.loom}"
OUT="${1:-$ROOT/deploy/prometheus/targets/local.json}"
mkdir -p "$(dirname "$OUT")"
entries=()
for f in "$LOOM_HOME"/cluster/*.json; do
  [ -e "$f" ] || continue
  url=$(sed -n 's/.*"metrics_url":"\([^"]*\)".*/\1/p' "$f")
  [ -n "$url" ] || continue
  name=$(basename "$f" .json)
  hostport=${url#http://}; hostport=${hostport%%/*}
  entries+=("{\"targets\":[\"$hostport\"],\"labels\":{\"loom_daemon\":\"loom-${name%%-[0-9]*}\",\"daemon\":\"$name\"}}")
done
if [ ${#entries[@]} -eq 0 ]; then
  echo "local_targets: no ready files under $LOOM_HOME/cluster (start the cluster first)" >&2
  exit 1
fi
(IFS=,; echo "[${entries[*]}]") > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "local_targets: ${#entries[@]} targets -> $OUT"
