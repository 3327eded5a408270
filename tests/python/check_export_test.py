#!/usr/bin/python3
"""Test of check_export.py on real trainer output.

Usage: /usr/bin/python3 check_export_test.py --trainer PATH --check_export PATH

Trains a tiny Llama with loom-trainer (2 ZeRO-3 ranks with an untied head; 1 rank with tied
embeddings), builds model.safetensors + config.json from the rank shards with a minimal
converter below (a test fixture: the real consolidation is storage/checkpoint's), and asserts
that check_export.py accepts it, and rejects a perturbed tensor and a missing tensor.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

SPEC = {
    "model": {"config": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
                         "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "max_position_embeddings": 64,
                         "rope_theta": 500.0}},
    "dataset": {"name": "fortunes"},
    "deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                         "zero_optimization": {"stage": 3}},
    "training": {"steps": 4, "sequence_length": 32, "seed": 3, "eval_batches": 1},
}


def run_trainer(trainer, spec_path, world, ckpt, deadline_s=120):
    base = [trainer, f"--spec={spec_path}", f"--world_size={world}", f"--checkpoint_dir={ckpt}",
            "--collective_timeout_s=60"]
    procs = [subprocess.Popen(base + ["--rank=0", "--master_port=0"], stdout=subprocess.PIPE,
                              text=True)]
    if world > 1:
        line = procs[0].stdout.readline()
        port = json.loads(line)["port"]
        for r in range(1, world):
            procs.append(subprocess.Popen(base + [f"--rank={r}", f"--master_port={port}"],
                                          stdout=subprocess.DEVNULL))
    end = time.time() + deadline_s
    for p in procs:
        try:
            p.wait(timeout=max(1, end - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("trainer did not finish before the deadline")
        assert p.returncode == 0, f"trainer exited {p.returncode}"
    procs[0].stdout.close()


def consolidate(step_dir, out_dir):
    """Minimal shard -> safetensors converter (test fixture)."""
    manifests = []
    r = 0
    while os.path.exists(os.path.join(step_dir, f"rank_{r}.manifest.json")):
        with open(os.path.join(step_dir, f"rank_{r}.manifest.json")) as f:
            manifests.append(json.load(f))
        r += 1
    assert manifests and manifests[0]["world_size"] == len(manifests)
    shards = [np.fromfile(os.path.join(step_dir, m["shard_file"]), dtype="<f4") for m in manifests]
    tensors = {}
    for i, p in enumerate(manifests[0]["params"]):
        parts = []
        for m, data in zip(manifests, shards):
            q = m["params"][i]
            parts.append(data[q["partition_offset"]:q["partition_offset"] + q["partition_numel"]])
        tensors[p["name"]] = np.concatenate(parts)[:p["numel"]].reshape(p["shape"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(manifests[0]["model_config"], f)
    return tensors


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check(check_export, model_dir, logits):
    r = subprocess.run([sys.executable, check_export, "--model_dir", model_dir,
                        "--logits", logits, "--atol", "1e-4"], capture_output=True, text=True)
    print(r.stdout.strip(), r.stderr.strip())
    return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--check_export", required=True)
    args = ap.parse_args()
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    for name, world, tied in (("untied2", 2, False), ("tied1", 1, True)):
        spec = json.loads(json.dumps(SPEC))
        spec["model"]["config"]["tie_word_embeddings"] = tied
        spec_path = os.path.join(tmp, f"{name}.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        ckpt = os.path.join(tmp, f"ckpt_{name}")
        run_trainer(args.trainer, spec_path, world, ckpt)
        tensors = consolidate(os.path.join(ckpt, "step_00000004"), os.path.join(tmp, name))
        assert ("lm_head.weight" in tensors) == (not tied)
        model_dir = os.path.join(tmp, name)
        logits = os.path.join(ckpt, "final_logits.json")
        write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors)
        assert check(args.check_export, model_dir, logits) == 0, f"{name}: export rejected"

        bad = dict(tensors)
        bad["model.norm.weight"] = tensors["model.norm.weight"] * 1.01
        write_safetensors(os.path.join(model_dir, "model.safetensors"), bad)
        assert check(args.check_export, model_dir, logits) == 1, f"{name}: perturbation missed"

        bad = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
        write_safetensors(os.path.join(model_dir, "model.safetensors"), bad)
        assert check(args.check_export, model_dir, logits) == 2, f"{name}: missing tensor missed"
    print("check_export_test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
