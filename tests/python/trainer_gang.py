"""Shared helpers of the Python tests that run loom-trainer as a user's job would: a gang of
`world` rank processes on loopback, rank 0's event stream, and the job spec of an example.

run_gang starts rank 0 with --master_port=0, reads its loom.TrainerEvent lines (stdout, one JSON
object per line, proto/trainer_events.proto) on a thread, starts ranks 1..world-1 on the port of
its "rendezvous" event, and waits for every rank with one deadline; on timeout every rank is
killed and AssertionError raised. Used by bible_alst_job_test.py, sentencepiece_job_test.py,
token_file_job_test.py, check_export_test.py and qwen2_job_test.py.
"""

import json
import os
import subprocess
import threading
import time


def flat(event):
    """A loom.TrainerEvent ({"<kind>": {fields}}, int64 as strings; a line or a parsed dict) as
    {"event": kind, field: value, ...} with integer strings as ints."""
    if isinstance(event, str):
        event = json.loads(event)
    (kind, fields), = event.items()
    out = {"event": kind}
    for k, v in fields.items():
        out[k] = int(v) if isinstance(v, str) and k != "message" and v.lstrip("-").isdigit() else v
    return out


def load_example(example_dir):
    """(job.yaml, its model config.json, its ds_config.json) of an examples/<name> directory."""
    import yaml  # only the example-driven tests need PyYAML
    with open(os.path.join(example_dir, "job.yaml")) as f:
        job = yaml.safe_load(f)
    with open(os.path.join(example_dir, job["model"]["config"])) as f:
        config = json.load(f)
    with open(os.path.join(example_dir, job["deepspeed_config"])) as f:
        ds = json.load(f)
    return job, config, ds


def write_spec(spec, path):
    """Writes the trainer's JSON spec to `path`; returns path."""
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def run_gang(trainer, spec_path, world, ckpt=None, extra=lambda rank: [],
             collective_timeout_s=300, deadline_s=600, check=True):
    """Runs `world` loom-trainer ranks of `spec_path` to the end.

    extra(rank): more flags for that rank. Returns (return codes by rank, rank 0's events as
    flat() dicts). check: assert every rank exited 0 (naming rank 0's last events otherwise).
    """
    base = [trainer, f"--spec={spec_path}", f"--world_size={world}",
            f"--collective_timeout_s={collective_timeout_s}"]
    if ckpt is not None:
        base.append(f"--checkpoint_dir={ckpt}")
    rank0 = subprocess.Popen(base + ["--rank=0", "--master_port=0"] + list(extra(0)),
                             stdout=subprocess.PIPE, text=True)
    events, port_known = [], threading.Event()

    def read():
        for line in rank0.stdout:
            events.append(flat(line))
            if events[-1]["event"] == "rendezvous":
                port_known.set()
        port_known.set()  # EOF: rank 0 exited (before its rendezvous if no port was seen)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    procs = [rank0]
    end = time.time() + deadline_s
    try:
        if world > 1:
            assert port_known.wait(timeout=deadline_s), "no rendezvous event before the deadline"
            ports = [e["port"] for e in events if e["event"] == "rendezvous"]
            assert ports, f"rank 0 exited {rank0.wait()} before its rendezvous event"
            for r in range(1, world):
                procs.append(subprocess.Popen(
                    base + [f"--rank={r}", f"--master_port={ports[0]}"] + list(extra(r)),
                    stdout=subprocess.DEVNULL))
        for p in procs:
            try:
                p.wait(timeout=max(1, end - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError("trainer did not finish before the deadline")
        reader.join(timeout=max(1, end - time.time()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    rcs = [p.returncode for p in procs]
    if check:
        assert all(rc == 0 for rc in rcs), f"trainer exit codes {rcs}: {events[-3:]}"
    return rcs, events


def steps_of(events):
    """The "step" events among flat() events."""
    return [e for e in events if e.get("event") == "step"]
