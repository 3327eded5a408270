#!/opt/loom/venv/bin/python3
"""Model families and RoPE scaling end to end, transformers as the judge.

Usage: hf_families_job_test.py --trainer PATH --consolidate PATH --hf_load_export PATH

For each case below, loom-trainer trains a tiny model a few steps on CPU ranks, loom-consolidate
exports it (F32), and hf_load_export.py (transformers' AutoModelForCausalLM.from_pretrained, its
own config parsing and forward) must reproduce the trainer's final logits within ATOL:
  * qwen3: Qwen3ForCausalLM on 2 ZeRO-3 ranks, transformers-5 layout (rope_parameters,
    layer_types, dtype), head_dim 32 != hidden_size / heads = 16, q_norm/k_norm trained;
  * llama_yarn: YaRN (attention_factor 1.139 scales cos/sin) in the transformers-4 layout;
  * llama_llama3: Llama 3.1's llama3 scaling (low/high-frequency smoothing), 1 rank;
  * llama_longrope: LongRoPE with the sequence past original_max_position_embeddings (long
    factors, attention factor);
  * mistral: MistralForCausalLM with sliding_window 4096 >= the sequence (full attention);
  * llama_linear, llama_dynamic: the other two scaling types (dynamic equals default within
    max_position_embeddings, as in transformers);
  * smollm2: SmolLM2's config keys (is_llama_config, rope_interleaved false), transformers-5
    layout with base 100000, tied embeddings.
Controls (the check can fail): the Qwen3 export with q_norm/k_norm reset to ones mismatches
(exit 1); with config.json's model_type qwen2, transformers refuses the q/k norm tensors (exit 2);
each scaled-RoPE export with its rope_scaling dropped (dynamic aside) and the SmolLM2 export with
rope_theta 10000 mismatch (exit 1).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_export_test as cet  # noqa: E402  (run_trainer, export, write_export)
import trainer_gang  # noqa: E402

STEPS = 4
# fp32 on both sides, reduction order differs. Measured 3.1e-6 .. 5.2e-6 (see the printout).
ATOL = 2e-5
BASE = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "initializer_range": 0.2}
CASES = {
    "qwen3": (2, dict(BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                      head_dim=32, tie_word_embeddings=True, attention_bias=False,
                      use_sliding_window=False, sliding_window=None, max_window_layers=2,
                      layer_types=["full_attention", "full_attention"], dtype="bfloat16",
                      rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"})),
    "llama_yarn": (1, dict(BASE, model_type="llama", rope_theta=10000.0,
                           rope_scaling={"type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 16})),
    "llama_llama3": (1, dict(BASE, model_type="llama", rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16})),
    "llama_longrope": (1, dict(BASE, model_type="llama", rope_theta=10000.0,
                               rope_scaling={"rope_type": "longrope",
                                             "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                                                              1.6, 1.7],
                                             "long_factor": [1.0, 2.0, 3.0, 5.0, 8.0, 13.0,
                                                             21.0, 34.0],
                                             "original_max_position_embeddings": 8})),
    "mistral": (1, dict(BASE, model_type="mistral", architectures=["MistralForCausalLM"],
                        sliding_window=4096, rope_theta=1000000.0)),
    "llama_linear": (1, dict(BASE, model_type="llama", rope_theta=10000.0, pad_token_id=3,
                             rope_scaling={"rope_type": "linear", "factor": 4.0})),
    # Dynamic NTK only grows the base past max_position_embeddings (64 > sequence 32): here it
    # must equal default, so it has no rope_scaling-dropped control.
    "llama_dynamic": (1, dict(BASE, model_type="llama", rope_theta=10000.0,
                              rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    # SmolLM2 as nanotron's converter writes it, saved again by transformers 5: a Llama, tied,
    # base 100000 in rope_parameters only.
    "smollm2": (1, dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"],
                        tie_word_embeddings=True, is_llama_config=True, rope_interleaved=False,
                        dtype="bfloat16",
                        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})),
}
NO_DROP_CONTROL = {"llama_dynamic"}


def spec_for(config):
    return {"model": {"config": config}, "dataset": {"name": "fortunes"},
            "deepspeed_config": {"train_micro_batch_size_per_gpu": 2,
                                 "gradient_accumulation_steps": 1,
                                 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                 "zero_optimization": {"stage": 3}},
            "training": {"steps": STEPS, "sequence_length": 32, "seed": 5, "eval_batches": 1}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--consolidate", required=True)
    ap.add_argument("--hf_load_export", required=True)
    args = ap.parse_args()
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    failures = []

    def judge(what, model_dir, logits, want):
        r = subprocess.run([sys.executable, args.hf_load_export, "--model_dir", model_dir,
                            "--logits", logits, "--atol", str(ATOL)],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1"))
        lines = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("hf_load_export:")]
        output = lines[-1] if lines else r.stderr.strip()[-400:]
        print(f"  {what}: exit {r.returncode} (want {want}): {output}")
        if r.returncode != want:
            failures.append(f"{what}: exit {r.returncode}, want {want}: {output}")

    for name, (world, config) in CASES.items():
        print(f"{name}:")
        spec_path = os.path.join(tmp, f"{name}.json")
        with open(spec_path, "w") as f:
            json.dump(spec_for(config), f)
        ckpt = os.path.join(tmp, f"ckpt_{name}")
        events = cet.run_trainer(args.trainer, spec_path, world, ckpt, deadline_s=240)
        losses = [e["loss"] for e in trainer_gang.steps_of(events)]
        print(f"  step losses: {[round(x, 4) for x in losses]}")
        assert len(losses) == STEPS, f"{name}: {len(losses)} step events, want {STEPS}"
        logits = os.path.join(ckpt, "final_logits.json")
        out_dir = os.path.join(tmp, f"export_{name}")
        cet.export(args.consolidate, ckpt, out_dir, "fp32")
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg = json.load(f)
        judge(f"{name}: transformers loads the export", out_dir, logits, 0)
        if name == "qwen3":
            assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["head_dim"] == 32, cfg
            exported = load_file(os.path.join(out_dir, "model.safetensors"))
            norms = [k for k in exported if k.endswith(("q_norm.weight", "k_norm.weight"))]
            assert len(norms) == 4, sorted(exported)
            reset = dict(exported, **{k: torch.ones_like(exported[k]) for k in norms})
            bad_dir = os.path.join(tmp, "qwen3_norms_reset")
            cet.write_export(bad_dir, reset, cfg)
            judge("qwen3 with q_norm/k_norm reset to ones", bad_dir, logits, 1)
            bad_dir = os.path.join(tmp, "qwen3_as_qwen2")
            cet.write_export(bad_dir, exported, dict(cfg, model_type="qwen2",
                                                     architectures=["Qwen2ForCausalLM"]))
            judge("qwen3 export said to be qwen2", bad_dir, logits, 2)
        elif name == "smollm2":
            # The defect this guards: the base read from rope_parameters, not the default 10000.
            assert cfg["rope_theta"] == 100000.0 and cfg["tie_word_embeddings"], cfg
            exported = load_file(os.path.join(out_dir, "model.safetensors"))
            bad_dir = os.path.join(tmp, "smollm2_base_10000")
            cet.write_export(bad_dir, exported, dict(cfg, rope_theta=10000.0))
            judge("smollm2 export with rope_theta 10000", bad_dir, logits, 1)
        elif "rope_scaling" in config and name not in NO_DROP_CONTROL:
            assert cfg["rope_scaling"]["rope_type"] == config["rope_scaling"].get(
                "rope_type", config["rope_scaling"].get("type")), cfg
            exported = load_file(os.path.join(out_dir, "model.safetensors"))
            bad_dir = os.path.join(tmp, f"{name}_unscaled")
            cet.write_export(bad_dir, exported, dict(cfg, rope_scaling=None))
            judge(f"{name} with rope_scaling dropped", bad_dir, logits, 1)

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
