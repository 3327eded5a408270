#!/opt/loom/venv/bin/python3
"""Python peer of //storage/checkpoint:consolidate_bench (the project venv's /opt/loom/venv/bin/python3, torch 2.11).

  consolidate_peer.py make SHAPES_JSON SAVE_DIR WORLD_SIZE STAGE MOMENTS
      Writes a DeepSpeed-layout ZeRO checkpoint (tests/python/deepspeed_ckpt.py) of the parameters
      listed in SHAPES_JSON ([{"name", "shape"}] in model order) with the benchmark's values;
      MOMENTS=1 adds Adam exp_avg / exp_avg_sq (parameter index j + 1000, j + 2000).
  consolidate_peer.py consolidate SAVE_DIR OUT.safetensors
      The timed path, as DeepSpeed's zero_to_fp32.py --safe_serialization does it: torch.load of
      every rank's files, the stage's concatenation, one safetensors file, fsynced. No checksums
      (zero_to_fp32 has none).
  consolidate_peer.py compare SHAPES_JSON LOOM.safetensors OTHER.safetensors
      Tensor-for-tensor comparison (names, dtype, shape, every byte) of OTHER with Loom's output,
      and of Loom's output with the values computed here from the formula (an independent
      reference). Prints one JSON line; exit 1 on any difference.

Values (exact in fp32, shared with consolidate_bench.cc's BenchValue): element i of parameter j
(0-based, model order) is (((i * 2654435761 + j * 40503) mod 2^24) - 2^23) * 2^-24.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import deepspeed_ckpt  # noqa: E402


def bench_values(j, numel):
    """fp32 values of parameter j, flattened (see the module docstring)."""
    i = np.arange(numel, dtype=np.uint64)
    k = (i * np.uint64(2654435761) + np.uint64(j * 40503)) & np.uint64(0xFFFFFF)
    return ((k.astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0 ** -24))


def load_shapes(path):
    with open(path) as f:
        return [(p["name"], tuple(p["shape"])) for p in json.load(f)]


def make(shapes_json, save_dir, world_size, stage, with_moments):
    tensors, moments = {}, {} if with_moments else None
    for j, (name, shape) in enumerate(load_shapes(shapes_json)):
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        tensors[name] = torch.from_numpy(bench_values(j, numel)).view(shape)
        if with_moments:
            moments[name] = tuple(torch.from_numpy(bench_values(j + 1000 * s, numel)).view(shape)
                                  for s in (1, 2))
    deepspeed_ckpt.write(save_dir, tensors, world_size, stage, moments=moments)


def read_safetensors(path):
    """{name: (dtype, shape, uint8 view of its bytes)} of a safetensors file (numpy memmap)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], tuple(v["shape"]), data[b:e])
    return out


def compare(shapes_json, loom_path, other_path):
    shapes = load_shapes(shapes_json)
    loom, other = read_safetensors(loom_path), read_safetensors(other_path)
    problems = []
    if sorted(loom) != sorted(other):
        problems.append("names differ: only in loom %s, only in other %s" % (
            sorted(set(loom) - set(other))[:5], sorted(set(other) - set(loom))[:5]))
    checked = 0
    for j, (name, shape) in enumerate(shapes):
        if name not in loom:
            problems.append("%s: missing from loom" % name)
            continue
        dtype, lshape, lbytes = loom[name]
        if dtype != "F32" or lshape != shape:
            problems.append("%s: loom has %s %s, expected F32 %s" % (name, dtype, lshape, shape))
            continue
        expected = bench_values(j, int(np.prod(shape, dtype=np.int64)) if shape else 1)
        if not np.array_equal(lbytes.view(np.float32), expected):
            problems.append("%s: loom differs from the formula" % name)
        if name in other:
            odtype, oshape, obytes = other[name]
            if (odtype, oshape) != (dtype, lshape) or not np.array_equal(obytes, lbytes):
                problems.append("%s: other differs from loom" % name)
        checked += 1
    print(json.dumps({"tensors_compared": checked, "equal": not problems,
                      "problems": problems[:10]}))
    return 0 if not problems else 1


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "make" and len(argv) == 7:
        make(argv[2], argv[3], int(argv[4]), int(argv[5]), argv[6] == "1")
        return 0
    if cmd == "consolidate" and len(argv) == 4:
        state = deepspeed_ckpt.read_fp32_state_dict(argv[2])
        deepspeed_ckpt.save_safetensors(argv[3], state)
        return 0
    if cmd == "compare" and len(argv) == 5:
        return compare(argv[2], argv[3], argv[4])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
