#!/opt/loom/venv/bin/python3
"""ALST max-sequence benchmark (issue 13, "Benchmark"): the longest sequence a fixed model trains
under the same per-rank memory cap, as the ALST paper's ablation ladder.

Every probe is a real 2-rank loom-trainer gang (bench/gang.py, as bench/zero_bench.py runs it),
each rank in its own cgroup v1 memory group capped at --cap_mib (bench/memory_cap.py; default
150 MiB: at this model every rung's maximum is then set by memory, and the whole ladder takes
about half an hour, docs/benchmarks.md). A sequence length S fits only if every rank exits 0 after
--steps (>= 3) optimizer steps with finite losses and the kernel OOM-killed nothing
(bench/capacity_search.probe). Per rung a binary search (search_rung): the baseline doubles S
from --start until a probe fails; every later rung takes the longest fit of the rungs below as
its lower bound (each rung only adds savings; it is probed for this rung only if the search ends
there) and first probes that rung's first failure (when it fails here too, the maximum is already
bracketed to the resolution), or its ceiling first (--max_ratio x the baseline's S;
--target_first); then it doubles from the longest fit (at least to --rung_start), then bisects
between the longest fit and the shortest failure until the gap
is at most max(--quantum, --resolution x fit); every probed S a multiple of --quantum (a multiple
of the sequence-parallel degree). Each rung's result is labelled: "max" (converged: the maximum
lies in [fit, first failure)), "ceiling" (fit at its longest allowed probe: a lower bound) or
"budget" (--deadline_s stopped it: the fit a lower bound, the first failure an upper bound). A
probe killed at its time limit (--timeout, or --deadline_s + --probe_grace_s) counts as neither
fit nor failure.

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

    def run(self, rung, seq, caps=None, tag="cap", timeout=None):
        name = "%s_%s_S%d" % (rung, tag, seq)
        spec = os.path.join(self.a.workdir, name + ".json")
        with open(spec, "w") as f:
            json.dump(rung_spec(rung, self.a, seq), f)
        t0 = time.time()
        try:
            ranks = gang.run_loom(self.a.trainer, spec, 2, os.path.join(self.a.workdir, name),
                                  timeout_s=timeout or self.a.timeout, env=self.env,
                                  caps=caps)
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
    ap.add_argument("--cap_mib", type=int, default=150,
                    help="per-rank cgroup memory cap (150: every rung memory-limited at the "
                         "default model, docs/benchmarks.md)")
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
    ap.add_argument("--start", type=int, default=32,
                    help="the baseline's first probed sequence length (at the default cap it "
                         "fits; the search doubles from here)")
    ap.add_argument("--rung_start", type=int, default=1024,
                    help="the rungs above the baseline double from max(2 x their lower bound, "
                         "this); probes below it would only re-measure what the rung below "
                         "showed")
    ap.add_argument("--max_seq", type=int, default=1 << 18, help="longest probe (a fit there is "
                    "reported as a lower bound)")
    ap.add_argument("--quantum", type=int, default=16,
                    help="every probed S is a multiple of this (and so of SP's 2)")
    ap.add_argument("--deadline_s", type=float, default=0,
                    help="start no probe after this many seconds (0: none); rungs not searched "
                         "by then are reported as not run")
    ap.add_argument("--resolution", type=float, default=0.125,
                    help="bisection stops at a gap of max(quantum, resolution x fit)")
    ap.add_argument("--max_ratio", type=float, default=0,
                    help="probe the rungs above the baseline up to this multiple of the "
                         "baseline's max S only (e.g. 16, issue 13's target; default 0: up to "
                         "--max_seq, so every rung is searched to its memory limit); a fit "
                         "there is a lower bound, printed with '>='")
    ap.add_argument("--target_first", type=int, default=0,
                    help="1: each rung above the baseline first probes --max_ratio x the "
                         "baseline's S and searches below it only if that fails")
    ap.add_argument("--rungs", default=",".join(RUNGS))
    ap.add_argument("--baseline_seq", type=int, default=0,
                    help="the baseline's max S measured by an earlier run (with --rungs not "
                         "naming baseline: the later rungs continue that ladder)")
    ap.add_argument("--baseline_fail", type=int, default=0,
                    help="that run's first baseline failure (its upper bound)")
    ap.add_argument("--no_breakdown", action="store_true")
    ap.add_argument("--breakdown_rungs", default=",".join(RUNGS),
                    help="the rungs the breakdown runs uncapped at the baseline's max S")
    ap.add_argument("--probe_grace_s", type=float, default=120,
                    help="a probe started before --deadline_s may run this long past it (then "
                         "it is killed and counts as neither fit nor failure)")
    ap.add_argument("--breakdown_grace_s", type=float, default=300,
                    help="breakdown runs may start until --deadline_s + this")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per probe")
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
    if a.quantum % 2 or a.start % a.quantum or a.rung_start % a.quantum:
        sys.exit("--quantum: %d must be a multiple of 2 (the sequence-parallel degree), and "
                 "--start %d and --rung_start %d multiples of it" % (a.quantum, a.start,
                                                                     a.rung_start))
    if not os.access(a.trainer, os.X_OK):
        sys.exit("no loom-trainer at %s (run bench/alst_bench.sh)" % a.trainer)
    if not memory_cap.available():
        sys.exit("no writable cgroup v1 memory controller at %s "
                 "(run as root; docs/benchmarks.md 'Memory caps')" % memory_cap.ROOT)
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
    found = {}  # rung -> RungResult
    base = None
    if a.baseline_seq and "baseline" not in rungs:
        base = found["baseline"] = RungResult(a.baseline_seq, None, a.baseline_fail or None,
                                              "max", [])
        print("baseline: max_seq=%d, first failure %s, from an earlier run (--baseline_seq)" % (
            a.baseline_seq, a.baseline_fail or "?"), flush=True)
    for rung in rungs:
        print("\n== rung %s ==" % rung, flush=True)
        # Each rung only adds memory savings to the rungs below it, so the largest fit of those
        # already searched is this rung's lower bound (probed again only if the search ends there).
        below = [found[r].seq for r in found
                 if found[r].seq and RUNGS.index(r) < RUNGS.index(rung)]
        # That rung's first failure: probed first here (one probe when this rung adds nothing).
        below_fail = min((found[r].upper for r in found
                          if found[r].seq and below and found[r].seq == max(below)
                          and found[r].upper and RUNGS.index(r) < RUNGS.index(rung)),
                         default=None)
        ceiling = a.max_seq
        if a.max_ratio > 0 and rung != "baseline" and base and base.seq:
            ceiling = min(ceiling, int(a.max_ratio * base.seq) // a.quantum * a.quantum)

        def at(seq, rung=rung):
            timeout = a.timeout
            if a.deadline_s:
                left = a.deadline_s - (time.time() - t_start)
                if left <= 0:
                    raise TimeoutError(rung)
                timeout = int(min(timeout, left + a.probe_grace_s))
            p = capacity_search.probe(rung, seq, params, cap, 2,
                                      lambda name, s, caps: runs.run(rung, s, caps,
                                                                     timeout=timeout), a.steps)
            if not p.fit and runs.results[(rung, seq, "cap")].wall_s >= timeout - 2 and \
                    not p.reason.startswith("OOM"):
                # Killed at the time limit, not by the cap: neither a fit nor a failure.
                print("  %-12s S=%-7d: not finished in %d s (the probe's time limit): neither a "
                      "fit nor a failure" % (rung, seq, timeout), flush=True)
                raise TimeoutError(rung)
            print("  %-12s S=%-7d: %-4s cgroup peak %6.0f MiB  (%s, %.0f s)" % (
                rung, seq, "fits" if p.fit else "no", p.peak_bytes / 2**20, p.reason,
                p.seconds), flush=True)
            return p

        res = search_rung(at, a, start=a.start, ceiling=ceiling,
                          known_fit=max(below) if below else None,
                          target_first=bool(a.target_first) and rung != "baseline"
                          and ceiling < a.max_seq, known_fail=below_fail)
        found[rung] = res
        if rung == "baseline":
            base = res
        print("  %s: %s" % (rung, res.describe()), flush=True)
        r = runs.results.get((rung, res.seq, "cap")) if res.seq else None
        if r is not None:
            print("  %s at S=%d: bytes_per_token cap/S=%.0f peak_rss/S=%.0f (peak RSS %.0f MiB, "
                  "cgroup peak %.0f MiB, tracker peak %.0f MiB) tokens_per_s=%.1f (step %.1f s)"
                  % (rung, res.seq, cap / res.seq, r.peak_rss / res.seq, mib(r.peak_rss),
                     mib(res.probe.peak_bytes), mib(r.tracker_peak), r.tokens_per_s,
                     r.step()), flush=True)

    print("\n== summary (cap %d MiB per rank; '>=': a lower bound, '<': the first failure) =="
          % a.cap_mib)
    print("%-13s %-24s %14s %18s %20s %10s %10s" % (
        "rung", "max S", "cap/S B/token", "peak RSS/S B/token", "cgroup peak/S B/token",
        "tokens/s", "x baseline"))
    for rung in [r for r in RUNGS if r in rungs]:
        res = found.get(rung)
        if res is None or not res.seq:
            print("%-13s %-24s" % (rung, res.status if res else "not run"))
            continue
        r = runs.results.get((rung, res.seq, "cap"))
        ratio = "-"
        if base and base.seq:
            ratio = "%s%.2f" % (">=" if res.status != "max" else "", res.seq / base.seq)
        if r is None:  # the rung below's fit, not probed for this rung before the budget ran out
            print("%-13s %-24s %14.0f %18s %20s %10s %10s" % (
                rung, res.short(), cap / res.seq, "-", "-", "-", ratio))
            continue
        print("%-13s %-24s %14.0f %18.0f %20.0f %10.1f %10s" % (
            rung, res.short(), cap / res.seq, r.peak_rss / res.seq,
            res.probe.peak_bytes / res.seq, r.tokens_per_s, ratio))

    if base and base.seq and not a.no_breakdown:
        breakdown(a, runs, base.seq, rungs, t_start, found)

    print("\ntotal benchmark time %.0f s; logs and specs in %s; load average %s" % (
        time.time() - t_start, a.workdir, " ".join("%.1f" % x for x in os.getloadavg())))
    full = found.get("sp2")
    if base and base.seq and full and full.seq:
        lo = full.seq / float(base.upper) if base.upper else None
        hi = full.upper / float(base.seq) if full.upper else None
        print("(max_seq_ratio = sp2's longest fit / the baseline's longest fit; the true maxima lie "
              "below each rung's first failure, so the ratio lies in [%s, %s]%s)" % (
                  "%.2f" % lo if lo else "?", "%.2f" % hi if hi else "unbounded",
                  "; sp2 %s" % full.describe() if full.status != "max" else ""))
        print("alst max_seq_ratio=%.2f max_seq=%d bytes_per_token=%.0f%s" % (
            full.seq / base.seq, full.seq, cap / full.seq,
            {"max": "", "ceiling": " lower_bound=1", "budget": " lower_bound=1 budget=1",
             "inherited": " lower_bound=1 budget=1"}[full.status]))
    else:
        print("alst max_seq_ratio=nan max_seq=%d bytes_per_token=nan" % (
            full.seq if full and full.seq else 0))


class RungResult:
    """One rung's search: seq = its longest fit (0: none), probe = that fit's Probe (None when
    seq is the rung below's fit, not yet probed for this rung), upper = its shortest failure
    (None: none), status = "max" (the bisection converged: the maximum is in [seq, upper)),
    "ceiling" (fit at the longest allowed probe: a lower bound), "budget" (--deadline_s stopped
    the search: seq a lower bound, upper an upper bound), "inherited" (budget, and seq is the
    rung below's) or "none" (even the shortest probe failed)."""

    def __init__(self, seq, probe, upper, status, probes):
        self.seq, self.probe, self.upper, self.status, self.probes = seq, probe, upper, status, probes

    def short(self):
        if not self.seq:
            return self.status
        up = " <%d" % self.upper if self.upper else ""
        return {"max": "%d%s", "ceiling": ">=%d%s (ceiling)", "budget": ">=%d%s (budget)",
                "inherited": ">=%d%s (budget)"}[self.status] % (self.seq, up)

    def describe(self):
        up = "first failure S=%d (%s)" % (self.upper, self.failure_reason()) if self.upper \
            else "no failure probed"
        if self.status == "none":
            return "no fit: %s" % up
        return {"max": "max_seq=%d (the maximum to the search's resolution; %s)",
                "ceiling": "max_seq>=%d (a lower bound: fit at the longest allowed probe; %s)",
                "budget": "max_seq>=%d (a lower bound: --deadline_s stopped the search; %s)",
                "inherited": "max_seq>=%d (a lower bound from the rung below, not probed for this "
                             "rung: --deadline_s stopped the search; %s)"}[self.status] % (
                                 self.seq, up)

    def failure_reason(self):
        return next((p.reason for p in self.probes if p.layers == self.upper), "-")


def search_rung(at, a, start, ceiling, known_fit=None, target_first=False, known_fail=None):
    """Binary search for one rung's longest fitting S (a multiple of --quantum, <= ceiling).

    at(S) -> capacity_search.Probe, raising TimeoutError once --deadline_s has passed.
    known_fit: the rung below's longest fit, this rung's lower bound (each rung only adds
    savings), not probed again unless the search ends on it. known_fail: that rung's first
    failure, probed first (without target_first, and when it is at least a.rung_start): if it
    fails here too the maximum is bracketed in [known_fit, known_fail) already, and only
    known_fit is measured for this rung. With
    target_first the ceiling is probed first (one probe settles the rung as a lower bound);
    otherwise, and when it fails, S doubles from the longest fit (to at least a.rung_start) or
    from `start` until a failure, then bisects between the longest fit and the shortest failure
    until the gap is at most max(quantum, resolution x fit)."""
    q = a.quantum
    rung_start = getattr(a, "rung_start", 0)
    probes = {}
    lo, hi = known_fit, None

    def probe(seq):
        if seq not in probes:
            probes[seq] = at(seq)
        return probes[seq]

    def result(status):
        if lo is None:
            return RungResult(0, None, hi, status if status == "budget" else "none",
                              list(probes.values()))
        if lo not in probes:
            status = "inherited"
        return RungResult(lo, probes.get(lo), hi, status, list(probes.values()))

    try:
        if target_first:
            if probe(ceiling).fit:
                lo = ceiling
                return result("ceiling")
            hi = ceiling
        elif lo and known_fail and lo < known_fail <= ceiling and known_fail >= rung_start:
            if probe(known_fail).fit:
                lo = known_fail
                if lo >= ceiling:
                    return result("ceiling")
            else:
                hi = known_fail
        if hi is None:  # grow: double from the lower bound until a failure or the ceiling
            seq = min(max(lo * 2 // q * q, rung_start), ceiling) if lo else start
            while True:
                if probe(seq).fit:
                    lo = seq
                    if seq >= ceiling:
                        return result("ceiling")
                    seq = min(seq * 2 // q * q, ceiling)
                else:
                    hi = seq
                    break
        while True:
            bottom = lo if lo is not None else 0
            if lo is not None and hi - lo <= max(q, a.resolution * lo):
                if lo in probes:
                    return result("max")
                # The search ended on the rung below's fit: measure it for this rung.
                if probe(lo).fit:
                    return result("max")
                hi, lo = lo, None  # it does not hold here after all: search below it
                continue
            mid = (bottom + hi) // 2 // q * q
            if lo is None and mid < start:
                mid = start
            if mid <= bottom or mid >= hi:
                if lo is None:
                    return result("none")
                return result("max")
            if probe(mid).fit:
                lo = mid
            else:
                hi = mid
    except TimeoutError:
        print("  (--deadline_s %.0f passed: the search stops here)" % a.deadline_s, flush=True)
        return result("budget")


def breakdown(a, runs, seq, rungs, t_start, found):
    """Every rung at the baseline's largest S, uncapped: what holds the baseline's bytes."""
    print("\n== measured breakdown at the baseline's max S=%d (no cap; peak RSS of the larger "
          "rank, ru_maxrss) ==" % seq)
    rows = []
    for rung in RUNGS:  # in ladder order, whatever order the search ran them in
        if rung not in a.breakdown_rungs.split(",") or (rung not in rungs and
                                                          rung != "baseline"):
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
    target = (a.max_ratio if a.max_ratio > 0 else 16) * seq  # issue 13's target: 16x
    for rung in [r for r in RUNGS if r in rungs and r != "baseline"]:
        res = found.get(rung)
        if not res or not res.seq or res.status == "ceiling" or res.seq >= target:
            continue
        r = runs.results.get((rung, res.seq, "cap"))
        if r is None:
            continue
        falls_short(a, rung, res, r, target / seq)


def falls_short(a, rung, res, r, ratio):
    """Where the bytes of a rung that stops short of --max_ratio go, at its longest fit (its capped
    probe): the process at start, the model state the trainer tracks, and the rest (activations),
    next to each activation class's size from the shapes at that S."""
    seq = res.seq
    sp = 2 if RUNGS.index(rung) >= RUNGS.index("sp2") else 1
    n = seq // sp  # tokens a rank holds
    started = r.ranks[0].of("started")[0] if r.ranks and r.ranks[0].of("started") else {}
    rest = r.peak_rss - r.start_rss - r.tracker_peak
    v, h, i, l = a.vocab, a.hidden, a.intermediate, a.layers
    tile = a.loss_tile or max(1, (64 << 20) // (4 * v))
    print("\n== %s falls short of %gx: at its longest fit S=%d (capped probe) ==" % (
        rung, ratio, seq))
    print("  peak RSS %.1f MiB = start-up %.1f + tracked model state %.1f (params %.1f, grads "
          "%.1f, Adam %.1f, buffers %.1f at start) + the rest %.1f MiB (activations, allocator)"
          % (mib(r.peak_rss), mib(r.start_rss), mib(r.tracker_peak),
             mib(started.get("param_bytes", 0)), mib(started.get("grad_bytes", 0)),
             mib(started.get("optimizer_state_bytes", 0)), mib(started.get("buffer_bytes", 0)),
             mib(rest)))
    print("  shapes, fp32, %d tokens a rank: checkpointed layer inputs [%d, %d] x %d layers "
          "%.1f MiB; one layer's recompute (q, k, v, attention output, their gradients: ~8 x "
          "[%d, %d]) %.1f MiB; a loss tile [%d, %d] x 3 %.1f MiB; untiled MLP [%d, %d] x 4 "
          "%.1f MiB" % (n, n, h, l, mib(l * n * h * 4), n, h, mib(8 * n * h * 4), tile, v,
                        mib(3 * tile * v * 4), n, i, mib(4 * n * i * 4)))


if __name__ == "__main__":
    main()
