#!/usr/bin/python3
"""A Qwen2 job end to end: train on 2 ZeRO-3 ranks, export, independent export check.

Usage: /usr/bin/python3 qwen2_job_test.py --trainer PATH --consolidate PATH --check_export PATH

Trains a tiny grouped-query Qwen2 (model_type "qwen2": Llama plus q/k/v projection biases,
tied embeddings as most Qwen2 checkpoints have) with loom-trainer on 2 ZeRO-3 ranks, exports the
newest checkpoint with loom-consolidate as F32 and BF16, and asserts that:
  * the training loss fell (last step below the first);
  * config.json says architectures ["Qwen2ForCausalLM"], model_type "qwen2",
    use_sliding_window false, and the export holds self_attn.{q,k,v}_proj.bias for every layer
    (no o_proj bias, no lm_head: tied), each tensor equal to a numpy reconstruction of the rank
    shards (bit for bit in F32);
  * check_export.py (plain-torch Qwen2 forward, float64) accepts the export against the
    trainer's final logits;
  * controls: the same export with the biases zeroed fails the logits check (exit 1: the biases
    are trained, non-zero and used on both sides), and with config.json's model_type set to
    llama it is malformed (exit 2: bias tensors a Llama does not have).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_export_test as cet  # noqa: E402  (run_trainer, reference_tensors, export, ...)

STEPS = 8
SPEC = {
    "model": {"config": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                         "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
                         "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "max_position_embeddings": 64,
                         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                         "tie_word_embeddings": True, "use_sliding_window": False,
                         "initializer_range": 0.2}},
    "dataset": {"name": "fortunes"},
    "deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                         "zero_optimization": {"stage": 3}},
    "training": {"steps": STEPS, "sequence_length": 32, "seed": 5, "eval_batches": 1},
}


def run_trainer_with_losses(trainer, spec_path, ckpt, deadline_s=240):
    """Runs 2 loom-trainer ranks (as cet.run_trainer does) and returns rank 0's step losses
    (its stdout: one loom.TrainerEvent JSON object per line, read by a thread)."""
    base = [trainer, f"--spec={spec_path}", "--world_size=2", f"--checkpoint_dir={ckpt}",
            "--collective_timeout_s=60"]
    rank0 = subprocess.Popen(base + ["--rank=0", "--master_port=0"], stdout=subprocess.PIPE,
                             text=True)
    events, port_known = [], threading.Event()

    def read():
        for line in rank0.stdout:
            events.append(json.loads(line))
            if "rendezvous" in events[-1]:
                port_known.set()
        port_known.set()  # EOF: rank 0 exited (before its rendezvous if no port was seen)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    procs = [rank0]
    try:
        assert port_known.wait(timeout=deadline_s), "no rendezvous event before the deadline"
        ports = [e["rendezvous"]["port"] for e in events if "rendezvous" in e]
        assert ports, f"rank 0 exited {rank0.wait()} before its rendezvous event"
        procs.append(subprocess.Popen(base + ["--rank=1", f"--master_port={ports[0]}"],
                                      stdout=subprocess.DEVNULL))
        end = time.time() + deadline_s
        for p in procs:
            p.wait(timeout=max(1, end - time.time()))
            assert p.returncode == 0, f"trainer exited {p.returncode}"
        reader.join(timeout=max(1, end - time.time()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [e["step"]["loss"] for e in events if "step" in e]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--consolidate", required=True)
    ap.add_argument("--check_export", required=True)
    args = ap.parse_args()
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    checker = cet.Checker(args.check_export)
    cfg_model = SPEC["model"]["config"]
    layers = cfg_model["num_hidden_layers"]
    failures = []

    def expect(what, got, want, output):
        print(f"  {what}: exit {got} (want {want}): {output}")
        if got != want:
            failures.append(f"{what}: exit {got}, want {want}: {output}")

    spec_path = os.path.join(tmp, "qwen2.json")
    with open(spec_path, "w") as f:
        json.dump(SPEC, f)
    ckpt = os.path.join(tmp, "ckpt_qwen2")
    losses = run_trainer_with_losses(args.trainer, spec_path, ckpt)
    print(f"step losses: {[round(x, 4) for x in losses]}")
    assert len(losses) == STEPS, f"{len(losses)} step events, want {STEPS}"
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    logits = os.path.join(ckpt, "final_logits.json")
    ref = {k: torch.from_numpy(v.copy()) for k, v in
           cet.reference_tensors(os.path.join(ckpt, f"step_{STEPS:08d}")).items()}
    biases = [f"model.layers.{i}.self_attn.{n}_proj.bias" for i in range(layers) for n in "qkv"]
    assert all(b in ref for b in biases), f"bias tensors missing from the shards: {sorted(ref)}"
    assert "lm_head.weight" not in ref and not any("o_proj.bias" in k for k in ref), sorted(ref)

    for dtype in ("fp32", "bf16"):
        print(f"qwen2/{dtype}:")
        out_dir = os.path.join(tmp, f"export_qwen2_{dtype}")
        result = cet.export(args.consolidate, ckpt, out_dir, dtype)
        assert result["step"] == STEPS, result
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg = json.load(f)
        assert cfg["architectures"] == ["Qwen2ForCausalLM"], cfg
        assert cfg["model_type"] == "qwen2", cfg
        assert cfg["use_sliding_window"] is False, cfg
        assert cfg["tie_word_embeddings"] is True, cfg
        assert cfg["rope_theta"] == cfg_model["rope_theta"], cfg
        exported = checker.mod.read_model_tensors(out_dir)
        assert set(exported) == set(ref), sorted(set(exported) ^ set(ref))
        for k, v in exported.items():
            want = ref[k] if dtype == "fp32" else ref[k].to(torch.bfloat16)
            bits = torch.int32 if dtype == "fp32" else torch.int16
            assert v.dtype == want.dtype and v.shape == want.shape, k
            assert torch.equal(v.view(bits), want.view(bits)), f"{dtype}: {k} differs"

        atol = cet.ATOL[dtype]
        code, output = checker.run(out_dir, logits, atol)
        expect("the real export", code, 0, output)

        bad = dict(exported)
        for b in biases:
            bad[b] = torch.zeros_like(exported[b])
        bad_dir = os.path.join(tmp, f"zero_bias_{dtype}")
        cet.write_export(bad_dir, bad, cfg)
        code, output = checker.run(bad_dir, logits, atol)
        expect("biases zeroed", code, 1, output)

        llama_cfg = dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"])
        bad_dir = os.path.join(tmp, f"as_llama_{dtype}")
        cet.write_export(bad_dir, exported, llama_cfg)
        code, output = checker.run(bad_dir, logits, atol)
        expect("config.json says llama", code, 2, output)

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
