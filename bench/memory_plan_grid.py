#!/opt/loom/venv/bin/python3
"""Admission against measured memory (issue 48): no false admit, and every refusal's suggestion
trains.

Before each run the page cache is dropped (a cold node: see drop_page_cache). For each job of a grid of real CPU-rank jobs (two model sizes; ZeRO stages 0-3; 1-2 ranks;
activation checkpointing; CPU optimizer offload, ZenFlow and SuperOffload; bf16; sequence
parallelism and ALST's tiling; sequences of 256 and 1024 tokens):

  * admitted at the tightest node: `loomctl plan JOB --json` gives one rank's predicted host
    bytes; the smallest node memory admission accepts for it is that times (1 + the admission
    margin, from the same JSON). Every rank runs in its own cgroup (bench/memory_cap.py) capped
    at exactly that. A "false admit" is a rank the kernel OOM-kills there (or that fails): the
    planner said it fits a node it does not fit. The cgroup's peak charge is the measured peak.
  * refused, then as suggested: the same job on a node of 85% of that memory, which admission
    refuses; `loomctl plan JOB --nodes=W:1:GIB --json` gives the refusal's suggestion as settings
    ("PATH: VALUE"), written into the spec here, and the changed job must be admitted
    (`loomctl plan` says it fits) and train under that smaller cap.

Needs root and a writable cgroup v1 memory controller (memory_cap.available()); prints the table
(markdown) and exits 1 on a false admit or a suggestion that does not train.

Usage: bench/memory_plan_grid.py [--trainer PATH] [--loomctl PATH] [--workdir DIR]
       [--only NAME,...] [--no-suggestions]
"""
import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gang  # noqa: E402
import memory_cap  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
STEPS = 3
# The refusal runs' node: this fraction of the tightest memory admission accepts.
REFUSED_NODE_FRACTION = 0.85


