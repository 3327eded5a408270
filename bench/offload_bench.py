#!/opt/loom/venv/bin/python3
"""Shared pieces of the offload benchmarks (bench/zenflow_bench.py, bench/superoffload_bench.py):
the model/shape flags, the job spec both systems of a pair run, one loom-trainer gang run with
its failure check, and the per-step medians read from its step events.

Both benches compare a technique against Loom's synchronous ZeRO-Offload on the same spec; only
`zero_optimization` differs between the two runs of a pair, so the spec is built here once.
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gang  # noqa: E402

# examples/fortunes-llama (its config.json, ds_config.json): 2 ranks x 1 thread, ZeRO-3, hidden
# 384, intermediate 1024, 4 layers, 6/2 heads, tied embeddings, micro-batch 8 x seq 128.
EXAMPLE = {"world": 2, "threads": 1, "stage": 3, "hidden": 384, "intermediate": 1024,
           "layers": 4, "heads": 6, "kv_heads": 2, "tie": True, "micro": 8, "seq": 128,
           "vocab": 256}


def add_shape_flags(p, threads=1, stage=2, steps=40, skip=5, repeats=3):
    """The flags both benches share (model shape, ranks, steps, the trainer and its flags)."""
    p.add_argument("--trainer", required=True)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--threads", type=int, default=threads, help="threads per rank (both systems)")
    p.add_argument("--stage", type=int, default=stage)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1376)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=0, help="0 = --heads")
    p.add_argument("--vocab", type=int, default=256, help="vocab_size (byte tokens: >= 256)")
    p.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    p.add_argument("--example", action="store_true",
                   help="examples/fortunes-llama's shape: 2 ranks x 1 thread, stage 3, hidden 384, "
                        "intermediate 1024, 4 layers, 6/2 heads, tied, micro-batch 8 x seq 128")
    p.add_argument("--micro", type=int, default=1)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--skip", type=int, default=skip, help="steps left out of the medians")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--workdir", default="")
    p.add_argument("--trainer_arg", action="append", default=[],
                   help="extra loom-trainer flag for both systems (repeatable), e.g. "
                        "--trainer_arg=--malloc_mmap_threshold_bytes=33554432")


def apply_example(a):
    """--example: overrides the shape flags with examples/fortunes-llama's."""
    if a.example:
        for k, v in EXAMPLE.items():
            setattr(a, k, v)
    if a.vocab < 256:
        raise SystemExit("--vocab: %d is below the byte tokenizer's 256" % a.vocab)


def param_count(a):
    """Llama parameters of the shape flags (embedding, untied lm_head, layers, final norm)."""
    kv = a.hidden * (a.kv_heads or a.heads) // a.heads
    return (1 if a.tie else 2) * a.vocab * a.hidden + a.layers * (
        2 * a.hidden + 2 * a.hidden * a.hidden + 2 * a.hidden * kv +
        3 * a.hidden * a.intermediate) + a.hidden


def shapes(a):
    """One line naming the shape, for the bench's header."""
    return ("%d layers, hidden %d, intermediate %d, heads %d/%d, vocab %d%s (%d params); "
            "micro-batch %d x seq %d, GAS 1, %d rank(s) x %d threads, stage %d; %d steps "
            "(first %d left out), %d repeats"
            % (a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads or a.heads, a.vocab,
               ", tied" if a.tie else "", param_count(a), a.micro, a.seq, a.world, a.threads,
               a.stage, a.steps, a.skip, a.repeats))


def write_spec(path, a, name, zero, clip, training):
    """The job spec of one run: the shape flags' model on fortunes (byte tokens), AdamW at --lr
    with weight decay 0.01, `zero` as zero_optimization, `clip` as gradient_clipping, and
    `training` merged over {sequence_length, steps, seed, threads_per_rank}."""
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": a.vocab, "hidden_size": a.hidden,
           "intermediate_size": a.intermediate, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads or a.heads,
           "max_position_embeddings": max(512, a.seq), "tie_word_embeddings": a.tie,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "initializer_range": 0.02}
    t = {"sequence_length": a.seq, "steps": str(a.steps), "seed": "1",
         "threads_per_rank": a.threads}
    t.update(training)
    s = {"name": name, "model": {"config": cfg},
         "dataset": {"name": "fortunes", "tokenizer": "byte"},
         "deepspeed_config": {
             "train_micro_batch_size_per_gpu": a.micro, "gradient_accumulation_steps": 1,
             "gradient_clipping": clip,
             "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.01}},
             "zero_optimization": zero},
         "training": t}
    with open(path, "w") as f:
        json.dump(s, f)
    return path


def offload_zero(a):
    """zero_optimization of synchronous ZeRO-Offload at the shape flags' stage."""
    zero = {"stage": a.stage, "overlap_comm": a.stage != 1, "offload_optimizer": {"device": "cpu"}}
    if a.stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return zero


def run_gang(a, name, spec_path):
    """Runs one gang on spec_path; returns its ranks (gang.run_loom) and the wall seconds.
    Raises RuntimeError naming the run and its log directory when a rank fails or reports no
    done event."""
    t0 = time.time()
    ranks = gang.run_loom(a.trainer, spec_path, a.world, os.path.join(a.workdir, name),
                          extra=a.trainer_arg, timeout_s=a.timeout)
    ok = all(r.returncode == 0 for r in ranks) and all(r.of("done") for r in ranks)
    if not ok:
        errs = [e.get("message") for r in ranks for e in r.of("error")]
        raise RuntimeError("%s failed: %s (exit codes %s; logs under %s)"
                           % (name, errs, [r.returncode for r in ranks], a.workdir))
    return ranks, time.time() - t0


def run_spec(a, name, spec_path):
    """Runs one gang on spec_path (run_gang); returns (rank 0's step events after --skip, all
    of them, rank 0's done event, wall seconds)."""
    ranks, wall = run_gang(a, name, spec_path)
    all_steps = ranks[0].of("step")
    if len(all_steps) <= a.skip:
        raise RuntimeError("%s: %d steps, none left after --skip %d"
                           % (name, len(all_steps), a.skip))
    return all_steps[a.skip:], all_steps, ranks[0].of("done")[0], wall


def median_of(steps, key):
    """Median of one step-event field over `steps` (0 where a step lacks it)."""
    return statistics.median(e.get(key, 0.0) for e in steps)


def median_run(runs, key):
    """Median over runs (dicts) of one of their fields."""
    return statistics.median(r[key] for r in runs)


def spread(runs, key):
    """'a/b/c' of one field over the runs, in run order."""
    return "/".join("%.4f" % r[key] for r in runs)


def load_average():
    """The 1-minute load average now (the machine is shared: printed next to every figure)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")
