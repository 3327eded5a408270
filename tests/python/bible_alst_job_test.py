#!/opt/loom/venv/bin/python3
"""A short run of examples/bible-alst (Ulysses sequence parallelism, issue 13) through loom-trainer.

Usage: /opt/loom/venv/bin/python3 bible_alst_job_test.py --trainer PATH --consolidate PATH
           --check_export PATH --example_dir DIR

1. The example as written (2 ranks, sequence_parallel_size 2, 2,048-token samples, ZeRO-3) on the
   King James Bible printed by the example's make_corpus.sh, shortened to 3 steps: it trains
   (finite losses, one sequence-parallel group), loom-consolidate exports it, and
   check_export.py (the project venv's torch 2.11, independent of Loom) accepts the export against the
   trainer's final logits.
2. The ALST correctness recipe (docs/design/TECHNIQUES.md §3.7 #6): the same model and samples as
   (DP=2, SP=1, GAS=1) and as (DP=1, SP=2, GAS=2), 256-token samples, 4 steps: the step losses
   and gradient norms agree (|a-b| <= 1e-4 |b|; fp32 with different reduction orders).
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_gang  # noqa: E402
from trainer_gang import steps_of  # noqa: E402

WORLD = 2


def spec_from_example(example_dir, corpus, **training):
    job, config, ds = trainer_gang.load_example(example_dir)
    dataset = dict(job["dataset"], path=corpus)
    train = dict(job["training"], eval_batches=1, eval_every_steps=0, **training)
    return {"name": job["name"], "model": {"config": config}, "dataset": dataset,
            "deepspeed_config": ds, "training": train,
            "checkpoint": {"interval_steps": train["steps"]}}


def run_trainer(trainer, spec, tmp, name, deadline_s=900):
    spec_path = trainer_gang.write_spec(spec, os.path.join(tmp, f"{name}.json"))
    ckpt = os.path.join(tmp, f"{name}_ckpt")
    _, events = trainer_gang.run_gang(trainer, spec_path, WORLD, ckpt=ckpt, deadline_s=deadline_s)
    return events, ckpt


def main():
    ap = argparse.ArgumentParser()
    for a in ("--trainer", "--consolidate", "--check_export", "--example_dir"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    corpus = os.path.join(tmp, "bible-kjv.txt")
    subprocess.run(["bash", os.path.join(args.example_dir, "make_corpus.sh"), corpus], check=True,
                   timeout=300)

    # 1. The example: SP=2 at its sequence length, trained, exported and checked.
    spec = spec_from_example(args.example_dir, corpus, steps=3)
    assert spec["deepspeed_config"]["sequence_parallel_size"] == 2
    assert spec["training"]["sequence_length"] >= 16 * 128, spec["training"]
    events, ckpt = run_trainer(args.trainer, spec, tmp, "example")
    steps = steps_of(events)
    assert [s["step"] for s in steps] == [1, 2, 3], events[-3:]
    assert all(math.isfinite(s["loss"]) and s["loss"] > 0 for s in steps), steps
    print("example losses:", [round(s["loss"], 4) for s in steps])
    out = os.path.join(tmp, "export")
    r = subprocess.run([args.consolidate, f"--checkpoint_dir={ckpt}", f"--output_dir={out}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["/opt/loom/venv/bin/python3", args.check_export, "--model_dir", out, "--logits",
                        os.path.join(ckpt, "final_logits.json")],
                       capture_output=True, text=True, timeout=600)
    print(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr

    # 2. (DP=2, SP=1, GAS=1) and (DP=1, SP=2, GAS=2) on the same samples.
    runs = {}
    for name, sp, gas in (("dp2", 1, 1), ("sp2", 2, 2)):
        s = spec_from_example(args.example_dir, corpus, steps=4, sequence_length=256)
        s["deepspeed_config"].update(sequence_parallel_size=sp, gradient_accumulation_steps=gas)
        runs[name] = steps_of(run_trainer(args.trainer, s, tmp, name)[0])
    for a, b in zip(runs["sp2"], runs["dp2"]):
        for key in ("loss", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-4 * abs(b[key]), (key, a, b)
    assert len(runs["sp2"]) == len(runs["dp2"]) == 4
    print("losses (DP=2,SP=1,GAS=1):", [s["loss"] for s in runs["dp2"]])
    print("losses (DP=1,SP=2,GAS=2):", [s["loss"] for s in runs["sp2"]])
    print("bible_alst_job_test: OK")


if __name__ == "__main__":
    sys.exit(main())
