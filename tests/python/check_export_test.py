#!/opt/loom/venv/bin/python3
"""Test of check_export.py on exports made by Loom's real exporter from real trainer output.

Usage: /opt/loom/venv/bin/python3 check_export_test.py --trainer PATH --consolidate PATH --check_export PATH
           --hf_load_export PATH

Trains a tiny grouped-query Llama with loom-trainer (2 ZeRO-3 ranks with an untied head; 1 rank
with tied embeddings), exports each checkpoint with loom-consolidate (storage/checkpoint's
consolidation, the code behind loom-checkpoint's Consolidate RPC) as F32 and as BF16, and
asserts that:
  * every exported tensor equals an independent numpy reconstruction of the rank shards
    (bit for bit in F32; in BF16, PyTorch's round-to-nearest-even of that reconstruction);
  * check_export.py accepts each export against the trainer's final logits, and so does
    hf_load_export.py: transformers' AutoModelForCausalLM.from_pretrained loads it with no
    missing, unexpected or mismatched tensor, and its logits match (F32 and BF16, tied and untied);
  * it rejects (exit 1, logits mismatch) exports a buggy exporter could write: interleaved
    instead of half-split rotary layout in q_proj/k_proj, query heads mapped to key/value heads
    as h % Hkv instead of h // (Hq / Hkv), a wrong rms_norm_eps in config.json (F32 only: in
    BF16 its effect is below the weights' rounding, and the BF16 config.json must equal the
    F32 one), a perturbed tensor;
  * it rejects (exit 2, malformed) a missing tensor and a config.json whose
    tie_word_embeddings contradicts the tensors (so the flag is read from config.json);
  * it reads a sharded export (--max_shard_size) through model.safetensors.index.json.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_gang  # noqa: E402

SPEC = {
    "model": {"config": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
                         "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "max_position_embeddings": 64,
                         "rope_theta": 500.0, "rms_norm_eps": 1e-5,
                         # Larger than the 0.02 default so that attention is far from uniform
                         # and the rotary / head-mapping controls move the logits well past
                         # the tolerances (margins are printed).
                         "initializer_range": 0.2}},
    "dataset": {"name": "fortunes"},
    "deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                         "zero_optimization": {"stage": 3}},
    "training": {"steps": 4, "sequence_length": 32, "seed": 3, "eval_batches": 1},
}
WRONG_EPS = 1e-6  # the trainer used 1e-5 (SPEC); 1e-6 is LlamaConfig's default

# max |python - C++| allowed. F32: the export is the fp32 master weights, so only float64 vs
# fp32 arithmetic differs (measured 3.0e-6 untied, 5.8e-6 tied). BF16: every weight is rounded
# to 8 significant bits while the C++ logits come from the fp32 weights (measured 8.4e-2
# untied, 7.7e-2 tied; logits of this model are O(1-10)). The controls move the logits by
# 0.29 (norm x 1.05) to 4-8 (rotary layout, head mapping), in both dtypes.
ATOL = {"fp32": 1e-4, "bf16": 0.15}


def run_trainer(trainer, spec_path, world, ckpt, deadline_s=180):
    """`world` loom-trainer ranks to the end (trainer_gang.run_gang); rank 0's events."""
    return trainer_gang.run_gang(trainer, spec_path, world, ckpt=ckpt, collective_timeout_s=60,
                                 deadline_s=deadline_s)[1]


def reference_tensors(step_dir):
    """Independent shard -> tensor reconstruction (numpy; docs/design/TECHNIQUES.md §5.2)."""
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
    return tensors


