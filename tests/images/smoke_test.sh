#!/usr/bin/env bash
# Image smoke test (not in the default test command: building the images takes a debootstrap of
# two Debian root file systems and about 3 GB of disk; README "Container images").
#   sudo tests/images/smoke_test.sh [WORK_DIR]      (default /tmp/loom-images-smoke; removed at exit)
#   sudo tests/images/smoke_test.sh --reuse WORK_DIR  checks the images a
#        `scripts/build_images.sh --work_dir WORK_DIR --keep` left there (and removes them after)
# Builds every image with scripts/build_images.sh, then for each one opens its root file system
# (`buildah from` + `buildah mount`; podman cannot run containers in this sandbox) and runs the
# entrypoint there with chroot as the image's user (uid 10001):
#   * every binary (loom-scheduler, loom-checkpoint, loom-gateway, loom-worker, loom-trainer)
#     starts and prints absl's usage text for --help (absl exits 1 after --help), so its shared
#     libraries all resolve inside the image;
#   * the image's user is 10001 and its entrypoint the daemon (buildah inspect);
#   * loom-scheduler, started inside the scheduler image on loopback ports chosen by the kernel
#     (--port=0 --metrics_port=0), writes its ready file and answers /readyz with 200.
# Exit status 0 when all pass.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REUSE=0
if [ "${1:-}" = --reuse ]; then REUSE=1; shift; fi
WORK=${1:-/tmp/loom-images-smoke}
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
SCHED_PID=""
MOUNTED=()
cleanup() {
  [ -n "$SCHED_PID" ] && kill "$SCHED_PID" 2>/dev/null || true
  "${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
  "${BUILDAH[@]}" rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in buildah chroot curl; do
  command -v "$tool" >/dev/null || { echo "images smoke_test: $tool is missing (apt-get install buildah curl)" >&2; exit 2; }
done
if [ "$(id -u)" != 0 ]; then echo "images smoke_test: needs root (buildah mount, chroot): run it as root or with sudo" >&2; exit 2; fi
if [ "$REUSE" = 1 ] && [ ! -d "$WORK/storage" ]; then
  echo "images smoke_test: --reuse $WORK: no image storage at $WORK/storage (run scripts/build_images.sh --work_dir $WORK --keep first)" >&2
  trap - EXIT; exit 2
fi

cd "$ROOT"
if [ "$REUSE" = 0 ]; then bash scripts/build_images.sh --work_dir "$WORK" --keep; fi
mapfile -t IMAGES < <(bash scripts/build_images.sh --list)

open_image() {  # open_image IMAGE: prints the mount point of a new working container
  local ctr; ctr=$("${BUILDAH[@]}" from --pull-never "$1")
  "${BUILDAH[@]}" mount "$ctr"
}

for image in "${IMAGES[@]}"; do
  name=${image##*/}; name=${name%%:*}
  user=$("${BUILDAH[@]}" inspect --format '{{.OCIv1.Config.User}}' "$image" 2>/dev/null) ||
    fail "$image is not in $WORK/storage (did scripts/build_images.sh finish?)"
  entry=$("${BUILDAH[@]}" inspect --format '{{.OCIv1.Config.Entrypoint}}' "$image")
  [ "$user" = "10001:10001" ] || fail "$image runs as '$user', not 10001:10001"
  [ "$entry" = "[/usr/local/bin/$name]" ] || fail "$image entrypoint is $entry"
  mnt=$(open_image "$image")
  bins=("$name"); [ "$name" = loom-worker ] && bins+=(loom-trainer)
  for bin in "${bins[@]}"; do
    set +e
    out=$(chroot --userspec=10001:10001 "$mnt" "/usr/local/bin/$bin" --help 2>&1)
    rc=$?
    set -e
    # absl's --help: usage text ending in "Try --helpfull ...", exit status 1.
    if [ "$rc" != 1 ] || ! grep -q -- "--helpfull" <<<"$out" || grep -q "error while loading shared libraries" <<<"$out"; then
      echo "$out" | tail -5 >&2
      fail "$bin --help in $image exited $rc"
    fi
    echo "ok: $image: $bin starts as uid 10001 and prints absl's usage for --help"
  done
  if [ "$name" = loom-scheduler ]; then
    mkdir -p "$mnt/tmp/smoke"; chown 10001:10001 "$mnt/tmp/smoke"
    chroot --userspec=10001:10001 "$mnt" /usr/local/bin/loom-scheduler --host=127.0.0.1 --port=0 \
      --metrics_port=0 --db=/tmp/smoke/loom.db --checkpoint_root=/tmp/smoke/checkpoints \
      --ready_file=/tmp/smoke/ready.json > "$WORK/scheduler.log" 2>&1 &
    SCHED_PID=$!
    deadline=$((SECONDS + 60))
    while [ ! -s "$mnt/tmp/smoke/ready.json" ]; do
      kill -0 "$SCHED_PID" 2>/dev/null || { tail -20 "$WORK/scheduler.log" >&2; fail "loom-scheduler exited during startup"; }
      [ $SECONDS -lt $deadline ] || fail "loom-scheduler not ready after 60 s"
      sleep 0.1
    done
    metrics=$(sed -n 's/.*"metrics_url":"\([^"]*\)".*/\1/p' "$mnt/tmp/smoke/ready.json")
    grpc=$(sed -n 's/.*"grpc_address":"\([^"]*\)".*/\1/p' "$mnt/tmp/smoke/ready.json")
    case "$grpc" in 127.0.0.1:[1-9]*) ;; *) fail "ready file grpc_address '$grpc' is not a loopback port" ;; esac
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "${metrics%/metrics}/readyz")
    [ "$code" = 200 ] || fail "loom-scheduler /readyz at $metrics answered $code"
    echo "ok: $image: loom-scheduler ready inside the image (gRPC $grpc, /readyz 200)"
    kill "$SCHED_PID"; wait "$SCHED_PID" 2>/dev/null || true; SCHED_PID=""
  fi
done
echo "images smoke_test: PASS (${#IMAGES[@]} images)"
