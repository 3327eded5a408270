#!/opt/loom/venv/bin/python3
"""transformers as the judge of a Loom export: Hugging Face's own loader and model, offline.

Usage:
  /opt/loom/venv/bin/python3 hf_load_export.py --model_dir DIR --logits final_logits.json [--atol 1e-4]

Loads DIR (config.json + model.safetensors or sharded files with model.safetensors.index.json)
with transformers' AutoModelForCausalLM.from_pretrained, offline and in float32 (a bf16 export is
upcast), runs it on final_logits.json's tokens and compares its logits with the ones loom-trainer
computed ({"tokens": [...], "logits": [[vocab floats] per position]}). Any tensor transformers
reports missing, unexpected or mismatched fails the check: the export must be exactly the model
class's state dict. Exits 0 when max |transformers - Loom| <= atol, 1 on a mismatch, 2 when
transformers cannot load the export.

Where check_export.py rebuilds the forward pass by hand, this trusts nothing of Loom's or ours:
the class, the config parsing and the weights' names are transformers' (pinned in
scripts/python-requirements.txt).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    try:
        with open(args.logits) as f:
            ref = json.load(f)
        tokens, loom = ref["tokens"], torch.tensor(ref["logits"], dtype=torch.float64)
        model, info = AutoModelForCausalLM.from_pretrained(
            args.model_dir, dtype=torch.float32, local_files_only=True, output_loading_info=True)
    except Exception as e:  # transformers raises many types (OSError, ValueError, KeyError, ...)
        print(f"hf_load_export: error: transformers cannot load {args.model_dir}: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print(f"hf_load_export: error: {type(model).__name__} loaded with {bad}", file=sys.stderr)
        return 2
    model.eval()
    with torch.no_grad():
        hf = model(torch.tensor([tokens], dtype=torch.long)).logits[0].to(torch.float64)
    if hf.shape != loom.shape:
        print(f"hf_load_export: shape mismatch: transformers {tuple(hf.shape)} vs "
              f"Loom {tuple(loom.shape)}")
        return 1
    diff = (hf - loom).abs().max().item()
    ok = diff <= args.atol
    print(f"hf_load_export: {type(model).__name__} (transformers {transformers.__version__}), "
          f"{len(tokens)} tokens: max |transformers - Loom| = {diff:.3e} (atol {args.atol:g}) "
          f"-> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
