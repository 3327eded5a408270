#!/usr/bin/python3
"""ALST max-sequence benchmark (issue 13, "Benchmark"): the longest sequence a fixed model trains
under the same per-rank memory cap, as the ALST paper's ablation ladder.

Every probe is a real 2-rank loom-trainer gang (bench/gang.py, as bench/zero_bench.py runs it),
each rank in its own cgroup v1 memory group capped at --cap_mib (bench/memory_cap.py). A sequence
length S fits only if every rank exits 0 after --steps (>= 3) optimizer steps with finite losses
and the kernel OOM-killed nothing (bench/capacity_search.probe). Per rung the search doubles S
from --start until a probe fails, then bisects between the last fit and the first failure
(bench/capacity_search.search), every probed S a multiple of --quantum (which must be a multiple
of the sequence-parallel degree and of the attention block), until the gap is at most
max(quantum, --resolution x fit).

Rungs (each adds one piece to the one before):
  baseline     ZeRO-3 on 2 ranks (DP=2) + per-decoder-layer activation checkpointing
               (deepspeed_config.activation_checkpointing) + blockwise causal attention
               (model.attn_implementation: flash_attention_2)
  tiled_loss   + training.tiled_logits_loss (no [S, vocab] logits)
  tiled_mlp    + training.tiled_mlp_compute
  ckpt_offload + activation_checkpointing.cpu_checkpointing (on a CPU node host and "device"
               memory are the same, so this rung is expected to gain nothing here)
  sp2          + sequence_parallel_size 2 (DP=1: both ranks hold half of one sample's tokens)

Per rung: the largest S, bytes per token = cap / S and = the larger rank's peak RSS (ru_maxrss)
at that S / S (and its cgroup's peak charge / S: what the cap binds; shared library pages
already in the page cache count in RSS but are charged to the group that read them first),
and tokens/s at that S (the trainer's tokens_per_s: global tokens of a step /
step seconds, median of the steps after the first). Then a measured breakdown at the baseline's
largest S: every rung run at that same S without a cap, so the peak-RSS differences between
neighbouring rungs are the bytes each piece removes (logits, MLP intermediates, checkpointed
inputs, the sequence split), next to the process's start-up RSS and the model state the
trainer's memory tracker counts (parameters, gradients, Adam moments, gathered buffers).
Last line:
  alst max_seq_ratio=<sp2 / baseline> max_seq=<sp2's S> bytes_per_token=<cap / sp2's S>
(followed by " lower_bound=1" when sp2 still fit at its longest probe, --max_ratio x the
baseline's S: then the ratio is at least that and the rung's true maximum was not searched).
Usage: bench/alst_bench.sh [flags] (builds loom-trainer, then runs this as root).
"""
import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capacity_search  # noqa: E402
import gang  # noqa: E402
import memory_cap  # noqa: E402
from zero_bench import Result, param_count  # noqa: E402

RUNGS = ("baseline", "tiled_loss", "tiled_mlp", "ckpt_offload", "sp2")


def model_config(a, seq):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.intermediate,
            "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads, "max_position_embeddings": seq,
            "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "initializer_range": 0.02}


def rung_spec(rung, a, seq):
    """The job spec of `rung` (RUNGS) at sequence length `seq`: each rung adds its key."""
    level = RUNGS.index(rung)
    checkpointing = {"cpu_checkpointing": level >= RUNGS.index("ckpt_offload")}
    ds = {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": a.bucket,
                              "allgather_bucket_size": a.bucket,
                              "stage3_max_live_parameters": a.max_live,
                              "stage3_max_reuse_distance": a.max_live // 2,
                              "stage3_prefetch_bucket_size": a.max_live // 2},
        "activation_checkpointing": checkpointing,
    }
    if level >= RUNGS.index("sp2"):
        ds["sequence_parallel_size"] = 2
    training = {"sequence_length": seq, "steps": str(a.steps), "seed": "1",
                "eval_every_steps": "0", "eval_batches": 1, "threads_per_rank": a.threads}
    if level >= RUNGS.index("tiled_loss"):
        training["tiled_logits_loss"] = True
        # The default tile (the tokens of 64 MiB of fp32 logits, 524 at this vocabulary) is
        # sized for an accelerator; under a cap of a few hundred MiB it is a third of the cap.
        training["tiled_logits_loss_tile_size"] = a.loss_tile
    if level >= RUNGS.index("tiled_mlp"):
        training["tiled_mlp_compute"] = True
    return {"name": "alst-bench-%s" % rung.replace("_", "-"),
            "model": {"config": model_config(a, seq), "attn_implementation": "flash_attention_2",
                      "attn_block_size": a.block},
            "dataset": {"name": "fortunes", "tokenizer": "byte"},
            "deepspeed_config": ds, "training": training}


