#!/usr/bin/env bash
# Builds Loom's daemon container images with Debian's buildah, offline from any registry: the
# base is a Debian 12 (bookworm) root file system made here with debootstrap from the Debian
# archive, holding exactly the runtime packages the binaries link against (found with ldd +
# dpkg -S), plus the user loom (uid/gid 10001). One Containerfile per image in deploy/images/:
#
#   ghcr.io/loom-project/loom-scheduler:TAG   loom-scheduler      (control-plane root fs)
#   ghcr.io/loom-project/loom-checkpoint:TAG  loom-checkpoint     (control-plane root fs)
#   ghcr.io/loom-project/loom-gateway:TAG     loom-gateway        (control-plane root fs)
#   ghcr.io/loom-project/loom-worker:TAG      loom-worker + loom-trainer (worker root fs:
#                                             Debian's libraries, the PyTorch wheel's LibTorch
#                                             with its CUDA, cuDNN and NCCL, and fortunes)
#
# deploy/k8s names exactly these images and tags (deploy/images/manifests_test.sh checks it).
#
# Usage: scripts/build_images.sh [--list] [--tag TAG] [--work_dir DIR] [--keep]
#                                [--mirror URL] [-- BAZEL_BUILD_ARGS...]
#   --list      print the image references this script builds, one a line, and exit
#   --tag       image tag (default 0.1.0, the tag deploy/k8s pins)
#   --work_dir  scratch and image storage (default /tmp/loom-images); buildah runs with
#               --root DIR/storage --runroot DIR/run, so nothing is written to the host's own
#               container storage
#   --keep      keep DIR/storage (the images) after the build, for tests/images/smoke_test.sh or
#               `buildah --root DIR/storage push`; without it the whole DIR is removed at exit
#   --mirror    Debian archive (default http://deb.debian.org/debian)
# Architecture: the host's (dpkg --print-architecture: amd64, or arm64 on a GH200); the
# binaries are built natively by Bazel, so an arm64 image is built on an arm64 machine with the
# same command (then `buildah manifest create` + `manifest add` join the two into one tag).
# Disk (measured 2026-12-01, amd64): root fs tarballs 157 MB (control plane) and 1.03 GB (worker),
# each root fs directory removed once its tarball exists; images 160/158/158 MB and 1.03 GB, vfs
# storage 1.5 GB in all. Build time then: 39 min at load average ~20 (two debootstraps). Since
# LibTorch comes from the PyTorch wheel (2026-12-07) the worker root fs also holds the wheel's
# library folders, 3.6 GB (measured with venv_lib_dirs_of; no image was built since). Needs
# root (debootstrap, chroot). Exit status: 0 OK, 2 usage or missing tools, 1 a failed step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REGISTRY=ghcr.io/loom-project
TAG=0.1.0
WORK=/tmp/loom-images
KEEP=0
LIST=0
MIRROR=http://deb.debian.org/debian
BAZEL_ARGS=()
IMAGES=(loom-scheduler loom-checkpoint loom-gateway loom-worker)

while [ $# -gt 0 ]; do
  case "$1" in
    --list) LIST=1 ;;
    --tag) TAG=${2:?--tag needs a value}; shift ;;
    --work_dir) WORK=${2:?--work_dir needs a value}; shift ;;
    --keep) KEEP=1 ;;
    --mirror) MIRROR=${2:?--mirror needs a value}; shift ;;
    --) shift; BAZEL_ARGS=("$@"); break ;;
    *) echo "build_images: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
if ! [[ "$TAG" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]]; then
  echo "build_images: --tag '$TAG' is not a valid image tag" >&2; exit 2
fi

if [ "$LIST" = 1 ]; then
  for image in "${IMAGES[@]}"; do echo "$REGISTRY/$image:$TAG"; done
  exit 0
fi

# The binaries of each image, and which root file system it uses.
binaries_of() {
  case "$1" in
    loom-worker) echo "loom-worker loom-trainer" ;;
    *) echo "$1" ;;
  esac
}
rootfs_of() { [ "$1" = loom-worker ] && echo worker || echo control; }

for tool in debootstrap buildah bazel chroot ldd dpkg tar; do
  if ! command -v "$tool" >/dev/null; then
    echo "build_images: $tool is missing (apt-get install debootstrap buildah; bazel: scripts/install_deps.sh)" >&2
    exit 2
  fi