def base_spec(hidden, intermediate, layers, heads, kv_heads, seq):
    return {
        "name": "memory-plan-grid",
        "model": {"config": {"architectures": ["LlamaForCausalLM"], "vocab_size": 256,
                             "hidden_size": hidden, "intermediate_size": intermediate,
                             "num_hidden_layers": layers, "num_attention_heads": heads,
                             "num_key_value_heads": kv_heads, "max_position_embeddings": 2048,
                             "tie_word_embeddings": False}},
        "dataset": {"name": "fortunes", "tokenizer": "byte"},
        "deepspeed_config": {
            "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 2}},
        "resources": {"num_ranks": 1},
        "training": {"sequence_length": seq, "seed": 7, "steps": STEPS,
                     "eval_batches": 1, "eval_every_steps": 0},
    }


def job(name, stage, world, model="small", seq=256, ckpt=False, offload=None, bf16=False,
        sp=1, tiled=False, micro=2):
    """One grid job: (name, spec dict, world size)."""
    if model == "small":  # 7.3M parameters
        spec = base_spec(384, 1024, 4, 6, 2, seq)
    elif model == "wide":  # 29M parameters
        spec = base_spec(768, 2048, 4, 12, 4, seq)
    else:  # "deep": 85M parameters, model states 1.3 GiB a rank unsharded
        spec = base_spec(768, 2048, 12, 12, 4, seq)
    ds = spec["deepspeed_config"]
    ds["zero_optimization"]["stage"] = stage
    ds["train_micro_batch_size_per_gpu"] = micro
    if ckpt:
        ds["activation_checkpointing"] = {}
    if offload in ("cpu", "zenflow", "superoffload"):
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if offload == "zenflow":
        ds["zero_optimization"]["zenflow"] = {"topk_ratio": 0.1, "update_interval": 4,
                                              "overlap_step": True}
    if offload == "superoffload":
        ds["zero_optimization"]["offload_optimizer"]["super_offload"] = True
    if bf16:
        ds["bf16"] = {"enabled": True}
    if sp > 1:
        ds["sequence_parallel_size"] = sp
    if tiled:
        spec["training"]["tiled_mlp_compute"] = True
        spec["training"]["tiled_logits_loss"] = True
    spec["resources"]["num_ranks"] = world
    return name, spec, world


GRID = [
    job("z0_n1", 0, 1),
    job("z1_n2", 1, 2),
    job("z2_n1", 2, 1),
    job("z2_n1_ckpt", 2, 1, ckpt=True),
    job("z2_n2", 2, 2),
    job("z3_n2", 3, 2),
    job("z3_n2_ckpt", 3, 2, ckpt=True),
    job("z2_n1_s1024", 2, 1, seq=1024),
    job("z2_n1_s1024_ckpt", 2, 1, seq=1024, ckpt=True),
    job("z2_n1_offload", 2, 1, offload="cpu"),
    job("z3_n2_offload", 3, 2, offload="cpu"),
    job("z2_n1_zenflow", 2, 1, offload="zenflow"),
    job("z3_n1_superoffload", 3, 1, offload="superoffload"),
    job("z2_n1_bf16", 2, 1, bf16=True),
    job("z3_n2_sp2_s1024", 3, 2, seq=1024, sp=2),
    job("z2_n1_s1024_tiled", 2, 1, seq=1024, tiled=True),
    job("wide_z0_n1", 0, 1, model="wide"),
    job("wide_z2_n2", 2, 2, model="wide"),
    job("wide_z3_n2_ckpt_s1024", 3, 2, model="wide", seq=1024, ckpt=True),
    job("deep_z0_n1", 0, 1, model="deep"),
    job("deep_z1_n2", 1, 2, model="deep"),
    job("deep_z2_n2", 2, 2, model="deep"),
    job("deep_z3_n2", 3, 2, model="deep"),
]


def apply_setting(spec, setting):
    """Writes one "PATH: VALUE" setting (spec/job_spec_settings.h's form) into the spec dict:
    VALUE is YAML, read as loomctl reads a job document; objects on the way are created."""
    path, sep, value = setting.partition(": ")
    if not sep:
        raise ValueError("setting %r is not 'PATH: VALUE'" % setting)
    keys = path.split(".")
    at = spec
    for k in keys[:-1]:
        at = at.setdefault(k, {})
    v = yaml.safe_load(value)
    at[keys[-1]] = {} if v is None and value.strip() == "{}" else v
    if keys == ["resources", "num_ranks"]:
        at[keys[-1]] = int(v)


def plan(loomctl, spec_path, nodes=None):
    args = [loomctl, "plan", spec_path, "--json"] + (["--nodes=" + nodes] if nodes else [])
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), p.stderr.strip()))
    return json.loads(p.stdout)


