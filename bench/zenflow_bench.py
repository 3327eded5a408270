#!/usr/bin/python3
"""ZenFlow vs Loom's synchronous ZeRO-Offload (issue 14): the same model, data, ranks, threads and
steps, in one run, alternating the two systems --repeats times (median of the per-run medians).

  offload: zero_optimization.offload_optimizer.device cpu (CpuAdam over the whole partition at
           every step; the training thread waits for it: stall = the step's optimizer_s).
  zenflow: the same plus zero_optimization.zenflow (topk_ratio, update_interval, overlap_step as
           given; stall = the step's zenflow_stall_s, the training thread's wait on the CPU
           optimizer).

Regime: a micro-batch small enough that synchronous offload spends a large share of its step in
the optimizer (fine-tuning with small batches); the shapes are printed. Reported per system:
median step time, median stall, final held-out loss. Last line:
  zenflow_vs_offload speedup=<x> stall_reduction=<1 - stall_zf/stall_off> loss_delta=<|dl|/l>
Usage: bench/zenflow_bench.sh [flags]   (builds loom-trainer, then runs this).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gang  # noqa: E402


def spec(path, a, zenflow):
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": a.hidden,
           "intermediate_size": a.intermediate, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads or a.heads,
           "max_position_embeddings": max(512, a.seq), "tie_word_embeddings": a.tie,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "initializer_range": 0.02}
    zero = {"stage": a.stage, "overlap_comm": a.stage != 1, "offload_optimizer": {"device": "cpu"}}
    if a.stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    if zenflow:
        zero["zenflow"] = {"topk_ratio": a.topk, "select_strategy": "step",
                           "select_interval": a.select_interval,
                           "update_interval": a.update_interval, "overlap_step": True,
                           "full_warm_up_rounds": a.warm_up_rounds,
                           "pt_reserved_cores_perc": a.pt_reserved}
    s = {"name": "zenflow-bench", "model": {"config": cfg},
         "dataset": {"name": "fortunes", "tokenizer": "byte"},
         "deepspeed_config": {
             "train_micro_batch_size_per_gpu": a.micro, "gradient_accumulation_steps": 1,
             "gradient_clipping": 1.0,
             "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.01}},
             "zero_optimization": zero},
         "training": {"sequence_length": a.seq, "steps": str(a.steps), "seed": "1",
                      "eval_batches": a.eval_batches, "threads_per_rank": a.threads}}
    with open(path, "w") as f:
        json.dump(s, f)
    return path


def run(a, name, zenflow):
    path = spec(os.path.join(a.workdir, name + ".json"), a, zenflow)
    t0 = time.time()
    ranks = gang.run_loom(a.trainer, path, a.world, os.path.join(a.workdir, name),
                          extra=a.trainer_arg, timeout_s=a.timeout)
    ok = all(r.returncode == 0 for r in ranks) and all(r.of("done") for r in ranks)
    if not ok:
        errs = [e.get("message") for r in ranks for e in r.of("error")]
        raise RuntimeError("%s failed: %s (logs under %s)" % (name, errs, a.workdir))
    steps = ranks[0].of("step")[a.skip:]
    step_t = statistics.median(e["step_time_s"] for e in steps)
    key = "zenflow_stall_s" if zenflow else "optimizer_s"
    stall = statistics.median(e.get(key, 0.0) for e in steps)
    opt = statistics.median(e.get("optimizer_s", 0.0) for e in steps)
    loss = ranks[0].of("done")[0]["final_eval_loss"]
    print("  %-12s %6.1f s wall: step %.4f s, optimizer %.4f s, stall %.4f s, eval loss %.5f"
          % (name, time.time() - t0, step_t, opt, stall, loss), flush=True)
    return step_t, stall, loss


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trainer", required=True)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="threads per rank (both systems)")
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1376)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=0, help="0 = --heads")
    p.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    p.add_argument("--example", action="store_true",
                   help="examples/fortunes-llama's shape: 2 ranks x 1 thread, stage 3, hidden 384, "
                        "intermediate 1024, 4 layers, 6/2 heads, tied, micro-batch 8 x seq 128")
    p.add_argument("--micro", type=int, default=1)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--topk", type=float, default=0.05)
    p.add_argument("--select_interval", type=int, default=8)
    p.add_argument("--update_interval", type=int, default=4)
    p.add_argument("--warm_up_rounds", type=int, default=0)
    p.add_argument("--pt_reserved", type=float, default=0.5)
    p.add_argument("--eval_batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--workdir", default="")
    p.add_argument("--trainer_arg", action="append", default=[],
                   help="extra loom-trainer flag for both systems (repeatable), e.g. "
                        "--trainer_arg=--malloc_mmap_threshold_bytes=33554432")
    a = p.parse_args()
    if a.example:
        a.world, a.threads, a.stage, a.hidden, a.intermediate = 2, 1, 3, 384, 1024
        a.layers, a.heads, a.kv_heads, a.tie, a.micro, a.seq = 4, 6, 2, True, 8, 128
    keep = bool(a.workdir)
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="zenflow_bench_")
    os.makedirs(a.workdir, exist_ok=True)
    kv = a.hidden * (a.kv_heads or a.heads) // a.heads
    params = (1 if a.tie else 2) * 256 * a.hidden + a.layers * (
        2 * a.hidden + 2 * a.hidden * a.hidden + 2 * a.hidden * kv +
        3 * a.hidden * a.intermediate) + a.hidden
    print("shapes: %d layers, hidden %d, intermediate %d, vocab 256 (%d params); micro-batch %d "
          "x seq %d, GAS 1, %d rank(s) x %d threads, stage %d; zenflow topk %.3g, select every "
          "%d, update every %d, overlap on; %d steps (first %d left out), %d repeats"
          % (a.layers, a.hidden, a.intermediate, params, a.micro, a.seq, a.world, a.threads,
             a.stage, a.topk, a.select_interval, a.update_interval, a.steps, a.skip, a.repeats),
          flush=True)
    off, zf = [], []
    for rep in range(a.repeats):
        off.append(run(a, "offload_%d" % rep, False))
        zf.append(run(a, "zenflow_%d" % rep, True))
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    o_step, o_stall, o_loss = med(off, 0), med(off, 1), med(off, 2)
    z_step, z_stall, z_loss = med(zf, 0), med(zf, 1), med(zf, 2)
    runs = lambda rs: "/".join("%.4f" % r[0] for r in rs)  # noqa: E731
    print("offload: step %.4f s (runs %s), stall %.4f s = optimizer fraction %.0f%% of the "
          "step, eval loss %.5f" % (o_step, runs(off), o_stall, 100 * o_stall / o_step, o_loss))
    print("zenflow: step %.4f s (runs %s), stall %.4f s (%.0f%% of the step), eval loss %.5f"
          % (z_step, runs(zf), z_stall, 100 * z_stall / z_step, z_loss))
    if not keep:
        shutil.rmtree(a.workdir, ignore_errors=True)
    print("zenflow_vs_offload speedup=%.3f stall_reduction=%.3f loss_delta=%.4f"
          % (o_step / z_step, 1 - z_stall / o_stall if o_stall > 0 else float("nan"),
             abs(z_loss - o_loss) / o_loss))


if __name__ == "__main__":
    main()
