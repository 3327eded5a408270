#!/opt/loom/venv/bin/python3
"""Measured capacity: the largest model a system trains under a per-rank memory cap.

Each probe runs the system's gang with every rank in its own cgroup capped at the same bytes
(bench/memory_cap.py). A model size fits only if every rank exits 0 after at least
`min_steps` optimizer steps with finite losses and the kernel OOM-killed nothing in any rank's
group. The model grows in depth at fixed width; the search doubles the depth from `start` until a
probe fails, then bisects between the last fit and the first failure, so the answer is the
deepest model that fit, measured, never a line through smaller runs.
"""
import math
import os

import memory_cap


class Probe:
    def __init__(self, layers, params, fit, reason, peak_bytes, seconds):
        self.layers = layers
        self.params = params
        self.fit = fit
        self.reason = reason
        self.peak_bytes = peak_bytes  # the largest rank's cgroup peak charge
        self.seconds = seconds


def probe(system, layers, params, cap_bytes, world, run, min_steps):
    """run(name, layers, caps) -> bench Result; returns a Probe."""
    import time
    caps = [memory_cap.MemoryCap("loom-bench-%d-%s-L%d-r%d" % (os.getpid(), system, layers, r),
                                 cap_bytes) for r in range(world)]
    t0 = time.time()
    try:
        result = run("%s_cap_L%d" % (system, layers), layers, caps)
        oom = sum(c.oom_kills() for c in caps)
        peak = max(c.peak_bytes() for c in caps)
    finally:
        for c in caps:
            c.remove()
    seconds = time.time() - t0
    steps = result.ranks[0].of("step") if result.ranks else []
    losses = [e.get("loss") for e in steps]
    if oom:
        return Probe(layers, params, False, "OOM-killed (%d)" % oom, peak, seconds)
    if not result.ok:
        return Probe(layers, params, False, "failed: %s" % result.error, peak, seconds)
    if len(steps) < min_steps:
        return Probe(layers, params, False, "only %d steps" % len(steps), peak, seconds)
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        return Probe(layers, params, False, "non-finite loss %s" % losses, peak, seconds)
    return Probe(layers, params, True, "fit", peak, seconds)


def search(system, cap_bytes, world, run, param_count, start=1, max_layers=512, min_steps=3,
           log=print, quantum=1, resolution=0.0, describe=None):
    """Returns (largest fitting Probe or None, list of every Probe run).

    The searched size is `layers` here; bench/alst_search.py searches the sequence length with
    the same code: `quantum` (default 1) is the step every probed size is a multiple of (the
    bisection's midpoint is rounded down to it), and the bisection stops once the gap between
    the largest fit and the smallest failure is at most max(quantum, resolution * fit).
    describe(probe) -> str replaces the "L=... params" part of each log line."""
    probes = {}

    def at(layers):
        if layers not in probes:
            p = probe(system, layers, param_count(layers), cap_bytes, world, run, min_steps)
            probes[layers] = p
            what = describe(p) if describe else "L=%-4d %8.1fM params" % (layers, p.params / 1e6)
            log("  %-10s %s: %-4s peak %6.0f MiB  (%s, %.0f s)" % (
                system, what, "fits" if p.fit else "no", p.peak_bytes / 2**20, p.reason,
                p.seconds))
        return probes[layers]

    lo, hi = None, None  # deepest fit, shallowest failure
    layers = start
    while layers <= max_layers:
        if at(layers).fit:
            lo = layers
            layers *= 2
        else:
            hi = layers
            break
    if lo is None:
        return None, list(probes.values())
    if hi is None:
        return probes[lo], list(probes.values())  # fit up to max_layers: a lower bound
    while hi - lo > max(quantum, resolution * lo):
        mid = (lo + hi) // 2 // quantum * quantum
        if mid <= lo:
            break
        if at(mid).fit:
            lo = mid
        else:
            hi = mid
    return probes[lo], list(probes.values())