done
if [ "$(id -u)" != 0 ]; then echo "build_images: needs root (debootstrap, chroot): run it as root or with sudo" >&2; exit 2; fi
# Disk: the worker root fs carries the wheel's libraries (3.6 GB: LibTorch, CUDA, cuDNN, NCCL),
# once as a directory, once in its tarball and once in the image: about 12 GiB in all.
NEED_KB=$((12 * 1024 * 1024))
parent=$WORK; while [ ! -d "$parent" ]; do parent=$(dirname "$parent"); done
free_kb=$(df -Pk "$parent" | awk 'NR == 2 {print $4}')
if [ "${free_kb:-0}" -lt "$NEED_KB" ]; then
  echo "build_images: $parent has $((free_kb / 1024)) MiB free; the build needs about 12 GiB under --work_dir $WORK" >&2
  exit 2
fi
ARCH=$(dpkg --print-architecture)
case "$ARCH" in amd64|arm64) ;; *) echo "build_images: architecture $ARCH is not amd64 or arm64" >&2; exit 2 ;; esac

cleanup() {
  # Root file systems and build contexts always go; the image storage unless --keep.
  rm -rf "$WORK/rootfs-control" "$WORK/rootfs-worker" "$WORK/ctx" "$WORK/debs"
  if [ "$KEEP" = 0 ]; then
    buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
mkdir -p "$WORK"
BUILDAH=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)

# 1. The binaries (the one list: scripts/binaries.sh).
cd "$ROOT"
. scripts/binaries.sh
labels=()
for image in "${IMAGES[@]}"; do
  for bin in $(binaries_of "$image"); do
    for label in "${LOOM_BINARY_LABELS[@]}"; do [ "${label##*:}" = "$bin" ] && labels+=("$label"); done
  done
done
echo "build_images: bazel build ${labels[*]}"
bazel build "${BAZEL_ARGS[@]+"${BAZEL_ARGS[@]}"}" "${labels[@]}"
BIN_DIR=$(bazel info "${BAZEL_ARGS[@]+"${BAZEL_ARGS[@]}"}" bazel-bin)

# 2. The Debian packages that hold the shared libraries `ldd` finds for the given binaries
# (Debian 12 is merged-/usr, so /lib/... is looked up as /usr/lib/... too). Libraries of the
# project venv's PyTorch wheel (/opt/loom/...: LibTorch, the CUDA runtime, cuBLAS, cuDNN, NCCL)
# belong to no Debian package: venv_lib_dirs_of lists their folders, which make_rootfs copies.
VENV_PREFIX=/opt/loom/
venv_lib_dirs_of() {
  local bin lib p
  for bin in "$@"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u | while read -r lib; do
    p=$(readlink -f "$lib")
    case "$p" in "$VENV_PREFIX"*) dirname "$p" ;; esac
  done | sort -u
}
packages_for() {
  local bin lib p
  local -a libs=() candidates=()
  for bin in "$@"; do
    if ldd "$bin" | grep -q "not found"; then
      echo "build_images: $bin needs libraries that are not installed:" >&2
      ldd "$bin" | grep "not found" >&2
      return 1
    fi
  done
  mapfile -t libs < <(for bin in "$@"; do ldd "$bin" | awk '/=> \//{print $3}'; done | sort -u |
    while read -r lib; do case "$(readlink -f "$lib")" in "$VENV_PREFIX"*) ;; *) echo "$lib" ;; esac; done)
  for lib in "${libs[@]}"; do
    p=$(readlink -f "$lib")
    candidates+=("$lib" "/usr$lib" "$p" "/usr$p")
  done
  # One dpkg -S for all candidates ("pkg[, pkg]: path" per path found); every library must have
  # an owner under one of its names.
  local owners; owners=$(dpkg -S "${candidates[@]}" 2>/dev/null || true)
  local found; found=$(sed 's/.*: //' <<<"$owners")
  for lib in "${libs[@]}"; do
    p=$(readlink -f "$lib")
    if ! grep -Fxq -e "$lib" -e "/usr$lib" -e "$p" -e "/usr$p" <<<"$found"; then
      echo "build_images: no Debian package holds $lib" >&2; return 1
    fi
  done
  sed 's/: .*//; s/, /\n/g' <<<"$owners" | sed 's/:[a-z0-9]*$//' | sort -u
}

