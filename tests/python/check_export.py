#!/opt/loom/venv/bin/python3
"""Independent check of an exported Loom model (Llama or Qwen2) against the trainer's own logits.

Usage:
  /opt/loom/venv/bin/python3 check_export.py --model_dir DIR --logits final_logits.json [--atol 1e-4]

DIR holds config.json and model.safetensors, or the shards listed by
model.safetensors.index.json (F32/F16/BF16/F64 tensors with Hugging Face Llama names).
Whether lm_head.weight must be present is read from config.json's tie_word_embeddings (absent:
false, LlamaConfig's default), never guessed from the tensors: an untied config without
lm_head.weight, or a tied one with it, is malformed. final_logits.json is written by loom-trainer's rank 0 at the end of training:
{"tokens": [t0, ..., t31], "logits": [[vocab floats] per position]}, computed by the live
ZeRO-3 model. The family is config.json's model_type: "llama" (absent: llama) or "qwen2"
(Hugging Face Qwen2ForCausalLM: Llama plus self_attn.{q,k,v}_proj.bias, no o_proj bias; a
use_sliding_window true config is refused as malformed). This script parses the safetensors
file itself (8-byte little-endian header length, JSON header, raw little-endian data;
docs/design/TECHNIQUES.md §5.3), rebuilds the Llama forward pass in plain PyTorch (Hugging Face
LlamaForCausalLM semantics, written independently of the C++ engine; half-split rotary
embedding, query head h reads key/value head h // (Hq / Hkv), RMSNorm with config.json's
rms_norm_eps) in float64, runs it on the tokens and compares with
the C++ logits. Prints the max absolute difference; exits 0 when it is
<= atol, 1 on a mismatch, 2 on malformed input.

Needs only the project venv's torch (2.11) and the standard library: no safetensors or
transformers package.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class ExportError(Exception):
    pass


def read_safetensors(path):
    """Returns {name: tensor} from a safetensors file, validating its layout."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ExportError(f"{path}: shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ExportError(f"{path}: header length {header_len} exceeds the file")
    header_bytes = blob[8:8 + header_len]
    if not header_bytes.startswith(b"{"):
        raise ExportError(f"{path}: header does not start with '{{'")
    header = json.loads(header_bytes.decode("utf-8"))
    data = blob[8 + header_len:]
    entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                     key=lambda kv: kv[1]["data_offsets"][0])
    tensors = {}
    expected_begin = 0
    for name, info in entries:
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ExportError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        numel = math.prod(shape)
        itemsize = torch.tensor([], dtype=dtype).element_size()
        if begin != expected_begin or end - begin != numel * itemsize:
            raise ExportError(f"{path}: {name}: data_offsets {begin},{end} are not contiguous "
                              f"or do not match shape {shape} x {itemsize} bytes")
        expected_begin = end
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape).clone()
    if expected_begin != len(data):
        raise ExportError(f"{path}: {len(data) - expected_begin} trailing bytes after the data")
    return tensors


def read_model_tensors(model_dir):
    """model.safetensors, or every shard named by model.safetensors.index.json's weight_map."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(model_dir, "model.safetensors"))
    with open(index_path) as f:
        weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ExportError(f"{index_path}: no weight_map object")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        for name, t in read_safetensors(os.path.join(model_dir, shard)).items():
            if weight_map.get(name) != shard:
                raise ExportError(f"{index_path}: {name} is in {shard} but the weight_map says "
                                  f"{weight_map.get(name)}")
            tensors[name] = t
    missing = set(weight_map) - set(tensors)
    if missing:
        raise ExportError(f"{index_path}: tensors in the weight_map but in no shard: "
                          f"{sorted(missing)}")
    return tensors


def tie_word_embeddings(cfg):
    """config.json's tie_word_embeddings; absent means false (transformers' LlamaConfig)."""
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ExportError(f"config.json: tie_word_embeddings is {tied!r}, not true or false")
    return tied


_MODEL_TYPES = ("llama", "qwen2")


def model_type(cfg):
    """config.json's model_type ("llama" when absent); anything else is malformed here."""
    mt = cfg.get("model_type", "llama")
    if mt not in _MODEL_TYPES:
        raise ExportError(f"config.json: model_type {mt!r} is not one of {list(_MODEL_TYPES)}")
    if mt == "qwen2" and cfg.get("use_sliding_window", False) is not False:
        raise ExportError("config.json: use_sliding_window must be false (sliding-window "
                          "attention is not modelled)")
    return mt


