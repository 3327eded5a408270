#!/opt/loom/venv/bin/python3
"""Replays a Loom training run in plain PyTorch and compares the trajectory with Loom's.

Usage:
  /opt/loom/venv/bin/python3 reference_trajectory.py --spec job.json --dir TRAJECTORY_DIR
      [--loss_rtol R] [--grad_norm_rtol R] [--weight_atol A] [--update_rtol U]

TRAJECTORY_DIR is what `loom-trainer --trajectory_dir=DIR` writes on every rank (format in
worker/engine/trajectory.h): initial_hf/ and final_hf/ (model.safetensors + config.json, the
exporter's output), tokens_rank_<r>.bin/.json (int64 little-endian windows, shape
[steps, GAS, micro, sequence_length + 1]) and trajectory.json (Loom's per-step loss, lr and
pre-clip gradient norm). job.json is the JobSpec the run was started with; only its
deepspeed_config is read, with DeepSpeed's defaults.

This file shares no code with the engine (nor with check_export.py). It
  * builds the Hugging Face LlamaForCausalLM forward from config.json: RMSNorm (fp32 variance,
    weight * x.to(dtype)), rotary embedding on the half-split pairs (i, i + d/2), grouped-query
    attention (query head h reads key/value head h // (Hq / Hkv)), causal softmax in fp32,
    SwiGLU MLP, tied or untied head per config.json;
  * trains it from initial_hf with the same global batch semantics as DeepSpeed: every rank's
    micro-batch loss (token-mean cross-entropy) is divided by GAS before backward, gradients
    are summed over the GAS micro-steps and averaged over the data-parallel ranks;
    bf16.enabled: the forward/backward runs on a bf16 copy of fp32 master weights, gradients
    are accumulated in fp32 (DeepSpeed's bf16 optimizer);
  * clips with torch.nn.utils.clip_grad_norm_(max_norm=gradient_clipping), steps
    torch.optim.AdamW (torch.optim.Adam when optimizer.type is Adam with adam_w_mode false)
    and sets each step's lr from DeepSpeed's WarmupLR / WarmupDecayLR definition (below);
  * packed samples (trajectory.json "pack_documents", positions_rank_<r>.bin): the rotary
    angles at the recorded position ids, a token attends only to earlier tokens of its own
    document (a document starts where the position id is 0), and the target after a document's
    last token is ignored (Megatron-LM's --reset-position-ids / --reset-attention-mask);
  * compares, step by step, the mean loss, Loom's lr and its pre-clip gradient norm, and at
    the end every final weight.
Tolerances (defaults by precision; measured on the tiny model of
//worker/trainer:reference_trajectory_test, 8 steps, in brackets): fp32: loss rel 1e-5 [3e-8],
grad norm rel 1e-5 [5e-7], final weights |loom - ref| <= 1e-5 [3e-7]; bf16: loss rel 1e-4
[2e-5], grad norm rel 1e-2 [8e-4], the update (W_final - W_initial) within 3 % of the
reference's (relative L2 norm over all parameters) [0.9 %], the 99.9th percentile of
|loom - ref| over all weights <= 2e-3 [3e-4] and its maximum <= 2.5e-2 [1e-2: a few elements
whose Adam step flips with bf16 rounding; the median update is 6e-3]. Every step's lr must equal
the schedule's (rel 1e-9).

stdout carries exactly one JSON line: {"event":"reference","ok":bool,...} with the measured
figures (also the reference's per-step gradient norms, so a caller can check that clipping was
active). Exit status: 0 all within tolerance, 1 mismatch, 2 malformed input (message on stderr
and in the line's "error").

Needs only the project venv's torch (2.11) and the standard library.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F64": torch.float64}


class InputError(Exception):
    pass


def load_safetensors(path):
    """{name: tensor} from a safetensors file (u64 LE header size, JSON header, raw LE data)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise InputError(f"{path}: too short for a safetensors header")
    n = struct.unpack("<Q", blob[:8])[0]
    if 8 + n > len(blob):
        raise InputError(f"{path}: header size {n} is past the end of the file")
    header = json.loads(blob[8:8 + n])
    body = memoryview(blob)[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(meta["dtype"])
        if dtype is None:
            raise InputError(f"{path}: {name}: dtype {meta['dtype']} not handled")
        lo, hi = meta["data_offsets"]
        shape = meta["shape"]
        t = torch.frombuffer(bytearray(body[lo:hi]), dtype=dtype)
        if t.numel() != math.prod(shape):
            raise InputError(f"{path}: {name}: {t.numel()} elements for shape {shape}")
        out[name] = t.reshape(shape).to(torch.float32)
    return out


def load_model_dir(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    return cfg, load_safetensors(os.path.join(path, "model.safetensors"))


def param_names(cfg):
    """Hugging Face parameter names; lm_head.weight only for an untied head."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in ("q", "k", "v", "o")]
        names += [p + "post_attention_layernorm.weight"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    names.append("model.norm.weight")
    if not cfg.get("tie_word_embeddings", False):
        names.append("lm_head.weight")
    return names


class Llama:
    """HF LlamaForCausalLM forward over a dict of weight tensors (any float dtype)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.tied = bool(cfg.get("tie_word_embeddings", False))

    def rms_norm(self, x, weight):
        dtype = x.dtype
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(dtype)

    def rope(self, T, dtype, positions=None):
        d = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        pos = torch.arange(T, dtype=torch.float32) if positions is None else (
            positions.to(torch.float32))  # [T] or [B, T]
        freqs = pos[..., None] * inv_freq  # [..., T, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [..., T, d]: pair (i, i + d/2) shares an angle
        if positions is not None:
            emb = emb[:, None]  # [B, 1, T, d]: one table per row, shared by the heads
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def causal_mask(T, positions=None):
        """fp32 [T, T] (or [B, 1, T, T] per packed row) of 0 / -inf, added to the scores."""
        if positions is None:
            return torch.full((T, T), float("-inf")).triu(1)
        doc = (positions == 0).cumsum(-1)  # [B, T]: a document starts at position 0
        idx = torch.arange(T)
        ok = (doc[:, :, None] == doc[:, None, :]) & (idx[None, None, :] <= idx[None, :, None])
        return torch.zeros(ok.shape, dtype=torch.float32).masked_fill(
            ~ok, float("-inf"))[:, None]

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    def __call__(self, w, ids, positions=None):
        B, T = ids.shape
        x = F.embedding(ids, w["model.embed_tokens.weight"])
        dtype = x.dtype
        cos, sin = self.rope(T, dtype, positions)
        mask = self.causal_mask(T, positions)  # fp32, added before the fp32 softmax
        group = self.n_heads // self.n_kv
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self.rms_norm(x, w[p + "input_layernorm.weight"])
            q = F.linear(h, w[p + "self_attn.q_proj.weight"])
            k = F.linear(h, w[p + "self_attn.k_proj.weight"])
            v = F.linear(h, w[p + "self_attn.v_proj.weight"])
            q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
            v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            k = k.repeat_interleave(group, dim=1)  # kv head j serves query heads j*g .. j*g+g-1
            v = v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            probs = torch.softmax(scores.to(torch.float32) + mask, dim=-1).to(dtype)
            a = (probs @ v).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
            x = x + F.linear(a, w[p + "self_attn.o_proj.weight"])
            h = self.rms_norm(x, w[p + "post_attention_layernorm.weight"])
            g = F.linear(h, w[p + "mlp.gate_proj.weight"])
            u = F.linear(h, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(g) * u, w[p + "mlp.down_proj.weight"])
        x = self.rms_norm(x, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        return F.linear(x, head)


def lr_schedule(ds, step):
    """Learning rate of optimizer step `step` (0-based), from DeepSpeed's lr_schedules.py.

    DeepSpeed creates the scheduler with last_batch_iteration = -1 and calls scheduler.step()
    after every optimizer step, so step s runs with it = last_batch_iteration = s - 1; for
    it < 0 the lr is warmup_min_lr (spec/ds_config.h).
      WarmupLR(warmup_min_lr=0, warmup_max_lr=0.001, warmup_num_steps=1000, warmup_type="log"):
        W = max(2, warmup_num_steps)
        gamma = log(it + 1) / log(W) ("log") or it / W ("linear") while it < W, else 1
        lr = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma
      WarmupDecayLR(total_num_steps, same warm-up): after warm-up (it >= W)
        gamma = max(0, (total_num_steps - it) / max(1, total_num_steps - W))
    """
    opt_lr = float(ds.get("optimizer", {}).get("params", {}).get("lr", 1e-3))
    sched = ds.get("scheduler")
    if not sched:
        return opt_lr
    kind = sched.get("type")
    p = sched.get("params", {})
    if kind not in ("WarmupLR", "WarmupDecayLR"):
        raise InputError(f"deepspeed_config.scheduler.type: {kind} is not modelled here")
    lo = float(p.get("warmup_min_lr", 0.0))
    hi = float(p.get("warmup_max_lr", 0.001))
    W = max(2, int(p.get("warmup_num_steps", 1000)))
    it = step - 1
    if it < 0:
        return lo
    if it < W:
        if p.get("warmup_type", "log") == "log":
            gamma = math.log(it + 1) / math.log(W)
        else:
            gamma = it / W
    elif kind == "WarmupLR":
        gamma = 1.0
    else:
        total = int(p["total_num_steps"])
        gamma = max(0.0, (total - it) / max(1.0, total - W))
    return lo + (hi - lo) * gamma


def batch_sizes(ds, world):
    """(micro, gas) by DeepSpeed's rule: any two of the three batch keys give the third."""
    tb = ds.get("train_batch_size")
    mb = ds.get("train_micro_batch_size_per_gpu")
    gas = ds.get("gradient_accumulation_steps")
    if mb is not None and gas is None:
        gas = tb // (mb * world) if tb is not None else 1
    elif mb is None and gas is not None:
        mb = tb // (gas * world)
    elif mb is None and gas is None:
        gas, mb = 1, tb // world
    return int(mb), int(gas)


def load_tokens(d, rank, name="tokens"):
    with open(os.path.join(d, f"tokens_rank_{rank}.json")) as f:
        meta = json.load(f)
    if meta.get("dtype") != "int64-le":
        raise InputError(f"tokens_rank_{rank}.json: dtype {meta.get('dtype')}")
    with open(os.path.join(d, f"{name}_rank_{rank}.bin"), "rb") as f:
        raw = bytearray(f.read())
    shape = meta["shape"]
    if len(raw) != 8 * math.prod(shape):
        raise InputError(f"{name}_rank_{rank}.bin: {len(raw)} bytes for shape {shape}")
    return torch.frombuffer(raw, dtype=torch.int64).reshape(shape)


def run(args):
    with open(args.spec) as f:
        ds = json.load(f)["deepspeed_config"]
    with open(os.path.join(args.dir, "trajectory.json")) as f:
        traj = json.load(f)
    world = int(traj["world_size"])
    cfg, w0 = load_model_dir(os.path.join(args.dir, "initial_hf"))
    _, w_loom = load_model_dir(os.path.join(args.dir, "final_hf"))
    names = param_names(cfg)
    if sorted(names) != sorted(w0) or sorted(names) != sorted(w_loom):
        raise InputError(f"exports hold {sorted(w0)}, config.json implies {sorted(names)}")
    micro, gas = batch_sizes(ds, world)
    tokens = [load_tokens(args.dir, r) for r in range(world)]
    packed = bool(traj.get("pack_documents", False))
    positions = [load_tokens(args.dir, r, "positions") for r in range(world)] if packed else None
    for r, t in enumerate(tokens):
        if list(t.shape[1:3]) != [gas, micro]:
            raise InputError(f"tokens_rank_{r}: shape {list(t.shape)}, the spec implies "
                             f"[steps, {gas}, {micro}, window]")
    bf16 = bool(ds.get("bf16", {}).get("enabled", False))
    compute_dtype = torch.bfloat16 if bf16 else torch.float32
    loss_rtol = args.loss_rtol if args.loss_rtol is not None else (1e-4 if bf16 else 1e-5)
    norm_rtol = args.grad_norm_rtol if args.grad_norm_rtol is not None else (
        1e-2 if bf16 else 1e-5)
    weight_atol = args.weight_atol if args.weight_atol is not None else (2.5e-2 if bf16 else 1e-5)
    weight_p999_atol = 2e-3  # bf16 only
    update_rtol = args.update_rtol if args.update_rtol is not None else 0.03
    max_norm = float(ds.get("gradient_clipping", 0.0))

    opt = ds.get("optimizer", {"type": "AdamW", "params": {}})
    op = opt.get("params", {})
    if op.get("bias_correction", True) is False or op.get("amsgrad", False):
        raise InputError("deepspeed_config.optimizer: bias_correction false / amsgrad not modelled")
    betas = tuple(op.get("betas", (0.9, 0.999)))
    kwargs = dict(lr=0.0, betas=betas, eps=float(op.get("eps", 1e-8)),
                  weight_decay=float(op.get("weight_decay", 0.0)), foreach=False)
    master = [w0[n].clone().requires_grad_(True) for n in names]
    decoupled = opt.get("type", "AdamW").lower() == "adamw" or op.get("adam_w_mode", True)
    optim = (torch.optim.AdamW if decoupled else torch.optim.Adam)(master, **kwargs)
    model = Llama(cfg)
    vocab = cfg["vocab_size"]

    torch.manual_seed(0)
    steps = traj["steps_run"]
    start = int(traj["start_step"])
    report = {"dtype": "bf16" if bf16 else "fp32", "world_size": world, "gas": gas,
              "micro": micro, "steps": len(steps), "max_norm": max_norm, "loss_rtol": loss_rtol,
              "grad_norm_rtol": norm_rtol, "weight_atol": weight_atol,
              "ref_loss": [], "loom_loss": [], "ref_grad_norm": [], "loom_grad_norm": [],
              "ref_lr": []}
    failures = []
    for k, rec in enumerate(steps):
        step0 = start + k  # 0-based optimizer step
        acc = [torch.zeros_like(m) for m in master]
        loss_sum = 0.0
        for r in range(world):
            for m in range(gas):
                win = tokens[r][k, m]
                ids, targets = win[:, :-1], win[:, 1:]
                pos = None
                if packed:
                    wpos = positions[r][k, m]
                    pos = wpos[:, :-1]
                    targets = targets.masked_fill(wpos[:, 1:] == 0, -100)  # across a boundary
                if bf16:
                    leaf = [x.detach().to(compute_dtype).requires_grad_(True) for x in master]
                else:
                    leaf = master
                logits = model(dict(zip(names, leaf)), ids, pos).to(torch.float32)
                loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                                       ignore_index=-100)
                loss_sum += loss.item()
                grads = torch.autograd.grad(loss / gas, leaf)
                for a, g in zip(acc, grads):
                    a.add_(g.to(torch.float32))
        for mtensor, a in zip(master, acc):
            mtensor.grad = a / world  # data-parallel mean
        ref_loss = loss_sum / (world * gas)
        if max_norm > 0:
            ref_norm = float(torch.nn.utils.clip_grad_norm_(master, max_norm))
        else:
            ref_norm = float(torch.norm(torch.stack([m.grad.norm() for m in master])))
        lr = lr_schedule(ds, step0)
        for group in optim.param_groups:
            group["lr"] = lr
        optim.step()
        optim.zero_grad(set_to_none=True)

        report["ref_loss"].append(ref_loss)
        report["loom_loss"].append(rec["loss"])
        report["ref_grad_norm"].append(ref_norm)
        report["loom_grad_norm"].append(rec["grad_norm"])
        report["ref_lr"].append(lr)
        if rec.get("skipped"):
            failures.append(f"step {rec['step']}: Loom skipped the step")
        if abs(rec["loss"] - ref_loss) > loss_rtol * abs(ref_loss):
            failures.append(f"step {rec['step']}: loss loom {rec['loss']!r} ref {ref_loss!r}")
        if abs(rec["grad_norm"] - ref_norm) > norm_rtol * abs(ref_norm):
            failures.append(f"step {rec['step']}: grad_norm loom {rec['grad_norm']!r} "
                            f"ref {ref_norm!r}")
        if abs(rec["lr"] - lr) > 1e-12 + 1e-9 * abs(lr):
            failures.append(f"step {rec['step']}: lr loom {rec['lr']!r} ref {lr!r}")

    losses = list(zip(report["loom_loss"], report["ref_loss"]))
    report["max_loss_rel"] = max((abs(a - b) / abs(b) for a, b in losses), default=0.0)
    norms = list(zip(report["loom_grad_norm"], report["ref_grad_norm"]))
    report["max_grad_norm_rel"] = max((abs(a - b) / abs(b) for a, b in norms), default=0.0)
    report["clipped_steps"] = sum(1 for n in report["ref_grad_norm"] if n > max_norm > 0)
    max_abs, worst, diff_sq, upd_sq, diffs = 0.0, "", 0.0, 0.0, []
    with torch.no_grad():
        for n, m in zip(names, master):
            diffs.append((w_loom[n] - m).abs().flatten())
            d = diffs[-1].max().item()
            if d > max_abs:
                max_abs, worst = d, n
            diff_sq += (w_loom[n] - m).double().pow(2).sum().item()
            upd_sq += (m - w0[n]).double().pow(2).sum().item()
    report["max_weight_abs"] = max_abs
    report["worst_weight"] = worst
    report["update_rel"] = math.sqrt(diff_sq) / max(math.sqrt(upd_sq), 1e-30)
    all_diffs = torch.sort(torch.cat(diffs)).values
    report["weight_p999_abs"] = all_diffs[int(0.999 * (all_diffs.numel() - 1))].item()
    if max_abs > weight_atol:
        failures.append(f"final weights: max |loom - ref| = {max_abs:.3e} ({worst}) > "
                        f"{weight_atol:g}")
    if bf16 and report["weight_p999_abs"] > weight_p999_atol:
        failures.append(f"final weights: 99.9th percentile |loom - ref| = "
                        f"{report['weight_p999_abs']:.3e} > {weight_p999_atol:g}")
    if bf16 and report["update_rel"] > update_rtol:
        failures.append(f"final weights: update differs by {report['update_rel']:.3f} (rel L2) > "
                        f"{update_rtol:g}")
    report["failures"] = failures
    report["ok"] = not failures
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--loss_rtol", type=float)
    ap.add_argument("--grad_norm_rtol", type=float)
    ap.add_argument("--weight_atol", type=float)
    ap.add_argument("--update_rtol", type=float)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        report = run(args)
    except (OSError, ValueError, KeyError, TypeError, InputError) as e:
        msg = f"reference_trajectory: error: {type(e).__name__}: {e}"
        print(msg, file=sys.stderr)
        print(json.dumps({"event": "reference", "ok": False, "error": msg}), flush=True)
        return 2
    for f in report["failures"]:
        print("reference_trajectory: MISMATCH " + f, file=sys.stderr)
    print(f"reference_trajectory: {report['dtype']} {report['steps']} steps: max loss rel "
          f"{report['max_loss_rel']:.2e}, grad norm rel {report['max_grad_norm_rel']:.2e}, "
          f"weights max abs {report['max_weight_abs']:.2e} (99.9% {report['weight_p999_abs']:.2e}), "
          f"update rel "
          f"{report['update_rel']:.2e}, clipped {report['clipped_steps']}/{report['steps']} "
          f"-> {'OK' if report['ok'] else 'MISMATCH'}", file=sys.stderr)
    report["event"] = "reference"
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