class Runs:
    """Runs rung probes and keeps each one's Result by (rung, seq)."""

    def __init__(self, a, env):
        self.a, self.env, self.results = a, env, {}

    def run(self, rung, seq, caps=None, tag="cap"):
        name = "%s_%s_S%d" % (rung, tag, seq)
        spec = os.path.join(self.a.workdir, name + ".json")
        with open(spec, "w") as f:
            json.dump(rung_spec(rung, self.a, seq), f)
        t0 = time.time()
        try:
            ranks = gang.run_loom(self.a.trainer, spec, 2, os.path.join(self.a.workdir, name),
                                  timeout_s=self.a.timeout, env=self.env, caps=caps)
            r = Result(name, ranks, 1, self.a.workdir)
        except RuntimeError as e:  # rank 0 died before its rendezvous (e.g. OOM-killed early)
            ranks = []
            r = Result(name, ranks, 1, self.a.workdir)
            r.ok, r.error = False, str(e)
        r.wall_s = time.time() - t0
        steps = ranks[0].of("step") if ranks else []
        r.tokens_per_s = (statistics.median(e["tokens_per_s"] for e in steps[1:])
                          if len(steps) > 1 else float("nan"))
        r.tracker_peak = max((e.get("peak_bytes", 0) for rk in ranks for e in rk.of("step")),
                             default=0)
        self.results[(rung, seq, tag)] = r
        return r


