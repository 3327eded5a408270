#!/bin/bash
# The Kubernetes manifests reference exactly the images scripts/build_images.sh builds: every
# overlay's rendered workloads (kubectl kustomize, offline) use only images from
# `scripts/build_images.sh --list`, and together the overlays use every one of them. Then two
# negative controls: a base that pins another tag, and an overlay that renames an image, must fail.
set -euo pipefail
export HOME="${TEST_TMPDIR:?}"  # kubectl wants a home for its cache; nothing is contacted
LIST=$(bash scripts/build_images.sh --list)

check() {  # check K8S_DIR: 0 if the images match, 1 (printing why) otherwise
  /opt/loom/venv/bin/python3 - "$1" "$LIST" <<'PY'
import os, subprocess, sys, yaml
k8s, built = sys.argv[1], set(sys.argv[2].split())
used, problems = set(), []
for overlay in sorted(os.listdir(os.path.join(k8s, "overlays"))):
    out = subprocess.run(["kubectl", "kustomize", os.path.join(k8s, "overlays", overlay)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        problems.append("%s: kubectl kustomize failed: %s" % (overlay, out.stderr.strip()))
        continue
    for obj in yaml.safe_load_all(out.stdout):
        if not obj or obj.get("kind") not in ("StatefulSet", "Deployment", "DaemonSet"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            image = c.get("image", "")
            used.add(image)
            if image not in built:
                problems.append("%s: %s/%s uses %r, which scripts/build_images.sh does not build"
                                % (overlay, obj["metadata"]["name"], c.get("name"), image))
for image in sorted(built - used):
    problems.append("no overlay uses %s, which scripts/build_images.sh builds" % image)
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
}

cp -rL deploy/k8s "$TEST_TMPDIR/good"
check "$TEST_TMPDIR/good"
echo "ok: the manifests use exactly: $(echo $LIST)"

expect_failure() {  # expect_failure NAME SED_EXPR FILE PATTERN
  local dir="$TEST_TMPDIR/$1"
  rm -rf "$dir"; mkdir -p "$dir"; cp -rL deploy/k8s "$dir/"
  sed -i "$2" "$dir/k8s/$3"
  if out=$(check "$dir/k8s"); then echo "FAIL: $1 was not rejected"; exit 1; fi
  if ! echo "$out" | grep -q "$4"; then echo "FAIL: $1 rejected without '$4':"; echo "$out"; exit 1; fi
  echo "ok: $1 rejected"
}
expect_failure other_tag 's/newTag: "0.1.0"/newTag: "0.2.0"/' base/worker/kustomization.yaml \
  "uses 'ghcr.io/loom-project/loom-worker:0.2.0', which scripts/build_images.sh does not build"
expect_failure renamed 's/image: loom-gateway /image: loom-gw /' base/gateway.yaml \
  "no overlay uses ghcr.io/loom-project/loom-gateway:0.1.0"
echo "manifests_test: PASS"
