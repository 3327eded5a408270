#!/opt/loom/venv/bin/python3
"""Profiles one Loom ZeRO run of bench/zero_bench.py's shape with `perf record -g` on rank 0.

  /opt/loom/venv/bin/python3 bench/zero_bench_profile.py --stage 1 --steps 6 \
      [--trainer bazel-bin/worker/trainer/loom-trainer] [--layers 8] [--workdir /tmp/loom_zero_prof]

Same model, spec and environment as zero_bench.py's loom_zero<stage> row (2 ranks, 1 thread per
rank, buckets of 6,553,600 elements). Writes <workdir>/zero<stage>.rank0.perf.data, prints each
step's step_time_s / comm_s / optimizer_s, then the top of
`perf report --no-children --sort dso,symbol`. Rank 1 runs without perf.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gang  # noqa: E402
import zero_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trainer", default="bazel-bin/worker/trainer/loom-trainer")
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--frequency", type=int, default=250, help="perf samples per second")
    ap.add_argument("--workdir", default="/tmp/loom_zero_prof")
    ap.add_argument("--top", type=int, default=30, help="lines of the report to print")
    p = ap.parse_args()
    a = argparse.Namespace(world=2, threads=1, hidden=1024, intermediate=2816, heads=16,
                           kv_heads=4, vocab=8192, seq=128, micro=1, sub_group_size=4000000,
                           bucket=6553600, max_live=16000000, timeout=1800, warmup=2)
    os.makedirs(p.workdir, exist_ok=True)
    name = "zero%d" % p.stage
    data = os.path.join(p.workdir, name + ".rank0.perf.data")
    wrapper = os.path.join(p.workdir, "perf_rank0.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/bash\nif [[ " $* " == *" --rank=0 "* ]]; then\n'
                '  exec perf record -F %d -g -o %s -- %s "$@"\nfi\nexec %s "$@"\n'
                % (p.frequency, data, os.path.abspath(p.trainer), os.path.abspath(p.trainer)))
    os.chmod(wrapper, 0o755)
    spec = zero_bench.loom_spec(os.path.join(p.workdir, name + ".json"),
                                zero_bench.model_config(p.layers, a), a, p.stage, p.steps)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    ranks = gang.run_loom(wrapper, spec, 2, os.path.join(p.workdir, name), timeout_s=1800,
                          env=env)
    for e in ranks[0].of("step"):
        print("step %d step_time_s %.3f comm_s %.3f optimizer_s %.3f" % (
            e["step"], e["step_time_s"], e.get("comm_s", 0), e.get("optimizer_s", 0)))
    print("exit codes", [r.returncode for r in ranks])
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort",
                             "dso,symbol", "--stdio", "-g", "none"],
                            capture_output=True, text=True).stdout
    lines = [l for l in report.splitlines() if "%" in l and not l.startswith("#")]
    print("\n".join(lines[:p.top]))


if __name__ == "__main__":
    main()
