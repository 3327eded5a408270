#!/usr/bin/env bash
# loom-trainer links the CUDA build of LibTorch with NCCL, and what it reports of it matches what
# PyTorch itself reports (the project venv's torch, /opt/loom/venv: the same wheel, asked through
# its Python API, no code shared with worker/engine/device.cc).
set -euo pipefail
trainer=worker/trainer/loom-trainer

# 1. The link: libtorch_cuda is a direct dependency (kept by --no-as-needed) and it brings NCCL.
needed=$(readelf -d "$trainer" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
for lib in libtorch_cuda.so libc10_cuda.so libtorch_cpu.so; do
  if ! grep -qx "$lib" <<<"$needed"; then
    echo "FAIL: $trainer does not link $lib (NEEDED: $(echo $needed))"; exit 1
  fi
done
# ldd's output to a file first: with pipefail, `ldd | grep -q` fails whenever grep's early exit
# gives ldd a SIGPIPE (it did in CI although libnccl.so.2 was listed).
ldd "$trainer" >"$TEST_TMPDIR/ldd.txt"
if ! grep -q 'libnccl.so' "$TEST_TMPDIR/ldd.txt"; then
  echo "FAIL: $trainer does not load NCCL:"; cat "$TEST_TMPDIR/ldd.txt"; exit 1
fi

# 2. What the trainer reports equals what PyTorch reports.
got=$("$trainer" --print_libtorch)
want=$(/opt/loom/venv/bin/python3 - <<'PY'
import torch
nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
cudnn = torch.backends.cudnn.version()
print(f"LibTorch {torch.__version__.split('+')[0]}, CUDA runtime {torch.version.cuda}, "
      f"cuDNN {cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}, NCCL {nccl}, "
      f"CUDA devices: {torch.cuda.device_count()}")
PY
)
if [ "$got" != "$want" ]; then
  printf 'FAIL: loom-trainer --print_libtorch:\n  got:  %s\n  want: %s (PyTorch)\n' "$got" "$want"
  exit 1
fi
echo "ok: $got"
echo "trainer_libtorch_test: PASS"