def export(consolidate, ckpt, out_dir, dtype, extra=()):
    """Runs loom-consolidate (newest committed step) into out_dir."""
    r = subprocess.run([consolidate, f"--checkpoint_dir={ckpt}", f"--output_dir={out_dir}",
                        f"--dtype={dtype}", *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"loom-consolidate exited {r.returncode}: {r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


_ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16"}


def write_export(model_dir, tensors, cfg):
    """A model directory (config.json + model.safetensors) holding `tensors` as they are."""
    os.makedirs(model_dir, exist_ok=True)
    for name in os.listdir(model_dir):
        os.remove(os.path.join(model_dir, name))
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        b = raw.numpy().astype(raw.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(model_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def interleave_rope_rows(w, n_heads):
    """q/k_proj rows of each head from half-split order (i, i + d/2) to interleaved (2i, 2i+1):
    the layout of an exporter that skipped (or doubled) HF's rotary permutation."""
    out_dim, in_dim = w.shape
    d = out_dim // n_heads
    return w.reshape(n_heads, 2, d // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def modulo_gqa(q, o, n_heads, n_kv):
    """Reorders query heads (q_proj rows, o_proj columns) so that query head h reads key/value
    head h % n_kv instead of h // (n_heads / n_kv): the repeat-vs-repeat_interleave bug."""
    group = n_heads // n_kv
    d = q.shape[0] // n_heads
    hidden = o.shape[0]
    qh, oh = q.reshape(n_heads, d, -1), o.reshape(hidden, n_heads, d)
    new_q, new_o = torch.empty_like(qh), torch.empty_like(oh)
    for h in range(n_heads):
        pos = (h % n_kv) * group + h // n_kv  # position p reads key/value head p // group
        new_q[pos] = qh[h]
        new_o[:, pos] = oh[:, h]
    return new_q.reshape(q.shape), new_o.reshape(o.shape)


class Checker:
    def __init__(self, path):
        spec = importlib.util.spec_from_file_location("check_export", path)
        self.mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.mod)
        self.path = path

    def run(self, model_dir, logits, atol):
        """check_export's exit status and output (in-process; main() is the CLI)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = self.mod.main(["--model_dir", model_dir, "--logits", logits,
                                  "--atol", str(atol)])
        return code, (out.getvalue() + err.getvalue()).strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--consolidate", required=True)
    ap.add_argument("--check_export", required=True)
    ap.add_argument("--hf_load_export", required=True,
                    help="hf_load_export.py: transformers' own loader and model as the judge")
    args = ap.parse_args()
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    checker = Checker(args.check_export)
    cfg_model = SPEC["model"]["config"]
    n_heads, n_kv = cfg_model["num_attention_heads"], cfg_model["num_key_value_heads"]
    failures = []

    def expect(what, got, want, output):
        print(f"  {what}: exit {got} (want {want}): {output}")
        if got != want:
            failures.append(f"{what}: exit {got}, want {want}: {output}")

    for name, world, tied in (("untied2", 2, False), ("tied1", 1, True)):
        spec = json.loads(json.dumps(SPEC))
        spec["model"]["config"]["tie_word_embeddings"] = tied
        spec_path = os.path.join(tmp, f"{name}.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        ckpt = os.path.join(tmp, f"ckpt_{name}")
        run_trainer(args.trainer, spec_path, world, ckpt)
        logits = os.path.join(ckpt, "final_logits.json")
        ref = {k: torch.from_numpy(v.copy()) for k, v in
               reference_tensors(os.path.join(ckpt, "step_00000004")).items()}
        assert ("lm_head.weight" in ref) == (not tied), f"{name}: shards and tie flag disagree"

        for dtype in ("fp32", "bf16"):
            case = f"{name}/{dtype}"
            print(f"{case}:")
            out_dir = os.path.join(tmp, f"export_{name}_{dtype}")
            result = export(args.consolidate, ckpt, out_dir, dtype)
            assert result["step"] == 4, result
            with open(os.path.join(out_dir, "config.json")) as f:
                cfg = json.load(f)
            assert cfg["tie_word_embeddings"] is tied, f"{case}: config.json {cfg}"
            assert cfg["rms_norm_eps"] == cfg_model["rms_norm_eps"], f"{case}: config.json {cfg}"
            exported = checker.mod.read_model_tensors(out_dir)
            assert set(exported) == set(ref), f"{case}: {sorted(set(exported) ^ set(ref))}"
            for k, v in exported.items():
                want = ref[k] if dtype == "fp32" else ref[k].to(torch.bfloat16)
                assert v.dtype == want.dtype and v.shape == want.shape, f"{case}: {k}"
                bits = torch.int32 if dtype == "fp32" else torch.int16
                assert torch.equal(v.view(bits), want.view(bits)), f"{case}: {k} differs"

            atol = ATOL[dtype]
            code, output = checker.run(out_dir, logits, atol)
            expect("the real export", code, 0, output)
            def hf_judge(model_dir):
                r = subprocess.run([sys.executable, args.hf_load_export, "--model_dir", model_dir,
                                    "--logits", logits, "--atol", str(atol)],
                                   capture_output=True, text=True, timeout=300,
                                   env=dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1"))
                lines = [l for l in (r.stdout + r.stderr).splitlines()
                         if l.startswith("hf_load_export:")]
                return r.returncode, (lines[-1] if lines else r.stderr.strip()[-400:])

            code, output = hf_judge(out_dir)
            expect("transformers loads the real export", code, 0, output)

            bad_dir = os.path.join(tmp, f"bad_{name}_{dtype}")
            bad = dict(exported)
            for i in range(cfg_model["num_hidden_layers"]):
                p = f"model.layers.{i}.self_attn."
                bad[p + "q_proj.weight"] = interleave_rope_rows(exported[p + "q_proj.weight"],
                                                                n_heads)
                bad[p + "k_proj.weight"] = interleave_rope_rows(exported[p + "k_proj.weight"], n_kv)
            write_export(bad_dir, bad, cfg)
            code, output = checker.run(bad_dir, logits, atol)
            expect("interleaved rotary layout", code, 1, output)

            bad = dict(exported)
            for i in range(cfg_model["num_hidden_layers"]):
                p = f"model.layers.{i}.self_attn."
                bad[p + "q_proj.weight"], bad[p + "o_proj.weight"] = modulo_gqa(
                    exported[p + "q_proj.weight"], exported[p + "o_proj.weight"], n_heads, n_kv)
            write_export(bad_dir, bad, cfg)
            code, output = checker.run(bad_dir, logits, atol)
            expect("query head h reads kv head h % Hkv", code, 1, output)

            if dtype == "fp32":
                write_export(bad_dir, exported, dict(cfg, rms_norm_eps=WRONG_EPS))
                code, output = checker.run(bad_dir, logits, atol)
                expect(f"rms_norm_eps {WRONG_EPS:g} in config.json", code, 1, output)
                fp32_cfg = cfg
            else:
                # The eps error moves these logits by ~1e-3 (F32 run above), far below the
                # bf16 rounding of the weights, so a logits check cannot see it in a BF16
                # export; its config.json must be the F32 export's, which was checked, but for
                # the dtype it names: each export's config.json says the dtype it holds.
                dtype_keys = ("torch_dtype", "dtype")
                assert cfg.get("torch_dtype") == "bfloat16", f"{case}: {cfg.get('torch_dtype')!r}"
                assert fp32_cfg.get("torch_dtype") == "float32", f"{fp32_cfg.get('torch_dtype')!r}"
                same = lambda c: {k: v for k, v in c.items() if k not in dtype_keys}
                assert same(cfg) == same(fp32_cfg), f"{case}: config.json differs from F32's"

            bad = dict(exported)
            bad["model.norm.weight"] = (exported["model.norm.weight"].float() * 1.05).to(
                exported["model.norm.weight"].dtype)
            write_export(bad_dir, bad, cfg)
            code, output = checker.run(bad_dir, logits, atol)
            expect("model.norm.weight x 1.05", code, 1, output)
            code, output = hf_judge(bad_dir)
            expect("transformers: model.norm.weight x 1.05", code, 1, output)

            bad = {k: v for k, v in exported.items() if k != "model.layers.1.mlp.up_proj.weight"}
            write_export(bad_dir, bad, cfg)
            code, output = checker.run(bad_dir, logits, atol)
            expect("missing tensor", code, 2, output)
            code, output = hf_judge(bad_dir)
            expect("transformers: missing tensor", code, 2, output)

            # The head's tying comes from config.json: flipping the flag makes the same tensors
            # malformed; an untied config.json without the key (LlamaConfig's default false)
            # stays valid, a tied one does not.
            write_export(bad_dir, exported, dict(cfg, tie_word_embeddings=not tied))
            code, output = checker.run(bad_dir, logits, atol)
            expect(f"tie_word_embeddings {str(not tied).lower()} in config.json", code, 2,
                   output)
            write_export(bad_dir, exported,
                         {k: v for k, v in cfg.items() if k != "tie_word_embeddings"})
            code, output = checker.run(bad_dir, logits, atol)
            expect("tie_word_embeddings absent from config.json", code, 2 if tied else 0,
                   output)

    # A sharded export (model-0000k-of-0000n.safetensors + index) is read through its index.
    sharded = os.path.join(tmp, "export_untied2_sharded")
    result = export(args.consolidate, os.path.join(tmp, "ckpt_untied2"), sharded, "fp32",
                    ["--max_shard_size=100KB"])
    code, output = checker.run(sharded, os.path.join(tmp, "ckpt_untied2", "final_logits.json"),
                               ATOL["fp32"])
    expect(f"sharded export ({len(result['files'])} files)", code, 0, output)
    if len(result["files"]) < 2:
        failures.append(f"sharded export wrote {result['files']}")

    # The command line itself: accepts a real export, and a missing file is exit 2 naming it.
    cli = [sys.executable, args.check_export, "--model_dir",
           os.path.join(tmp, "export_untied2_fp32"), "--logits"]
    r = subprocess.run(cli + [os.path.join(tmp, "ckpt_untied2", "final_logits.json")],
                       capture_output=True, text=True)
    print(f"CLI: exit {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
    if r.returncode != 0:
        failures.append(f"CLI on the real export: exit {r.returncode}: {r.stderr}")
    missing = os.path.join(tmp, "no_such_logits.json")
    r = subprocess.run(cli + [missing], capture_output=True, text=True)
    if r.returncode != 2 or missing not in r.stderr:
        failures.append(f"CLI with a missing logits file: exit {r.returncode}: {r.stderr}")
    if failures:
        print("check_export_test: FAIL\n" + "\n".join(failures))
        return 1
    print("check_export_test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