def drop_page_cache():
    """A cold node: the libraries' pages the ranks map are then charged to their own groups (in
    cgroup v1 a cached page stays charged to the group that first read it)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def run_capped(a, name, spec, world, cap_bytes):
    """Runs the gang with every rank capped at cap_bytes; returns a dict of what happened."""
    if a.cold:
        drop_page_cache()
    path = os.path.join(a.workdir, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f, indent=2)
    caps = [memory_cap.MemoryCap("loom-plan-grid-%d-%s-r%d" % (os.getpid(), name, r), cap_bytes)
            for r in range(world)]
    try:
        ranks = gang.run_loom(a.trainer, path, world, os.path.join(a.workdir, name), caps=caps,
                              timeout_s=600)
        oom = sum(c.oom_kills() for c in caps)
        peaks = [c.peak_bytes() for c in caps]
    finally:
        for c in caps:
            c.remove()
    steps = [len(r.of("step")) for r in ranks]
    ok = (not oom and len(ranks) == world and all(r.returncode == 0 for r in ranks)
          and all(s == STEPS for s in steps))
    why = "ok" if ok else ("OOM-killed (%d)" % oom if oom else
                           "exit %s, steps %s" % ([r.returncode for r in ranks], steps))
    return {"ok": ok, "why": why, "peaks": peaks, "vmhwm": [r.maxrss_bytes for r in ranks]}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainer", default=os.path.join(root, "bazel-bin/worker/trainer/loom-trainer"))
    p.add_argument("--loomctl", default=os.path.join(root, "bazel-bin/services/cli/loomctl"))
    p.add_argument("--workdir", default="")
    p.add_argument("--only", default="", help="comma-separated job names")
    p.add_argument("--no-suggestions", action="store_true")
    p.add_argument("--warm", dest="cold", action="store_false",
                   help="keep the page cache between runs (default: drop it before each run)")
    a = p.parse_args()
    if not memory_cap.available():
        sys.exit("memory_plan_grid: needs root and a writable cgroup v1 memory controller "
                 "(%s)" % memory_cap.ROOT)
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="loom-plan-grid-")
    os.makedirs(a.workdir, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    failures = []
    rows = ["| job | plan MiB | node (cap) MiB | cgroup peak MiB | VmHWM MiB | plan vs VmHWM | "
            "admitted run |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    srows = ["| job | node (cap) MiB | suggestion | plan after MiB | run |",
             "| --- | --- | --- | --- | --- |"]
    for name, spec, world in GRID:
        if only and name not in only:
            continue
        path = os.path.join(a.workdir, name + ".json")
        with open(path, "w") as f:
            json.dump(spec, f, indent=2)
        pl = plan(a.loomctl, path)
        host = pl["host"]["total_bytes"]
        margin = pl["admission_margin"]
        node = math.ceil(host * (1 + margin))  # spec/memory_fit.h WithAdmissionMargin
        r = run_capped(a, name, spec, world, node)
        hwm = max(r["vmhwm"])
        rows.append("| %s | %.1f | %.1f | %s | %s | %+.1f%% | %s |" % (
            name, host / MiB, node / MiB, " / ".join("%.1f" % (x / MiB) for x in r["peaks"]),
            " / ".join("%.1f" % (x / MiB) for x in r["vmhwm"]), 100 * (host - hwm) / hwm,
            r["why"]))
        print(rows[-1], flush=True)
        if not r["ok"]:
            failures.append("%s: admitted at %.1f MiB but %s" % (name, node / MiB, r["why"]))
        if a.no_suggestions:
            continue
        small = int(node * REFUSED_NODE_FRACTION)
        nodes = "%d:1:%.6f" % (world, small / GiB)
        refused = plan(a.loomctl, path, nodes)
        if refused.get("fits", True):
            failures.append("%s: a %.1f MiB node was not refused" % (name, small / MiB))
            continue
        suggestion = refused.get("suggestion")
        if not suggestion:
            srows.append("| %s | %.1f | none found | | |" % (name, small / MiB))
            print(srows[-1], flush=True)
            continue
        changed = copy.deepcopy(spec)
        for setting in suggestion["settings"]:
            apply_setting(changed, setting)
        cname = name + "_suggested"
        cpath = os.path.join(a.workdir, cname + ".json")
        with open(cpath, "w") as f:
            json.dump(changed, f, indent=2)
        cworld = changed["resources"]["num_ranks"]
        after = plan(a.loomctl, cpath, "%d:1:%.6f" % (cworld, small / GiB))
        if not after.get("fits"):
            failures.append("%s: the suggestion %r applied is still refused: %s" % (
                name, suggestion["change"], after.get("refusal")))
            continue
        cr = run_capped(a, cname, changed, cworld, small)
        srows.append("| %s | %.1f | `%s` | %.1f | %s (peak %s MiB) |" % (
            name, small / MiB, suggestion["change"], after["host"]["total_bytes"] / MiB, cr["why"],
            " / ".join("%.1f" % (x / MiB) for x in cr["peaks"])))
        print(srows[-1], flush=True)
        if not cr["ok"]:
            failures.append("%s: the suggestion %r under %.1f MiB: %s" % (
                name, suggestion["change"], small / MiB, cr["why"]))
    print("\nAdmitted at the tightest node admission accepts (one rank per node):\n")
    print("\n".join(rows))
    if not a.no_suggestions:
        print("\nRefused at %d%% of that node, then as suggested:\n" %
              round(100 * REFUSED_NODE_FRACTION))
        print("\n".join(srows))
    print("\nlogs and specs: %s" % a.workdir)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("\nno false admit; every suggestion trained")


if __name__ == "__main__":
    main()
