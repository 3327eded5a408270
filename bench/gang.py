#!/opt/loom/venv/bin/python3
"""Launches N ranks of a command as real processes and collects their JSON events and peak RSS.

Used by bench/zero_bench.py. Two kinds of gangs:
  * loom-trainer: rank 0 starts with --master_port=0 and reports {"rendezvous":{"port":P}}
    on stdout; the others start with that port. Its lines are loom.TrainerEvent messages in
    protobuf JSON (proto/trainer_events.proto), read here as flat {"event": kind, ...} dicts.
  * python peers (bench/torch_peer.py): every rank gets --master_port=<free port> up front.
Peak resident memory of each rank is ru_maxrss from wait4() (the kernel's VmHWM of that process).
"""
import json
import os
import re
import selectors
import socket
import subprocess
import sys
import time


# The free-text fields of loom.TrainerEvent (proto/trainer_events.proto). Every other string value
# in a loom-trainer event is an int64, which protobuf's JSON mapping writes as a string.
_TEXT_FIELDS = {"message", "dir", "collective_hash", "offload_optimizer", "offload_param"}


def flat_event(obj):
    """A loom-trainer line {"<kind>": {fields}} as {"event": "<kind>", fields} with int64 fields
    as ints; a python peer's line (already {"event": ...}) is returned as it is."""
    if not isinstance(obj, dict) or "event" in obj or len(obj) != 1:
        return obj
    (kind, fields), = obj.items()
    if not isinstance(fields, dict):
        return obj
    out = {"event": kind}
    for k, v in fields.items():
        if isinstance(v, str) and k not in _TEXT_FIELDS and re.fullmatch(r"-?[0-9]+", v):
            v = int(v)
        out[k] = v
    return out


class Rank:
    def __init__(self, rank, args, stderr_path, env=None, memory_cap=None):
        """memory_cap: a memory_cap.MemoryCap the process joins before exec (or None)."""
        self.rank = rank
        self.stderr = open(stderr_path, "wb")
        self.memory_cap = memory_cap
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
                                     preexec_fn=memory_cap.join_self if memory_cap else None)
        self.buf = b""
        self.events = []
        self.maxrss_bytes = None
        self.returncode = None

    def feed(self, data):
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                self.events.append(flat_event(json.loads(line)))
            except ValueError:
                sys.stderr.write("rank %d: non-JSON stdout: %r\n" % (self.rank, line[:200]))

    def of(self, kind):
        return [e for e in self.events if e.get("event") == kind]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _pump(ranks, timeout_s, until=None):
    sel = selectors.DefaultSelector()
    live = {}
    for r in ranks:
        if r.proc.stdout is not None and not r.proc.stdout.closed:
            sel.register(r.proc.stdout, selectors.EVENT_READ, r)
            live[r.rank] = r
    deadline = time.time() + timeout_s
    while live and time.time() < deadline:
        if until is not None and until():
            break
        for key, _ in sel.select(timeout=0.2):
            r = key.data
            data = os.read(key.fileobj.fileno(), 65536)
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                live.pop(r.rank, None)
            else:
                r.feed(data)
    sel.close()
    return not live


def _reap(ranks, timeout_s):
    deadline = time.time() + timeout_s
    for r in ranks:
        while r.returncode is None:
            pid, status, ru = os.wait4(r.proc.pid, os.WNOHANG)
            if pid == r.proc.pid:
                r.returncode = os.waitstatus_to_exitcode(status)
                r.maxrss_bytes = ru.ru_maxrss * 1024
                r.proc.returncode = r.returncode
                break
            if time.time() > deadline:
                r.proc.kill()
                deadline = time.time() + 10
            time.sleep(0.05)
        r.stderr.close()


def run_loom(trainer, spec, world, log_prefix, extra=(), timeout_s=600, env=None, caps=None):
    """Runs a loom-trainer gang; returns the list of Rank objects (finished).
    caps: one memory_cap.MemoryCap per rank, or None."""
    caps = caps or [None] * world
    def args(rank, port):
        return [trainer, "--spec=" + spec, "--rank=%d" % rank, "--world_size=%d" % world,
                "--master_port=%d" % port, "--collective_timeout_s=%d" % timeout_s] + list(extra)
    ranks = [Rank(0, args(0, 0), "%s.rank0.stderr" % log_prefix, env, caps[0])]
    if world > 1:
        _pump(ranks, 120, until=lambda: bool(ranks[0].of("rendezvous")))
        if not ranks[0].of("rendezvous"):
            _reap(ranks, 1)
            raise RuntimeError("rank 0 reported no rendezvous port; see %s.rank0.stderr"
                               % log_prefix)
        port = ranks[0].of("rendezvous")[0]["port"]
        for rank in range(1, world):
            ranks.append(Rank(rank, args(rank, port), "%s.rank%d.stderr" % (log_prefix, rank), env,
                              caps[rank]))
    finished = _pump(ranks, timeout_s)
    _reap(ranks, 5 if finished else 0)
    return ranks


def run_python(script, script_args, world, log_prefix, timeout_s=600, env=None, caps=None):
    """Runs a torch.distributed python gang (each rank its own process).
    caps: one memory_cap.MemoryCap per rank, or None."""
    caps = caps or [None] * world
    port = free_port()
    ranks = []
    for rank in range(world):
        a = ["/opt/loom/venv/bin/python3", script, "--rank=%d" % rank, "--world_size=%d" % world,
             "--master_port=%d" % port] + list(script_args)
        ranks.append(Rank(rank, a, "%s.rank%d.stderr" % (log_prefix, rank), env, caps[rank]))
    finished = _pump(ranks, timeout_s)
    _reap(ranks, 5 if finished else 0)
    return ranks