def qkv_bias(cfg):
    """Qwen2 has biases on q_proj, k_proj and v_proj (and nowhere else)."""
    return model_type(cfg) == "qwen2"


def expected_names(cfg, tied):
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
        if qkv_bias(cfg):
            names += [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
        names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    if not tied:
        names.append("lm_head.weight")
    return set(names)


def llama_logits(w, cfg, tokens, tied):
    """Hugging Face LlamaForCausalLM (or Qwen2ForCausalLM: q/k/v biases) forward for one
    sequence; returns [T, vocab] float64."""
    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_heads
    head_dim = cfg.get("head_dim") or hidden // n_heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    T = len(tokens)

    def norm(x, weight):
        variance = (x * x).mean(dim=-1, keepdim=True)
        return weight * (x / torch.sqrt(variance + eps))

    # Rotary angles: position m, pair i rotates by m * theta^(-2i/d); HF pairs i with i + d/2.
    half = head_dim // 2
    inv = torch.tensor([theta ** (-2.0 * i / head_dim) for i in range(half)], dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # [T, d/2]
    c, s = torch.cos(ang), torch.sin(ang)

    def rotate(x):  # x: [heads, T, d]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    ids = torch.tensor(tokens, dtype=torch.long)
    h = w["model.embed_tokens.weight"][ids]  # [T, H]
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    group = n_heads // n_kv
    bias = qkv_bias(cfg)

    def proj(x, name):  # x @ W^T (+ b for Qwen2's q/k/v)
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        q = proj(x, p + "self_attn.q_proj").view(T, n_heads, head_dim).transpose(0, 1)
        k = proj(x, p + "self_attn.k_proj").view(T, n_kv, head_dim).transpose(0, 1)
        v = proj(x, p + "self_attn.v_proj").view(T, n_kv, head_dim).transpose(0, 1)
        q, k = rotate(q), rotate(k)
        heads = []
        for hq in range(n_heads):
            kv = hq // group  # query head hq reads key/value head hq // group
            scores = (q[hq] @ k[kv].T) / math.sqrt(head_dim)
            scores = scores.masked_fill(causal, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ v[kv])
        attn = torch.stack(heads, dim=1).reshape(T, n_heads * head_dim)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    h = norm(h, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return h @ head.T


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    try:
        with open(os.path.join(args.model_dir, "config.json")) as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict):
            raise ExportError("config.json is not a JSON object")
        weights = read_model_tensors(args.model_dir)
        tied = tie_word_embeddings(cfg)
        if tied and "lm_head.weight" in weights:
            raise ExportError("config.json has tie_word_embeddings true but the export holds "
                              "lm_head.weight (a tied head is model.embed_tokens.weight)")
        if not tied and "lm_head.weight" not in weights:
            raise ExportError("lm_head.weight is missing but config.json has "
                              "tie_word_embeddings false (or absent: LlamaConfig's default)")
        want = expected_names(cfg, tied)
        missing, unexpected = want - set(weights), set(weights) - want
        if missing or unexpected:
            raise ExportError(f"missing tensors {sorted(missing)}, unexpected {sorted(unexpected)}")
        dtypes = ",".join(sorted({str(v.dtype).replace("torch.", "") for v in weights.values()}))
        weights = {k: v.to(torch.float64) for k, v in weights.items()}
        with open(args.logits) as f:
            ref = json.load(f)
        tokens = ref["tokens"]
        cpp = torch.tensor(ref["logits"], dtype=torch.float64)
    except (OSError, ValueError, KeyError, ExportError) as e:
        print(f"check_export: error: {e}", file=sys.stderr)
        return 2
    with torch.no_grad():
        ours = llama_logits(weights, cfg, tokens, tied)
    if ours.shape != cpp.shape:
        print(f"check_export: shape mismatch: python {tuple(ours.shape)} vs "
              f"C++ {tuple(cpp.shape)}")
        return 1
    diff = (ours - cpp).abs().max().item()
    ok = diff <= args.atol
    print(f"check_export: {cfg.get('model_type', 'llama')}, {len(tokens)} tokens, "
          f"vocab {cpp.shape[1]}, tied={tied}, "
          f"dtype {dtypes}: "
          f"max |python - C++| = {diff:.3e} (atol {args.atol:g}) -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
