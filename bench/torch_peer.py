#!/opt/loom/venv/bin/python3
"""PyTorch peer for bench/zero_bench.py: the Llama shape Loom trains (Hugging Face
LlamaForCausalLM semantics: token embedding, RMSNorm, GQA attention with RoPE and a causal mask,
SwiGLU MLP, untied lm_head; normal(0, initializer_range) init, norms at 1), trained with
torch.distributed over Gloo on CPU, one process per rank, as either
  --mode=ddp    DistributedDataParallel + torch.optim.AdamW (--gradient_as_bucket_view: DDP's
                option that makes .grad views of its all-reduce buckets, saving one gradient copy), or
  --mode=zero1  DistributedDataParallel + ZeroRedundancyOptimizer(AdamW)  (ZeRO stage 1).
Prints one JSON line per event on stdout: process_start (rss_bytes after imports, before the
model), started, step (step_time_s, fwd_bwd_s, optimizer_s, data_s, loss, grad_norm), done.
--foreach runs AdamW(foreach=True), --fused AdamW(fused=True) (torch 2.x's fused CPU kernel: the
fastest optimizer path a PyTorch user picks on CPU; with --mode=zero1 the shard's AdamW is fused). Run with the project venv's /opt/loom/venv/bin/python3 (torch 2.11).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def rss_bytes():
    """This process's resident set now (VmRSS), bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def emit(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(seq, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(seq).float(), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
        self.hq, self.hkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.q_proj = nn.Linear(h, self.hq * d, bias=False)
        self.k_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)

    def forward(self, hs, cos, sin, causal):
        b, s, _ = hs.shape
        x = self.input_layernorm(hs)
        q = self.q_proj(x).view(b, s, self.hq, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.hkv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.hq // self.hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        scores = scores.masked_fill(causal, float("-inf"))
        attn = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, s, -1)
        hs = hs + self.o_proj(attn)
        x = self.post_attention_layernorm(hs)
        return hs + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, c["initializer_range"])

    def forward(self, ids):
        s = ids.shape[1]
        d = self.c["hidden_size"] // self.c["num_attention_heads"]
        cos, sin = rope_tables(s, d, self.c["rope_theta"])
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h, cos, sin, causal)
        return self.lm_head(self.norm(h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world_size", type=int, required=True)
    ap.add_argument("--master_port", type=int, required=True)
    ap.add_argument("--mode", choices=["ddp", "zero1"], default="ddp")
    ap.add_argument("--config", required=True, help="model config JSON (HF Llama keys)")
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--gradient_as_bucket_view", action="store_true")
    ap.add_argument("--foreach", action="store_true",
                    help="AdamW(foreach=True): the multi-tensor path a PyTorch user would pick")
    ap.add_argument("--fused", action="store_true",
                    help="AdamW(fused=True): torch 2.x's fused kernel, the fastest path on CPU")
    a = ap.parse_args()
    # The interpreter's and libtorch_python's own memory, before anything is built: the benchmark
    # reports peak memory with and without it.
    emit(event="process_start", rss_bytes=rss_bytes())
    torch.set_num_threads(a.threads)
    c = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "initializer_range": 0.02}
    c.update(json.loads(a.config))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.master_port,
                            rank=a.rank, world_size=a.world_size)
    torch.manual_seed(1234)
    model = Llama(c)
    nparams = sum(p.numel() for p in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(
        model, gradient_as_bucket_view=a.gradient_as_bucket_view)
    if a.mode == "ddp":
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay,
                                foreach=a.foreach, fused=a.fused or None)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=a.lr, weight_decay=a.weight_decay,
                                      fused=a.fused or None)
    emit(event="started", rank=a.rank, world_size=a.world_size, params=nparams, mode=a.mode)
    gen = torch.Generator().manual_seed(1000 + a.rank)
    # The timed step holds the same work as Loom's step_time_s: building the batch, forward,
    # backward with the gradient all-reduce, the global gradient norm (DDP's gradients are
    # already replicated, so it needs no collective of its own), the optimizer step, clearing the
    # gradients and the all-reduce of the loss for reporting.
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        ids = torch.randint(0, 256, (a.micro, a.seq + 1), generator=gen)
        tb = time.perf_counter()
        logits = ddp(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), ids[:, 1:].reshape(-1))
        loss.backward()  # DDP all-reduces the gradients (bucketed, overlapped with backward)
        t1 = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()       # zero1: local AdamW on this rank's shard, then broadcast of params
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        lt = loss.detach().clone()
        dist.all_reduce(lt)
        t3 = time.perf_counter()
        emit(event="step", step=step, loss=lt.item() / a.world_size, step_time_s=t3 - t0,
             fwd_bwd_s=t1 - tb, optimizer_s=t2 - t1, data_s=tb - t0,
             grad_norm=float(grad_norm))
    dist.barrier()
    emit(event="done", step=a.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
