#!/opt/loom/venv/bin/python3
"""ZeRO benchmark: Loom (loom-trainer) against PyTorch (torch 2.11, Gloo, CPU) on the same
machine, in one run, with the same Llama shape, batch, sequence length and threads per rank.

  1. Loom ZeRO-3 vs PyTorch DDP (AdamW), 2 ranks: median step time and per-rank peak resident
     memory (ru_maxrss from wait4 = the kernel's VmHWM of each rank process; the larger rank).
  2. Loom ZeRO-1 vs torch.distributed.optim.ZeroRedundancyOptimizer (DDP + sharded AdamW).
  3. Capacity, measured (--capacity measured|both): every rank in its own cgroup v1 memory group
     capped at --measured_cap_gib (bench/memory_cap.py); the model depth is searched for each
     system (bench/capacity_search.py: doubling, then bisection) and a size fits only if 3+
     optimizer steps finish with finite loss and no OOM kill. Systems: PyTorch DDP, Loom ZeRO-3,
     Loom ZeRO-3 with offload_optimizer and offload_param on NVMe. Prints
       capacity measured_ratio=<x> loom_params=<n> ddp_params=<m> cap_bytes=<c>
     and offload_capacity_ratio in the last line is that measured ratio.
     (--capacity fit|both also prints the older two-point extrapolation, labelled as one.)
  Memory is reported with and without each process's RSS at start (process_start events), and
  step time covers the same work on both sides (see the table's header line).
Prints tables, a breakdown, and as the last line:
  zero3_vs_ddp step_time_ratio=<x> peak_memory_ratio=<y> offload_capacity_ratio=<z>
Usage: bench/zero_bench.sh (builds loom-trainer, then runs this).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capacity_search  # noqa: E402
import gang  # noqa: E402
import memory_cap  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Both systems run with the same environment and the same LibTorch (the venv's torch 2.11, MKL
# GEMMs): glibc's default allocator, and OpenMP thread pools capped at --threads. --malloc_mmap_threshold sets
# MALLOC_MMAP_THRESHOLD_ for both (smaller peak RSS, many more page faults).
ENV = dict(os.environ)


def model_config(layers, a):
    return {"architectures": ["LlamaForCausalLM"], "vocab_size": a.vocab,
            "hidden_size": a.hidden, "intermediate_size": a.intermediate,
            "num_hidden_layers": layers, "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads, "max_position_embeddings": max(512, a.seq),
            "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "initializer_range": 0.02}


def param_count(c):
    h, i, v, l = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    d = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * d
    per_layer = 2 * h + h * h * 2 + 2 * h * kv + 3 * h * i
    return 2 * v * h + l * per_layer + h


def loom_spec(path, cfg, a, stage, steps, offload=None, bf16=False, overlap=None):
    # Buckets of 25 MiB of fp32 (6.5M elements), DDP's default bucket_cap_mb, for the
    # reduce-scatters and all-gathers (DeepSpeed's default 5e8 elements would put the whole
    # model's gradients in one bucket).
    zero = {"stage": stage, "sub_group_size": a.sub_group_size,
            "reduce_bucket_size": a.bucket, "allgather_bucket_size": a.bucket}
    if stage == 1 and getattr(a, "zero1_overlap_comm", False):
        zero["overlap_comm"] = True
    if overlap is not None:
        zero["overlap_comm"] = overlap
    if stage == 3:
        # DeepSpeed's defaults (1e9 live elements, reuse distance 1e9) keep every parameter of a
        # sub-billion model gathered from forward to backward; bound them to about a layer, as
        # one does to get stage 3's memory savings.
        zero.update({"stage3_max_live_parameters": a.max_live,
                     "stage3_max_reuse_distance": a.max_live // 2,
                     "stage3_prefetch_bucket_size": a.max_live // 2})
    if offload:
        zero.update(offload)
    spec = {
        "name": "zero-bench",
        "model": {"config": cfg},
        "dataset": {"name": "fortunes", "tokenizer": "byte"},
        "deepspeed_config": {
            "train_micro_batch_size_per_gpu": a.micro, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
            "zero_optimization": zero, **({"bf16": {"enabled": True}} if bf16 else {})},
        "training": {"sequence_length": a.seq, "steps": str(steps), "seed": "1",
                     "eval_batches": 1, "threads_per_rank": a.threads},
    }
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


class Result:
    def __init__(self, name, ranks, skip, workdir=None):
        self.name = name
        if workdir:
            with open(os.path.join(workdir, name + ".events.jsonl"), "w") as f:
                for r in ranks:
                    for e in r.events:
                        f.write(json.dumps(dict(e, rank_process=r.rank)) + "\n")
        self.ranks = ranks
        self.ok = all(r.returncode == 0 for r in ranks) and all(r.of("done") for r in ranks)
        self.error = None
        if not self.ok:
            errs = [e.get("message") for r in ranks for e in r.of("error")]
            self.error = errs[0] if errs else "exit codes %s" % [r.returncode for r in ranks]
        steps = ranks[0].of("step")[skip:] if ranks else []
        self.step_times = [e["step_time_s"] for e in steps]
        self.optimizer_s = [e.get("optimizer_s", 0.0) for e in steps]
        self.fwd_bwd_s = [e.get("fwd_bwd_s", 0.0) for e in steps]
        self.comm_s = [e["comm_s"] for e in steps if "comm_s" in e]  # Loom: blocked in collectives
        self.data_s = [e.get("data_s", 0.0) for e in steps]
        self.peak_rss = max((r.maxrss_bytes or 0) for r in ranks) if ranks else 0
        # Peak minus what each process held before it built anything (process_start: the
        # interpreter and libtorch_python for the peer, LibTorch and libraries for Loom).
        self.peak_above_start = max(((r.maxrss_bytes or 0) -
                                     (r.of("process_start")[0]["rss_bytes"]
                                      if r.of("process_start") else 0)) for r in ranks) \
            if ranks else 0
        self.start_rss = max((r.of("process_start")[0]["rss_bytes"] if r.of("process_start")
                              else 0) for r in ranks) if ranks else 0
        started = ranks[0].of("started") if ranks else []
        self.params = started[0].get("params") if started else None
        self.comm_bytes_per_step = None
        all_steps = ranks[0].of("step") if ranks else []
        if len(all_steps) >= 2 and "comm_bytes" in all_steps[-1]:
            self.comm_bytes_per_step = all_steps[-1]["comm_bytes"] - all_steps[-2]["comm_bytes"]

    def step(self):
        return statistics.median(self.step_times) if self.step_times else float("nan")

    def opt(self):
        return statistics.median(self.optimizer_s) if self.optimizer_s else float("nan")


def run_loom(name, a, cfg, stage, steps, offload=None, env=None, caps=None, trainer=None,
             bf16=False, overlap=None):
    spec = loom_spec(os.path.join(a.workdir, name + ".json"), cfg, a, stage, steps, offload, bf16,
                     overlap)
    t0 = time.time()
    ranks = gang.run_loom(trainer or a.trainer, spec, a.world, os.path.join(a.workdir, name),
                          timeout_s=a.timeout, env=env or ENV, caps=caps)
    r = Result(name, ranks, a.warmup, a.workdir)
    print("  ran %-28s in %5.1f s: %s" % (name, time.time() - t0,
                                         "ok" if r.ok else "FAILED: %s" % r.error), flush=True)
    return r


def run_torch(name, a, cfg, mode, steps, env=None, extra=(), caps=None):
    args = ["--mode=" + mode, "--config=" + json.dumps(cfg), "--micro=%d" % a.micro,
            "--seq=%d" % a.seq, "--steps=%d" % steps, "--threads=%d" % a.threads] + list(extra)
    t0 = time.time()
    ranks = gang.run_python(os.path.join(HERE, "torch_peer.py"), args, a.world,
                            os.path.join(a.workdir, name), timeout_s=a.timeout, env=env or ENV,
                            caps=caps)
    r = Result(name, ranks, a.warmup, a.workdir)
    print("  ran %-28s in %5.1f s: %s" % (name, time.time() - t0,
                                         "ok" if r.ok else "FAILED: %s" % r.error), flush=True)
    return r


def mib(b):
    return b / (1 << 20)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trainer", default="bazel-bin/worker/trainer/loom-trainer")
    ap.add_argument("--workdir", default="/tmp/loom_zero_bench")
    ap.add_argument("--nvme_path", default="", help="default: <workdir>/nvme")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank (both systems)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv_heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=8, help="depth of the step-time/memory model")
    ap.add_argument("--cap_layers", default="2,8", help="two depths for the capacity fit")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="steps excluded from the median")
    ap.add_argument("--cap_gib", type=float, default=12.0,
                    help="per-rank memory cap for the capacity ratio (default: 24 GiB / 2 ranks)")
    ap.add_argument("--sub_group_size", type=int, default=4000000,
                    help="elements per optimizer sub-group (NVMe records, swap buffers)")
    ap.add_argument("--bucket", type=int, default=6553600,
                    help="reduce/allgather bucket elements (= DDP's 25 MiB bucket_cap_mb)")
    ap.add_argument("--max_live", type=int, default=16000000,
                    help="stage3_max_live_parameters (reuse distance and prefetch: half)")
    ap.add_argument("--capacity", choices=("measured", "fit", "both", "none"), default="both",
                    help="measured: search the model size under a cgroup cap per rank; fit: the "
                         "older two-point extrapolation to --cap_gib; both; none")
    ap.add_argument("--measured_cap_gib", type=float, default=3.0,
                    help="per-rank cgroup memory cap of the measured capacity search")
    ap.add_argument("--cap_steps", type=int, default=4,
                    help="steps of each capacity probe (at least 3 must finish)")
    ap.add_argument("--cap_start_layers", type=int, default=1)
    ap.add_argument("--cap_max_layers", type=int, default=512,
                    help="deepest probe of the search (a fit there is reported as a lower bound)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--old_trainer", default="",
                    help="a loom-trainer built from an older commit: its ZeRO-3 and ZeRO-1 runs "
                         "(and bf16 ZeRO-3 with --bf16) join this run, step time and peak "
                         "memory printed against the new binary's")
    ap.add_argument("--bf16", action="store_true",
                    help="also run Loom ZeRO-3 with bf16 parameters (communication_data_type "
                         "default = bf16): step time, peak memory and comm MiB/step")
    ap.add_argument("--no_foreach", action="store_true",
                    help="skip the DDP AdamW(foreach=True) row (the peer is then DDP's default)")
    ap.add_argument("--zero1_overlap_comm", action="store_true",
                    help="Loom ZeRO-1 with overlap_comm true (DeepSpeed's stage-1 default is "
                         "false; DDP under ZeroRedundancyOptimizer overlaps its all-reduce)")
    ap.add_argument("--only", choices=("all", "zero3", "zero1"), default="all",
                    help="zero3: only DDP (and foreach) and Loom ZeRO-3 (+ old/bf16 twins); "
                         "zero1: only ZeroRedundancyOptimizer and Loom ZeRO-1 (+ old twin): a "
                         "shorter run for one target's ratio")
    ap.add_argument("--zero1_overlap_row", action="store_true",
                    help="also run Loom ZeRO-1 with overlap_comm true as its own row "
                         "(loom_zero1_overlap), its ratio to ZeroRedundancyOptimizer printed too")
    ap.add_argument("--no_references", action="store_true",
                    help="skip the reference rows (DDP gradient_as_bucket_view, ZeRO-3 CpuAdam)")
    ap.add_argument("--cap_mmap_threshold", type=int, default=262144,
                    help="MALLOC_MMAP_THRESHOLD_ of the capacity runs, both systems (0: default)")
    ap.add_argument("--malloc_mmap_threshold", type=int, default=0,
                    help="MALLOC_MMAP_THRESHOLD_ for every rank of both systems (0: glibc default)")
    a = ap.parse_args()
    ENV["OMP_NUM_THREADS"] = ENV["OPENBLAS_NUM_THREADS"] = str(a.threads)
    if a.malloc_mmap_threshold > 0:
        ENV["MALLOC_MMAP_THRESHOLD_"] = str(a.malloc_mmap_threshold)
    if not os.access(a.trainer, os.X_OK):
        sys.exit("no loom-trainer at %s (run bench/zero_bench.sh)" % a.trainer)
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    nvme = a.nvme_path or os.path.join(a.workdir, "nvme")
    os.makedirs(nvme, exist_ok=True)
    t_start = time.time()
    cfg = model_config(a.layers, a)
    psi = param_count(cfg)
    print("zero_bench: %d ranks x %d thread(s), Llama h=%d i=%d heads=%d/%d vocab=%d layers=%d "
          "(%.1fM params), seq %d, micro-batch %d per rank, AdamW, fp32, %d steps (median of last "
          "%d)" % (a.world, a.threads, a.hidden, a.intermediate, a.heads, a.kv_heads, a.vocab,
                   a.layers, psi / 1e6, a.seq, a.micro, a.steps, a.steps - a.warmup), flush=True)
    nvme_offload = {
        "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "buffer_count": 6,
                              "pipeline_read": True, "pipeline_write": True},
        "offload_param": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4,
                          "buffer_size": 100000000}}

    # 1. ZeRO-3 vs DDP (plus ZeRO-3 with the CPU optimizer, which on this CPU-only machine is
    #    what offload_optimizer "cpu" changes: the step runs in CpuAdam).
    skipped = Result("skipped", [], 0)
    skipped.ok, skipped.error = False, "skipped (--no_foreach / --no_references / --only)"
    do3, do1 = a.only in ("all", "zero3"), a.only in ("all", "zero1")
    ddp_default = run_torch("torch_ddp", a, cfg, "ddp", a.steps) if do3 else skipped
    # The faster optimizer path a PyTorch user would pick; the ratios use the faster peer.
    ddp_foreach = skipped if a.no_foreach or not do3 else run_torch(
        "torch_ddp_foreach", a, cfg, "ddp", a.steps, extra=["--foreach"])
    # torch 2.x's fused CPU AdamW: the fastest path a PyTorch user picks on CPU (~3x the default's
    # optimizer time at this shape). The target's peer is the fastest of the three.
    ddp_fused = run_torch("torch_ddp_fused", a, cfg, "ddp", a.steps, extra=["--fused"]) if (
        do3) else skipped
    ddp = min((r for r in (ddp_default, ddp_foreach, ddp_fused) if r.ok),
              key=lambda r: r.step(), default=ddp_default)
    z3 = run_loom("loom_zero3", a, cfg, 3, a.steps) if do3 else skipped
    z3c = skipped if a.no_references or not do3 else run_loom(
        "loom_zero3_cpu_adam", a, cfg, 3, a.steps, {"offload_optimizer": {"device": "cpu"}})
    # A reference, not the target's peer: DDP with its memory-saving gradient_as_bucket_view
    # (off by default), which drops one of its two gradient copies.
    ddpv = skipped if a.no_references or not do3 else run_torch(
        "torch_ddp_bucket_view", a, cfg, "ddp", a.steps, extra=["--gradient_as_bucket_view"])
    # 2. ZeRO-1.
    tz1 = run_torch("torch_zero1_fused", a, cfg, "zero1", a.steps, extra=["--fused"]) if (
        do1) else skipped
    z1 = run_loom("loom_zero1", a, cfg, 1, a.steps) if do1 else skipped
    z1o = run_loom("loom_zero1_overlap", a, cfg, 1, a.steps, overlap=True) if (
        do1 and a.zero1_overlap_row) else skipped
    # Old binary vs new (same run), and bf16 ZeRO-3 (gradient communication dtype).
    old_rows = []
    if a.old_trainer and do3:
        old_rows.append((run_loom("loom_zero3_old", a, cfg, 3, a.steps, trainer=a.old_trainer),
                         z3))
    if a.old_trainer and do1:
        old_rows.append((run_loom("loom_zero1_old", a, cfg, 1, a.steps, trainer=a.old_trainer),
                         z1))
    bf16_rows = []
    if a.bf16 and do3:
        z3b = run_loom("loom_zero3_bf16", a, cfg, 3, a.steps, bf16=True)
        bf16_rows.append(z3b)
        if a.old_trainer:
            z3bo = run_loom("loom_zero3_bf16_old", a, cfg, 3, a.steps, trainer=a.old_trainer,
                            bf16=True)
            bf16_rows.append(z3bo)
            old_rows.append((z3bo, z3b))
    # 3. Capacity: two depths, 3 steps each (peak RSS is reached in the first optimizer step).
    #    Both systems run the capacity points with the same allocator setting,
    #    MALLOC_MMAP_THRESHOLD_=<--cap_mmap_threshold> (glibc returns every freed block of that
    #    size or more to the kernel), so that peak RSS measures live memory rather than what
    #    glibc keeps after frees; it costs page faults (time), which capacity does not measure.
    #    The same fit with the default allocator is printed too.
    l1, l2 = [int(x) for x in a.cap_layers.split(",")]
    cap_env = dict(ENV)
    if a.cap_mmap_threshold > 0:
        cap_env["MALLOC_MMAP_THRESHOLD_"] = str(a.cap_mmap_threshold)
    cap_runs = {}
    for layers in ((l1, l2) if a.capacity in ("fit", "both") else ()):
        c = model_config(layers, a)
        cap_runs[("ddp", layers)] = run_torch("torch_ddp_cap_L%d" % layers, a, c, "ddp", 3,
                                              cap_env)
        cap_runs[("loom", layers)] = run_loom("loom_zero3_nvme_cap_L%d" % layers, a, c, 3, 3,
                                              nvme_offload, cap_env)
        if layers == a.layers:
            cap_runs[("ddp_default", layers)] = ddp_default
            cap_runs[("zero3", layers)] = z3
        else:
            cap_runs[("ddp_default", layers)] = run_torch("torch_ddp_L%d" % layers, a, c, "ddp",
                                                          3)
            cap_runs[("zero3", layers)] = run_loom("loom_zero3_L%d" % layers, a, c, 3, 3)
        cap_runs[("loom_default", layers)] = run_loom("loom_zero3_nvme_L%d" % layers, a, c, 3, 3,
                                                      nvme_offload)

    print("\n== Loom ZeRO-3 vs PyTorch DDP (%d ranks, %.1fM params) ==" % (a.world, psi / 1e6))
    print("step time: median s of building the batch, forward, backward with gradient "
          "reduction, global gradient norm, optimizer step, clearing gradients and the loss "
          "all-reduce, on both sides")
    print("%-34s %12s %12s %14s %14s %16s" % ("system", "step s", "optimizer s", "peak RSS MiB",
                                             "at start MiB", "comm MiB/step"))
    extra_rows = [o for o, _ in old_rows if o not in bf16_rows] + bf16_rows
    for r in (ddp_default, ddp_foreach, ddp_fused, ddpv, z3, z3c, tz1, z1, z1o, *extra_rows):
        if not r.ok:
            print("%-34s  not available: %s" % (r.name, r.error))
            continue
        print("%-34s %12.3f %12.3f %14.0f %14.0f %16s" % (
            r.name, r.step(), r.opt(), mib(r.peak_rss), mib(r.start_rss),
            "%.0f" % mib(r.comm_bytes_per_step) if r.comm_bytes_per_step else "-"))

    step_ratio = z3.step() / ddp.step() if z3.ok and ddp.ok else float("nan")
    # Memory against the leaner of the two peers (foreach's multi-tensor temporaries cost RSS).
    mem_peer = min((r for r in (ddp_default, ddp_foreach, ddp_fused) if r.ok), key=lambda r: r.peak_rss,
                   default=ddp)
    mem_ratio = z3.peak_rss / mem_peer.peak_rss if z3.ok and mem_peer.ok else float("nan")
    print("\nPeers for the ratios: step time against %s (the faster of AdamW's default and "
          "foreach paths), memory against %s (the leaner)" % (ddp.name, mem_peer.name))
    print("ZeRO-3 / DDP: step time %.3f, peak memory %.3f" % (step_ratio, mem_ratio))
    if z3.ok and mem_peer.ok and mem_peer.peak_above_start > 0:
        print("ZeRO-3 / DDP peak memory without each process's start-up RSS: %.3f "
              "(%.0f / %.0f MiB above start)" % (z3.peak_above_start / mem_peer.peak_above_start,
                                                 mib(z3.peak_above_start),
                                                 mib(mem_peer.peak_above_start)))
    if z3c.ok and ddp.ok:
        print("ZeRO-3 with CpuAdam (offload_optimizer cpu) / DDP: step time %.3f, peak memory %.3f"
              % (z3c.step() / ddp.step(), z3c.peak_rss / ddp.peak_rss))
    if z3.ok and ddpv.ok:
        print("ZeRO-3 / DDP with gradient_as_bucket_view (reference): step time %.3f, peak memory "
              "%.3f" % (z3.step() / ddpv.step(), z3.peak_rss / ddpv.peak_rss))
    if z1.ok and tz1.ok:
        print("Loom ZeRO-1 / ZeroRedundancyOptimizer: step time %.3f, peak memory %.3f"
              % (z1.step() / tz1.step(), z1.peak_rss / tz1.peak_rss))
    else:
        print("Loom ZeRO-1 vs ZeroRedundancyOptimizer: not measured (%s)"
              % (z1.error if not z1.ok else tz1.error))
    if z1o.ok and tz1.ok:
        print("Loom ZeRO-1 overlap_comm true / ZeroRedundancyOptimizer: step time %.3f, peak "
              "memory %.3f" % (z1o.step() / tz1.step(), z1o.peak_rss / tz1.peak_rss))
    for old, new in old_rows:
        if old.ok and new.ok:
            print("new / old binary, %s: step time %.3f (%.3f / %.3f s), peak memory %.3f "
                  "(%.0f / %.0f MiB)" % (new.name, new.step() / old.step(), new.step(),
                                         old.step(), new.peak_rss / old.peak_rss,
                                         mib(new.peak_rss), mib(old.peak_rss)))
            if new.comm_bytes_per_step and old.comm_bytes_per_step:
                print("  comm bytes/step new / old: %.3f (%d / %d)" % (
                    new.comm_bytes_per_step / old.comm_bytes_per_step, new.comm_bytes_per_step,
                    old.comm_bytes_per_step))
        else:
            print("new / old binary, %s: not measured (%s)" % (new.name, old.error or new.error))
    # Breakdown (medians, rank 0). Loom reports the seconds its rank was blocked waiting in
    # collectives (communication + waiting for the peer = idle), the optimizer step and input
    # preparation; compute is the rest. DDP overlaps its bucketed all-reduce with backward, so
    # only forward+backward (including the all-reduce wait) and the optimizer can be separated.
    print("\nBreakdown (median s/step, rank 0)")
    for r in (ddp_default, ddp_foreach, ddp_fused, ddpv, z3, z3c, tz1, z1, z1o, *extra_rows):
        if not r.ok:
            continue
        if r.comm_s:
            comm = statistics.median(r.comm_s)
            data = statistics.median(r.data_s)
            print("  %-24s compute %.3f | communication+idle %.3f | optimizer %.3f | data %.3f"
                  % (r.name, max(0.0, r.step() - comm - r.opt() - data), comm, r.opt(), data))
        else:
            fb = statistics.median(r.fwd_bwd_s)
            print("  %-24s forward+backward+all-reduce %.3f | optimizer %.3f" % (r.name, fb,
                                                                                   r.opt()))

    measured = measure_capacity(a, nvme_offload, cap_env) if a.capacity in ("measured",
                                                                             "both") else None
    if a.capacity not in ("fit", "both"):
        print("\ntotal benchmark time %.0f s; logs and specs in %s" % (time.time() - t_start,
                                                                       a.workdir))
        print("zero3_vs_ddp step_time_ratio=%.3f peak_memory_ratio=%.3f offload_capacity_ratio=%s"
              % (step_ratio, mem_ratio, "%.2f" % measured if measured else "nan"))
        return
    # Capacity fit (an extrapolation; the measured search above is the reported figure).
    print("\n== Capacity fit, EXTRAPOLATED, under a %.1f GiB per-rank cap (model grows in depth at fixed width; "
          "MALLOC_MMAP_THRESHOLD_=%d for both systems) ==" % (a.cap_gib, a.cap_mmap_threshold))
    cap = a.cap_gib * (1 << 30)
    fits = {}
    slopes = {}
    for system in ("ddp", "loom", "ddp_default", "loom_default", "zero3"):
        r1, r2 = cap_runs[(system, l1)], cap_runs[(system, l2)]
        p1 = param_count(model_config(l1, a))
        p2 = param_count(model_config(l2, a))
        if not (r1.ok and r2.ok):
            print("  %s: not measured (%s)" % (system, r1.error or r2.error))
            continue
        slope = (r2.peak_rss - r1.peak_rss) / float(p2 - p1)
        intercept = r1.peak_rss - slope * p1
        psi_max = (cap - intercept) / slope
        slopes[system] = slope
        if system == "ddp_default":
            print("  with glibc's default allocator:")
        if system in ("ddp_default", "loom_default"):
            fits[system] = psi_max
        if system == "zero3":  # no offload: only for the marginal memory ratio below
            print("  %-12s L=%d: %7.0f MiB | L=%d: %7.0f MiB | %.2f bytes/param + %.0f MiB" % (
                system, l1, mib(r1.peak_rss), l2, mib(r2.peak_rss), slope, mib(intercept)))
            continue
        fits[system] = psi_max
        print("  %-12s L=%d: %.1fM params %7.0f MiB | L=%d: %.1fM params %7.0f MiB | "
              "%.2f bytes/param "
              "+ %.0f MiB -> largest %.2fB params" % (
                  system, l1, p1 / 1e6, mib(r1.peak_rss), l2, p2 / 1e6, mib(r2.peak_rss), slope,
                  mib(intercept), psi_max / 1e9))
    cap_ratio = fits["loom"] / fits["ddp"] if "loom" in fits and "ddp" in fits else float("nan")
    if "loom_default" in fits and "ddp_default" in fits:
        print("  capacity ratio with the default allocator: %.2f"
              % (fits["loom_default"] / fits["ddp_default"]))
    if "zero3" in slopes and "ddp_default" in slopes:
        print("  marginal memory per parameter, ZeRO-3 (no offload) / DDP, default allocator: "
              "%.3f (the peak memory ratio a much deeper model of this width approaches)"
              % (slopes["zero3"] / slopes["ddp_default"]))
    print("\ntotal benchmark time %.0f s; logs and specs in %s" % (time.time() - t_start,
                                                                   a.workdir))
    if measured is not None:
        print("extrapolated capacity ratio (two-point fit, not a measurement): %.2f" % cap_ratio)
        cap_ratio = measured
    print("zero3_vs_ddp step_time_ratio=%.3f peak_memory_ratio=%.3f offload_capacity_ratio=%.2f"
          % (step_ratio, mem_ratio, cap_ratio))


def measure_capacity(a, nvme_offload, cap_env):
    """The measured capacity search (bench/capacity_search.py); returns Loom NVMe / DDP params."""
    cap = int(a.measured_cap_gib * (1 << 30))
    print("\n== Capacity, MEASURED: each rank in its own cgroup capped at %.2f GiB; a size fits if "
          "%d+ optimizer steps finish with finite loss and no OOM kill ==" % (a.measured_cap_gib,
                                                                               3))
    if not memory_cap.available():
        print("capacity: not measured (no writable cgroup v1 memory controller; run as root)")
        return None

    def params(layers):
        return param_count(model_config(layers, a))

    def ddp_run(name, layers, caps):
        return run_torch(name, a, model_config(layers, a), "ddp", a.cap_steps, cap_env,
                         caps=caps)

    def loom_nvme_run(name, layers, caps):
        return run_loom(name, a, model_config(layers, a), 3, a.cap_steps, nvme_offload, cap_env,
                        caps=caps)

    def loom_z3_run(name, layers, caps):
        return run_loom(name, a, model_config(layers, a), 3, a.cap_steps, None, cap_env,
                        caps=caps)

    best = {}
    for system, run in (("ddp", ddp_run), ("loom_zero3", loom_z3_run),
                        ("loom_nvme", loom_nvme_run)):
        fit, probes = capacity_search.search(system, cap, a.world, run, params,
                                        start=a.cap_start_layers, max_layers=a.cap_max_layers)
        best[system] = fit
        print("  %-10s largest fit: %s" % (system, "%d layers, %.1fM params%s" % (
            fit.layers, fit.params / 1e6,
            " (a lower bound: every probe up to --cap_max_layers fit)"
            if all(p.fit for p in probes) else "") if fit else
            "none (even the smallest probe failed)"), flush=True)
    ddp, loom = best["ddp"], best["loom_nvme"]
    if not (ddp and loom):
        print("capacity measured_ratio=nan loom_params=%s ddp_params=%s cap_bytes=%d" % (
            loom.params if loom else 0, ddp.params if ddp else 0, cap))
        return None
    ratio = loom.params / ddp.params
    z3 = best["loom_zero3"]
    print("capacity loom_zero3_no_offload_params=%d ratio_vs_ddp=%.2f" % (
        z3.params if z3 else 0, (z3.params / ddp.params) if z3 else float("nan")))
    print("capacity measured_ratio=%.2f loom_params=%d ddp_params=%d cap_bytes=%d" % (
        ratio, loom.params, ddp.params, cap))
    return ratio


if __name__ == "__main__":
    main()
