#!/bin/bash
# Checks deploy/prometheus offline with Debian's promtool and python3-yaml:
#  1. alerts.yml parses and its unit tests (alerts_test.yml) pass;
#  2. local_targets.sh turns a cluster's ready files into file_sd targets that prometheus.yml
#     accepts (promtool check config);
#  3. prometheus-kubernetes.yml keeps annotated Loom pods, maps the job label and loads the rules.
set -euo pipefail
DIR=deploy/prometheus
/usr/bin/promtool check rules "$DIR/alerts.yml"
/usr/bin/promtool test rules "$DIR/alerts_test.yml"

work="$TEST_TMPDIR/prom"
mkdir -p "$work/home/cluster"
cp "$DIR/prometheus.yml" "$DIR/alerts.yml" "$work/"
cat > "$work/home/cluster/scheduler.json" <<'J'
{"name":"loom-scheduler","grpc_address":"127.0.0.1:4001","metrics_url":"http://127.0.0.1:4002/metrics"}
J
cat > "$work/home/cluster/worker-0.json" <<'J'
{"name":"loom-worker","grpc_address":"127.0.0.1:4003","metrics_url":"http://127.0.0.1:4004/metrics"}
J
LOOM_HOME="$work/home" "$DIR/local_targets.sh" "$work/targets/local.json"
/opt/loom/venv/bin/python3 - "$work/targets/local.json" <<'PY'
import json, sys
targets = json.load(open(sys.argv[1]))
got = sorted((t["targets"][0], t["labels"]["loom_daemon"], t["labels"]["daemon"]) for t in targets)
want = [("127.0.0.1:4002", "loom-scheduler", "scheduler"), ("127.0.0.1:4004", "loom-worker", "worker-0")]
assert got == want, got
PY
out=$(/usr/bin/promtool check config "$work/prometheus.yml" 2>&1)
echo "$out"
if echo "$out" | grep -q "does not exist"; then echo "FAIL: target files not found" >&2; exit 1; fi

/opt/loom/venv/bin/python3 - "$DIR/prometheus-kubernetes.yml" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
assert cfg["rule_files"] == ["alerts.yml"], cfg["rule_files"]
(job,) = cfg["scrape_configs"]
assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
relabels = job["relabel_configs"]
keeps = {r["source_labels"][0]: r["regex"] for r in relabels if r.get("action") == "keep"}
assert keeps == {"__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
                 "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "loom"}, keeps
targets = {r["target_label"]: r["source_labels"] for r in relabels if "target_label" in r}
assert targets["job"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], targets
assert targets["__metrics_path__"] == ["__meta_kubernetes_pod_annotation_prometheus_io_path"]
assert targets["__address__"] == ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"]
print("prometheus-kubernetes.yml: ok")
PY
echo "alerts_test: PASS"
