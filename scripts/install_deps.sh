#!/usr/bin/env bash
# Installs every Debian package Loom needs to build, run, test and benchmark.
# Idempotent: packages already present are skipped, so a second run costs one dpkg query.
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap bazel-rules-java g++ protobuf-compiler protobuf-compiler-grpc
  libgrpc++-dev libprotobuf-dev libabsl-dev libsqlite3-dev prometheus-cpp-dev
  libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev libsentencepiece-dev
  # Gloo's headers for c10d's ProcessGroupGloo.hpp (the wheel's LibTorch ships Gloo's code in
  # libtorch_cpu but not its headers; libgloo.so itself is never linked: docs/building.md)
  libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # ZeRO-Infinity NVMe offload: asynchronous file I/O through io_uring
  liburing-dev
  # checkpoint CRC-32s at PCLMULQDQ speed (ISA-L crc32_gzip_refl = zlib crc32)
  libisal-dev
  # the zip directory of DeepSpeed's torch.save checkpoints (loomctl consolidate --from-deepspeed)
  libminizip-dev
  # bearer-token hashing (libcrypto) and the TLS tests' self-signed certificates (openssl CLI)
  libssl-dev openssl
  # runtime tools and data
  sentencepiece fortunes fortunes-min
  # peak RSS of a child process (GNU time %M) in the DeepSpeed consolidation test and benchmark
  time
  # one long continuous English text for the long-sequence (ALST) example (bible-kjv-text is
  # compressed; the bible reader prints it: examples/bible-alst/make_corpus.sh)
  bible-kjv bible-kjv-text
  # the project's Python virtual environment (PyTorch 2.11 and the Python checks, below)
  python3-venv
  # logging facade used by the daemons
  libgoogle-glog-dev
  # gperftools' tcmalloc for the scheduler daemon (per-thread caches: its gRPC and protobuf
  # allocations cost ~16% of durable submission throughput under glibc malloc)
  libgoogle-perftools-dev
  # observability and deployment tests: a real Prometheus (+ promtool), kustomize, YAML in Python
  prometheus kubectl python3-yaml sqlite3
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# LibTorch and the Python side: PyPI's torch (CUDA 13.0 build) and every pinned Python package
# of scripts/python-requirements.txt, in one project-owned virtual environment at a fixed prefix
# (so every clone and CI share it, and Bazel's WORKSPACE can name it). A stamp holding the
# requirements file's hash makes the second run a no-op. About 3 GB to download, 4.7 GB on disk.
VENV=/opt/loom/venv
REQS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python-requirements.txt"
# DeepSpeed is a source distribution whose setup.py imports torch: installed in a second pass,
# once torch is in the venv, without pip's build isolation (which would fetch a second torch)
# and without compiling its C++/CUDA ops (DS_BUILD_OPS=0: Loom's tests use its Python parts).
DS_REQS="$(dirname "$REQS")/python-requirements-deepspeed.txt"
stamp="$VENV/.loom-requirements.sha256"
want=$(cat "$REQS" "$DS_REQS" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  $SUDO mkdir -p /opt/loom
  if [ ! -x "$VENV/bin/python3" ]; then
    $SUDO /usr/bin/python3 -m venv "$VENV"
  fi
  echo "install_deps: installing the pinned Python packages into $VENV (first time: ~3 GB, a few minutes)"
  if ! $SUDO "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS" ||
     ! $SUDO env DS_BUILD_OPS=0 "$VENV/bin/pip" install --quiet --disable-pip-version-check \
       --no-build-isolation -r "$DS_REQS"; then
    echo "install_deps: pip could not install $REQS and $DS_REQS into $VENV: is PyPI reachable" \
      "from here? (pip's own error is above)" >&2
    exit 1
  fi
  echo "$want" | $SUDO tee "$stamp" >/dev/null
fi
# Stable paths for Bazel (third_party/libtorch.BUILD) whatever the venv's Python version is.
site=$("$VENV/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ "$(readlink /opt/loom/site-packages 2>/dev/null)" != "$site" ]; then
  $SUDO ln -sfn "$site" /opt/loom/site-packages
fi
echo "install_deps: done"