# 3. A Debian 12 root file system per kind, as a tarball.
make_rootfs() {  # make_rootfs KIND BINARIES...
  local kind=$1; shift
  local dir="$WORK/rootfs-$kind" pkgs
  pkgs=$(packages_for "$@")
  [ "$kind" = worker ] && pkgs="$pkgs fortunes"
  echo "build_images: rootfs $kind ($ARCH): $(echo $pkgs)"
  mkdir -p "$WORK/debs"
  rm -rf "$dir"  # a partial root fs left by an interrupted run
  debootstrap --variant=minbase --arch="$ARCH" --cache-dir="$WORK/debs" \
    --include="$(echo $pkgs | tr ' ' ',')" bookworm "$dir" "$MIRROR" > "$WORK/debootstrap-$kind.log" 2>&1 || {
      echo "build_images: debootstrap failed; tail of $WORK/debootstrap-$kind.log:" >&2
      tail -20 "$WORK/debootstrap-$kind.log" >&2; return 1; }
  # The non-root user the manifests run as, and the directories they mount volumes on.
  echo "loom:x:10001:10001:Loom:/var/lib/loom:/usr/sbin/nologin" >> "$dir/etc/passwd"
  echo "loom:x:10001:" >> "$dir/etc/group"
  echo "loom:!:19000::::::" >> "$dir/etc/shadow"
  mkdir -p "$dir/var/lib/loom" "$dir/checkpoints"
  chown 10001:10001 "$dir/var/lib/loom" "$dir/checkpoints"
  # The wheel's library folders at the paths the binaries' rpath and the libraries' own
  # $ORIGIN-relative rpaths name (whole folders: cuDNN and NCCL load siblings at run time), and
  # the /opt/loom/site-packages link the trainer's rpath goes through.
  local vdir
  while read -r vdir; do
    [ -n "$vdir" ] || continue
    mkdir -p "$dir$vdir" && cp -a "$vdir/." "$dir$vdir/"
  done < <(venv_lib_dirs_of "$@")
  if [ -d "$dir/opt/loom" ]; then ln -sfn "$(readlink /opt/loom/site-packages)" "$dir/opt/loom/site-packages"; fi
  # No package caches or lists in the image.
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/var/log/*.log
  tar --numeric-owner -C "$dir" -cf "$WORK/rootfs-$kind.tar" .
  rm -rf "$dir"
}
need_control=()
need_worker=()
for image in "${IMAGES[@]}"; do
  for bin in $(binaries_of "$image"); do
    path=$(loom_binary_path "$bin" "$BIN_DIR")
    if [ "$(rootfs_of "$image")" = worker ]; then need_worker+=("$path"); else need_control+=("$path"); fi
  done
done
make_rootfs control "${need_control[@]}"
make_rootfs worker "${need_worker[@]}"
rm -rf "$WORK/debs"

# 4. One image per daemon: FROM scratch + the root fs tarball + the binaries (deploy/images/).
for image in "${IMAGES[@]}"; do
  ctx="$WORK/ctx/$image"
  mkdir -p "$ctx/bin"
  ln "$WORK/rootfs-$(rootfs_of "$image").tar" "$ctx/rootfs.tar"
  for bin in $(binaries_of "$image"); do
    cp -L "$(loom_binary_path "$bin" "$BIN_DIR")" "$ctx/bin/$bin"
  done
  cp "deploy/images/$image.Containerfile" "$ctx/Containerfile"
  echo "build_images: $REGISTRY/$image:$TAG"
  # A second run with --keep into the same --work_dir: replace the tag's image, do not leave the
  # old one behind as an untagged copy.
  "${BUILDAH[@]}" rmi --force "$REGISTRY/$image:$TAG" >/dev/null 2>&1 || true
  "${BUILDAH[@]}" bud --isolation chroot --arch "$ARCH" --layers=false -f "$ctx/Containerfile" \
    -t "$REGISTRY/$image:$TAG" "$ctx" > "$WORK/bud-$image.log" 2>&1 || {
      echo "build_images: buildah bud failed; tail of $WORK/bud-$image.log:" >&2
      tail -20 "$WORK/bud-$image.log" >&2; exit 1; }
  rm -rf "$ctx"
done
rm -f "$WORK/rootfs-control.tar" "$WORK/rootfs-worker.tar"
"${BUILDAH[@]}" images
if [ "$KEEP" = 1 ]; then
  echo "build_images: images kept in $WORK/storage (buildah --root $WORK/storage --runroot $WORK/run --storage-driver vfs images)"
fi