def mib(b):
    return b / float(1 << 20)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trainer", default="bazel-bin/worker/trainer/loom-trainer")
    ap.add_argument("--workdir", default="/tmp/loom_alst_bench")
    ap.add_argument("--cap_mib", type=int, default=208, help="per-rank cgroup memory cap")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=176)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--block", type=int, default=128, help="model.attn_block_size")
    ap.add_argument("--loss_tile", type=int, default=32,
                    help="training.tiled_logits_loss_tile_size: tokens per loss tile (32: 4 MiB "
                         "of fp32 logits at a 32,000 vocabulary; 0 = the trainer's 64 MiB rule)")
    ap.add_argument("--bucket", type=int, default=6553600)
    ap.add_argument("--max_live", type=int, default=10000000)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per probe (>= 3)")
    ap.add_argument("--start", type=int, default=32, help="first probed sequence length")
    ap.add_argument("--max_seq", type=int, default=1 << 18, help="longest probe (a fit there is "
                    "reported as a lower bound)")
    ap.add_argument("--quantum", type=int, default=16,
                    help="every probed S is a multiple of this (and so of SP's 2)")
    ap.add_argument("--deadline_s", type=float, default=0,
                    help="start no probe after this many seconds (0: none); rungs not searched "
                         "by then are reported as not run")
    ap.add_argument("--resolution", type=float, default=0.125,
                    help="bisection stops at a gap of max(quantum, resolution x fit)")
    ap.add_argument("--max_ratio", type=float, default=16,
                    help="probe the rungs above the baseline up to this multiple of the "
                         "baseline's max S only (default 16, issue 13's target; 0: up to "
                         "--max_seq); a fit there is a lower bound, printed with '>='")
    ap.add_argument("--target_first", type=int, default=1,
                    help="1: each rung above the baseline first probes --max_ratio x the "
                         "baseline's S and searches below it only if that fails")
    ap.add_argument("--rungs", default=",".join(RUNGS))
    ap.add_argument("--no_breakdown", action="store_true")
    ap.add_argument("--breakdown_grace_s", type=float, default=300,
                    help="breakdown runs may start until --deadline_s + this")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per probe")
    ap.add_argument("--mmap_threshold", type=int, default=262144,
                    help="MALLOC_MMAP_THRESHOLD_ of every rank (as zero_bench's capacity runs: "
                         "freed large blocks go back to the kernel; 0 = glibc default)")
    a = ap.parse_args()
    rungs = [r for r in a.rungs.split(",") if r]
    for r in rungs:
        if r not in RUNGS:
            sys.exit("--rungs: unknown rung %r (rungs: %s)" % (r, ", ".join(RUNGS)))
    if a.steps < 3:
        sys.exit("--steps: %d must be >= 3" % a.steps)
    if a.quantum % 2 or a.start % a.quantum:
        sys.exit("--quantum: %d must be a multiple of 2 (the sequence-parallel degree), and "
                 "--start %d a multiple of it" % (a.quantum, a.start))
    if not os.access(a.trainer, os.X_OK):
        sys.exit("no loom-trainer at %s (run bench/alst_bench.sh)" % a.trainer)
    if not memory_cap.available():
        sys.exit("no writable cgroup v1 memory controller at %s (run as root; ENVIRONMENT.md)"
                 % memory_cap.ROOT)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(a.threads)
    if a.mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(a.mmap_threshold)
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    cap = a.cap_mib << 20
    params = param_count(model_config(a, a.start))
    t_start = time.time()
    print("alst_bench: 2 ranks x %d thread(s), Llama h=%d i=%d layers=%d heads=%d/%d vocab=%d "
          "(%.1fM params, untied lm_head), ZeRO-3, AdamW fp32, micro-batch 1, %d steps per probe; "
          "per-rank cgroup cap %d MiB; S a multiple of %d, doubling from %d then bisection to "
          "max(%d, %.3g x S); load average %s" % (
              a.threads, a.hidden, a.intermediate, a.layers, a.heads, a.kv_heads, a.vocab,
              params / 1e6, a.steps, a.cap_mib, a.quantum, a.start, a.quantum, a.resolution,
              " ".join("%.1f" % x for x in os.getloadavg())), flush=True)
    runs = Runs(a, env)
    best = {}
    timed_out = []
    limits = {}  # rung -> its longest probe
    for rung in rungs:
        print("\n== rung %s ==" % rung, flush=True)
        # Each rung only adds memory savings to the rungs below it, so its search starts at the
        # largest fit of those already searched (saving the short probes), else at --start.
        below = [best[r].layers for r in best if best[r] and RUNGS.index(r) < RUNGS.index(rung)]
        start = max(below) if below else a.start
        limit = a.max_seq
        if a.max_ratio > 0 and rung != "baseline" and best.get("baseline"):
            limit = min(limit, int(a.max_ratio * best["baseline"].layers) // a.quantum * a.quantum)
        limits[rung] = limit

        def run(name, seq, caps, rung=rung):
            if a.deadline_s and time.time() - t_start > a.deadline_s:
                timed_out.append(rung)
                raise TimeoutError(rung)
            return runs.run(rung, seq, caps)

        def describe(p):
            return "S=%-7d" % p.layers

        try:
            fit, probes = None, []
            if a.target_first and rung != "baseline" and limit < a.max_seq:
                # The target first: a fit at --max_ratio x the baseline's S settles the rung
                # (a lower bound) in one probe; otherwise search below it.
                p = capacity_search.probe(rung, limit, params, cap, 2, run, a.steps)
                print("  %-10s %s: %-4s peak %6.0f MiB  (%s, %.0f s)" % (
                    rung, describe(p), "fits" if p.fit else "no", p.peak_bytes / 2**20,
                    p.reason, p.seconds), flush=True)
                probes = [p]
                if p.fit:
                    fit = p
                limit -= a.quantum
            if fit is None:
                fit, more = capacity_search.search(rung, cap, 2, run, lambda s: params,
                                                   start=min(start, limit), max_layers=limit,
                                                   min_steps=a.steps, quantum=a.quantum,
                                                   resolution=a.resolution, describe=describe,
                                                   log=lambda s: print(s, flush=True))
                probes += more
        except TimeoutError:
            print("  %s: not finished, --deadline_s %.0f passed" % (rung, a.deadline_s))
            best[rung] = None
            continue
        failed = [p for p in probes if not p.fit]
        best[rung] = fit
        if fit is None:
            print("  %s: no fit (even S=%d failed: %s)" % (rung, a.start,
                                                          failed[0].reason if failed else "?"))
            continue
        r = runs.results[(rung, fit.layers, "cap")]
        first_fail = min((p.layers for p in failed), default=None)
        print("  %s max_seq=%d%s (first failure S=%s: %s) bytes_per_token cap/S=%.0f "
              "peak_rss/S=%.0f (peak RSS %.0f MiB, cgroup peak %.0f MiB, tracker peak %.0f MiB) "
              "tokens_per_s=%.1f at S=%d (step %.1f s)" % (
                  rung, fit.layers, " (a lower bound: the longest probe fit)" if not failed
                  else "",
                  first_fail, next((p.reason for p in failed if p.layers == first_fail), "-"),
                  cap / fit.layers, r.peak_rss / fit.layers, mib(r.peak_rss),
                  mib(fit.peak_bytes), mib(r.tracker_peak), r.tokens_per_s, fit.layers,
                  r.step()), flush=True)

    print("\n== summary (cap %d MiB per rank) ==" % a.cap_mib)
    print("%-13s %9s %14s %18s %20s %10s %10s" % (
        "rung", "max S", "cap/S B/token", "peak RSS/S B/token", "cgroup peak/S B/token",
        "tokens/s", "x baseline"))
    base = best.get("baseline")
    for rung in [r for r in RUNGS if r in rungs]:
        fit = best.get(rung)
        if fit is None:
            print("%-13s %9s" % (rung, "not run (deadline)" if rung in timed_out else "none"))
            continue
        r = runs.results[(rung, fit.layers, "cap")]
        lower = ">=" if fit.layers >= limits[rung] else ""
        print("%-13s %9s %14.0f %18.0f %20.0f %10.1f %10s" % (
            rung, lower + str(fit.layers), cap / fit.layers, r.peak_rss / fit.layers,
            fit.peak_bytes / fit.layers, r.tokens_per_s,
            lower + "%.2f" % (fit.layers / base.layers) if base else "-"))

    if base and not a.no_breakdown:
        breakdown(a, runs, base.layers, rungs, t_start)

    print("\ntotal benchmark time %.0f s; logs and specs in %s; load average %s" % (
        time.time() - t_start, a.workdir, " ".join("%.1f" % x for x in os.getloadavg())))
    full = best.get("sp2")
    if base and full:
        lower = full.layers >= limits["sp2"]
        if lower:
            print("(sp2 fit at its longest probe, --max_ratio x the baseline: the ratio, max_seq "
                  "and bytes_per_token below are bounds, not the rung's maximum)")
        print("alst max_seq_ratio=%.2f max_seq=%d bytes_per_token=%.0f%s" % (
            full.layers / base.layers, full.layers, cap / full.layers,
            " lower_bound=1" if lower else ""))
    else:
        print("alst max_seq_ratio=nan max_seq=%d bytes_per_token=nan" % (full.layers if full
                                                                         else 0))


def breakdown(a, runs, seq, rungs, t_start):
    """Every rung at the baseline's largest S, uncapped: what holds the baseline's bytes."""
    print("\n== measured breakdown at the baseline's max S=%d (no cap; peak RSS of the larger "
          "rank, ru_maxrss) ==" % seq)
    rows = []
    for rung in RUNGS:  # in ladder order, whatever order the search ran them in
        if rung not in rungs:
            continue
        if a.deadline_s and time.time() - t_start > a.deadline_s + a.breakdown_grace_s:
            print("  %-13s not run (--deadline_s + --breakdown_grace_s passed)" % rung)
            continue
        r = runs.run(rung, seq, None, tag="nocap")
        if not r.ok:
            print("  %-13s failed: %s" % (rung, r.error))
            continue
        started = r.ranks[0].of("started")[0] if r.ranks[0].of("started") else {}
        rows.append((rung, r))
        print("  %-13s peak RSS %7.1f MiB | start-up RSS %6.1f MiB | tracker peak %6.1f MiB "
              "(params %.1f, grads %.1f, Adam %.1f, buffers %.1f MiB at start)" % (
                  rung, mib(r.peak_rss), mib(r.start_rss), mib(r.tracker_peak),
                  mib(started.get("param_bytes", 0)), mib(started.get("grad_bytes", 0)),
                  mib(started.get("optimizer_state_bytes", 0)),
                  mib(started.get("buffer_bytes", 0))), flush=True)
    for (prev, rp), (cur, rc) in zip(rows, rows[1:]):
        print("  %-13s removes %7.1f MiB of the rung before's peak (%.0f B/token)" % (
            cur, mib(rp.peak_rss - rc.peak_rss), (rp.peak_rss - rc.peak_rss) / seq))
    # What the removed pieces should be, from the shapes (fp32, one sample of S tokens a rank).
    v, h, i, l = a.vocab, a.hidden, a.intermediate, a.layers
    print("  shapes at S=%d, fp32: [S, vocab] logits %.1f MiB each (log-softmax output and its "
          "gradient are as large); MLP [S, intermediate] %.2f MiB each (4 saved per layer "
          "untiled, recomputed in backward under checkpointing); a layer's checkpointed input "
          "[S, hidden] %.2f MiB (x %d layers)" % (seq, mib(seq * v * 4), mib(seq * i * 4),
                                                 mib(seq * h * 4), l))


if __name__ == "__main__":
    main()
