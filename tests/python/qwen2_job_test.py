#!/opt/loom/venv/bin/python3
"""A Qwen2 job end to end: train on 2 ZeRO-3 ranks, export, independent export check.

Usage: /opt/loom/venv/bin/python3 qwen2_job_test.py --trainer PATH --consolidate PATH --check_export PATH

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
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_export_test as cet  # noqa: E402  (run_trainer, reference_tensors, export, ...)
import trainer_gang  # noqa: E402

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
    """Runs 2 loom-trainer ranks (cet.run_trainer) and returns rank 0's step losses."""
    events = cet.run_trainer(trainer, spec_path, 2, ckpt, deadline_s=deadline_s)
    return [e["loss"] for e in trainer_gang.steps_of(events)]


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
