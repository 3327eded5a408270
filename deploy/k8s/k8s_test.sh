#!/bin/bash
# Renders every overlay in deploy/k8s with `kubectl kustomize` (offline) and validates the
# objects with validate.py (the Kubernetes API schema via kubernetes-validate, which bundles the
# schemas, then Loom's own claims); then checks that the validator rejects broken manifests.
set -euo pipefail
export HOME="$TEST_TMPDIR"  # kubectl wants a home for its cache; nothing is contacted
VALIDATE=deploy/k8s/validate.py
# kustomize refuses files that are symlinks out of its root, which runfiles are: use a real copy.
cp -rL deploy/k8s "$TEST_TMPDIR/good"
/opt/loom/venv/bin/python3 "$VALIDATE" "$TEST_TMPDIR/good"

# Mutations the validator must catch: copy the tree (dereferencing runfiles symlinks) and break it.
expect_failure() {  # expect_failure NAME SED_EXPR FILE TEXT... (fixed strings, each required)
  local dir="$TEST_TMPDIR/$1"
  rm -rf "$dir"; mkdir -p "$dir"; cp -rL deploy/k8s "$dir/"
  sed -i "$2" "$dir/k8s/$3"
  if out=$(/opt/loom/venv/bin/python3 "$VALIDATE" "$dir/k8s" 2>&1); then
    echo "FAIL: $1 was not rejected:"; echo "$out"; exit 1
  fi
  local text
  for text in "${@:4}"; do
    if ! echo "$out" | grep -qF -- "$text"; then
      echo "FAIL: $1 rejected without '$text':"; echo "$out"; exit 1
    fi
  done
  echo "ok: $1 rejected"
}
expect_failure gpu_count_vs_slots 's/nvidia.com\/gpu: 8/nvidia.com\/gpu: 4/' \
  overlays/gpu-h100-h200/h200/worker-gpu.yaml "GPUs 4/4 vs slots 8"
expect_failure probe_port 's/port: metrics/port: nometrics/' base/checkpoint.yaml \
  "readinessProbe port 'nometrics' is not a declared container port"
expect_failure arm64 's/kubernetes.io\/arch: arm64/kubernetes.io\/arch: amd64/' \
  overlays/gh200/worker-gh200.yaml "is not pinned to arm64"
expect_failure scrape_port 's/prometheus.io\/port: "9100"/prometheus.io\/port: "9999"/' \
  base/worker/worker.yaml "is not its metrics port"
expect_failure auth_secret 's/token_file=\/etc\/loom\/auth\/worker.token/token_file=\/tmp\/worker.token/' \
  overlays/cpu-dev-auth/kustomization.yaml "loom-worker: missing --token_file"
expect_failure gateway_checkpoint '/--checkpoint=loom-checkpoint/d' base/gateway.yaml \
  "loom-gateway: --checkpoint=(absent), want loom-checkpoint:50052"
expect_failure scheduler_checkpoint 's/--checkpoint_service=loom-checkpoint:50052/--checkpoint_service=loom-checkpoint:9/' \
  base/scheduler.yaml "loom-scheduler: --checkpoint_service=loom-checkpoint:9, want loom-checkpoint:50052"
# Mistakes only the Kubernetes schema (strict) catches; the error names the object and the field.
# A failing schema check stops the overlay before Loom's checks (which assume well-formed objects).
expect_failure schema_unknown_field 's/replicas: 2/replica: 2/' base/gateway.yaml \
  "Deployment/loom-gateway: spec: Additional properties are not allowed ('replica' was unexpected)" \
  "cpu-dev: Loom's own checks skipped until every object passes the schema"
expect_failure schema_misspelled_probe_field 's/periodSeconds: 5/periodSecond: 5/' base/gateway.yaml \
  "Deployment/loom-gateway: spec.template.spec.containers[gateway].readinessProbe: Additional properties are not allowed ('periodSecond' was unexpected)"
expect_failure schema_string_for_integer 's/containerPort: 8080/containerPort: "x"/' base/gateway.yaml \
  "Deployment/loom-gateway: spec.template.spec.containers[gateway].ports[http].containerPort: 'x' is not of type 'integer'"
expect_failure schema_missing_containers '/^      containers:/,/^      volumes:/{/^      volumes:/!d}' \
  base/gateway.yaml "Deployment/loom-gateway: spec.template.spec: 'containers' is a required property"
expect_failure schema_unknown_api_version 's/^apiVersion: apps\/v1$/apiVersion: apps\/v1beta1/' base/checkpoint.yaml \
  "Deployment/loom-checkpoint: Couldn't find schema for kind Deployment with api version apps/v1beta1 for kubernetes version 1.32"
# The schema types a quantity as "string or number": its syntax stays validate.py's check.
expect_failure quantity_syntax 's/storage: 500Gi/storage: 500Gx/' base/checkpoints-pvc.yaml \
  "PVC loom-checkpoints: bad storage request"
echo "k8s_test: PASS"
