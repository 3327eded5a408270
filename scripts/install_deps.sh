#!/usr/bin/env bash
# Installs every Debian package Loom needs to build, run, test and benchmark.
# Idempotent: packages already present are skipped, so a second run costs one dpkg query.
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap bazel-rules-java g++ protobuf-compiler protobuf-compiler-grpc
  libgrpc++-dev libprotobuf-dev libabsl-dev libsqlite3-dev prometheus-cpp-dev
  libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev libsentencepiece-dev
  libtorch-dev libgloo-dev
  # Debian's LibTorch uses the system BLAS; OpenBLAS is ~15x faster than the reference one
  libopenblas0-pthread libgtest-dev libgmock-dev libbenchmark-dev
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
  # tests: reference PyTorch for the independent export check
  python3-torch python3-numpy
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

# The OpenAPI validator of //services/gateway:openapi_lint_test: Redocly's CLI from the npm
# registry, pinned (1.x runs on Debian 12's nodejs 18.19), in a fixed prefix the test looks in.
REDOCLY_VERSION=1.34.5
REDOCLY_PREFIX=/opt/loom/redocly
if [ "$("$REDOCLY_PREFIX/node_modules/.bin/redocly" --version 2>/dev/null)" != "$REDOCLY_VERSION" ]; then
  if ! command -v npm >/dev/null; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  echo "install_deps: installing @redocly/cli@$REDOCLY_VERSION into $REDOCLY_PREFIX"
  $SUDO mkdir -p "$REDOCLY_PREFIX"
  $SUDO npm install --prefix "$REDOCLY_PREFIX" --no-audit --no-fund --loglevel=error \
    "@redocly/cli@$REDOCLY_VERSION"
fi
echo "install_deps: done"
