#!/opt/loom/venv/bin/python3
"""Control-plane benchmark at cluster scale (docs/benchmarks.md, "Control plane at cluster scale").

For each node count: a real loom-scheduler daemon (its own process: SQLite store with
synchronous=FULL, Prometheus registry, checkpoint catalog on its checkpoint root, scheduling loop
every 200 ms, the production heartbeat timeout) and //services/scheduler:control_plane_loadgen in
a second process: N simulated nodes heartbeating over gRPC every second, a queue pre-filled with
--prefill jobs, then --duration_s seconds of measurement with --submit_rate submissions/s
arriving. Reported per node count:
  heartbeat p99 (client round trip, every heartbeat sent in the window),
  cycle p50 / p99 (exact percentiles of every scheduling cycle that ended in the window, from the
    daemon's --cycle_trace_file, at least --min_cycles of them),
  submit p99 (the paced submissions in the window),
  false node losses (every simulated node keeps heartbeating, so any node the scheduler counts
    lost -- loom_nodes{state="lost"} -- or forgot -- a NOT_FOUND heartbeat -- is false),
  pending (loom_jobs{phase="PENDING"} at the end of the window).
Line per node count:
  control_plane nodes=<n> pending=<m> heartbeat_p99_ms=<x> cycle_p99_ms=<y> submit_p99_ms=<z>
  false_node_losses=<k>
With --sweep, node counts keep doubling past the last one until a target breaks (heartbeat p99 >
50 ms, cycle p99 > 100 ms, a false node loss, or the generator falling behind).

Then submissions against Slurm (bench/slurm_peer.py), same client concurrency, --slurm_runs
times (each run a fresh daemon and a fresh slurmctld); the medians, after a spread line:
  submit_vs_slurm_spread runs=<r> ratio_min=<> ratio_max=<> loom_min=<> ...
  submit_vs_slurm ratio=<median loom/slurm> loom_per_s=<median> slurm_per_s=<median>
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def percentile(values, p):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def parse_kv(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def scrape(url):
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


class Scheduler:
    def __init__(self, binary, work_dir, heartbeat_timeout_s, fortunes_dir):
        self.dir = work_dir
        shutil.rmtree(work_dir, ignore_errors=True)
        os.makedirs(f"{work_dir}/checkpoints")
        self.trace = f"{work_dir}/cycles.trace"
        ready = f"{work_dir}/ready.json"
        self.log = open(f"{work_dir}/scheduler.log", "w")
        self.proc = subprocess.Popen(
            [binary, f"--db={work_dir}/jobs.db", f"--checkpoint_root={work_dir}/checkpoints",
             f"--ready_file={ready}", f"--cycle_trace_file={self.trace}",
             f"--heartbeat_timeout_s={heartbeat_timeout_s}", f"--fortunes_dir={fortunes_dir}",
             "--confine_paths=false",
             # It prefills thousands of jobs as one tenant (the per-tenant cap is 1000).
             "--max_unfinished_jobs_per_tenant=0"],
            stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 60
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"loom-scheduler did not start; see {work_dir}/scheduler.log")
            time.sleep(0.1)  # waiting for the daemon's ready file, with a deadline
        info = json.load(open(ready))
        self.address = info["grpc_address"]
        self.metrics_url = info["metrics_url"]

    def cycles(self, start_us, end_us, kind=None):
        """Cycle durations in ms; `kind`: only cycles whose admission pass was of that kind
        (1 skipped, 2 partial, 3 full: the trace's 4th column, Scheduler::AdmissionPassStats)."""
        out = []
        for line in open(self.trace):
            fields = [int(x) for x in line.split()]
            end, took = fields[0], fields[1]
            if kind is not None and (len(fields) < 4 or fields[3] != kind):
                continue
            if start_us <= end <= end_us:
                out.append(took / 1000.0)
        return out

    PHASES = ("checks", "resume_wait", "snapshot", "decide", "apply", "store")

    def phases(self, start_us, end_us):
        """Per phase, the ms of each cycle in the window (the trace's columns 5-10,
        Scheduler::CyclePhases); empty lists for a daemon that does not write them."""
        out = {name: [] for name in self.PHASES}
        for line in open(self.trace):
            fields = [int(x) for x in line.split()]
            if len(fields) < 10 or not start_us <= fields[0] <= end_us:
                continue
            for name, us in zip(self.PHASES, fields[4:10]):
                out[name].append(us / 1000.0)
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_loadgen(args, address, nodes, extra):
    cmd = [args.loadgen, f"--scheduler={address}", f"--nodes={nodes}"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise RuntimeError(f"control_plane_loadgen failed (exit {r.returncode})")
    last = [l for l in r.stdout.splitlines() if l.startswith("loadgen ")][-1]
    return parse_kv(last)


def one_scale(args, nodes):
    sched = Scheduler(args.scheduler, f"{args.work_dir}/n{nodes}", args.heartbeat_timeout_s,
                      f"{args.work_dir}/fortunes")
    try:
        lg = run_loadgen(args, sched.address, nodes, [
            f"--prefill={args.prefill}", f"--duration_s={args.duration_s}",
            f"--warmup_s={args.warmup_s}", f"--submit_rate={args.submit_rate}",
            f"--heartbeat_threads={args.heartbeat_threads}",
            f"--min_run_s={args.min_run_s}", f"--max_run_s={args.max_run_s}"])
        metrics = scrape(sched.metrics_url)
        window = (int(lg["window_start_us"]), int(lg["window_end_us"]))
        cycles = sched.cycles(*window)
        by_kind = {name: sched.cycles(*window, kind=k)
                   for k, name in ((1, "skipped"), (2, "partial"), (3, "full"))}
        phases = sched.phases(*window)
    finally:
        sched.stop()
    lost = int(metrics.get('loom_nodes{state="lost"}', 0))
    pending = int(metrics.get('loom_jobs{phase="PENDING"}', 0))
    running = int(metrics.get('loom_jobs{phase="RUNNING"}', 0))
    false_losses = lost + int(lg["not_found"])
    row = {
        "nodes": nodes, "pending": pending, "running": running,
        "heartbeats": int(lg["heartbeats"]), "heartbeat_p50_ms": float(lg["heartbeat_p50_ms"]),
        "heartbeat_p99_ms": float(lg["heartbeat_p99_ms"]),
        "heartbeat_max_ms": float(lg["heartbeat_max_ms"]),
        "late": int(lg["late_heartbeats"]), "hb_errors": int(lg["heartbeat_errors"]),
        "cycles": len(cycles), "cycle_p50_ms": percentile(cycles, 0.5),
        "cycle_p99_ms": percentile(cycles, 0.99), "cycle_max_ms": max(cycles) if cycles else 0,
        "submits": int(lg["submits"]), "submit_p99_ms": float(lg["submit_p99_ms"]),
        "false_node_losses": false_losses, "prefill_per_s": float(lg["prefill_per_s"]),
    }
    print(f"detail nodes={nodes} heartbeats={row['heartbeats']} "
          f"heartbeat_p50_ms={row['heartbeat_p50_ms']:.2f} "
          f"heartbeat_max_ms={row['heartbeat_max_ms']:.2f} late_heartbeats={row['late']} "
          f"heartbeat_errors={row['hb_errors']} cycles={row['cycles']} "
          f"cycle_p50_ms={row['cycle_p50_ms']:.2f} cycle_max_ms={row['cycle_max_ms']:.2f} "
          f"running={running} submits={row['submits']} prefill_per_s={row['prefill_per_s']:.0f} "
          f"load_avg={os.getloadavg()[0]:.2f}")
    print("detail admission_passes " + " ".join(
        f"{name}={len(v)} {name}_p50_ms={percentile(v, 0.5):.2f} "
        f"{name}_max_ms={max(v) if v else 0:.2f}" for name, v in by_kind.items()))
    if phases["checks"]:
        # Where a cycle's time goes (under the lock: checks, snapshot, decide, apply).
        print("detail cycle_phases " + " ".join(
            f"{name}_p50_ms={percentile(v, 0.5):.2f} {name}_p99_ms={percentile(v, 0.99):.2f}"
            for name, v in phases.items()))
    if len(cycles) < args.min_cycles:
        print(f"warning: only {len(cycles)} cycles in the window (< {args.min_cycles}); "
              "lengthen --duration_s")
    print(f"control_plane nodes={nodes} pending={pending} "
          f"heartbeat_p99_ms={row['heartbeat_p99_ms']:.2f} cycle_p99_ms={row['cycle_p99_ms']:.2f} "
          f"submit_p99_ms={row['submit_p99_ms']:.2f} false_node_losses={false_losses}",
          flush=True)
    return row


def holds(row):
    return (row["heartbeat_p99_ms"] <= 50 and row["cycle_p99_ms"] <= 100 and
            row["false_node_losses"] == 0 and row["late"] == 0 and row["hb_errors"] == 0)


def submission_run(args, run):
    sched = Scheduler(args.scheduler, f"{args.work_dir}/submit{run}", args.heartbeat_timeout_s,
                      f"{args.work_dir}/fortunes")
    try:
        lg = run_loadgen(args, sched.address, 0, [f"--prefill={args.loom_submissions}",
                                                  f"--submit_threads={args.client_threads}"])
    finally:
        sched.stop()
    loom_per_s = float(lg["submit_per_s"])
    from slurm_peer import SlurmPeer
    peer = SlurmPeer(f"{args.work_dir}/slurm{run}")
    try:
        peer.start()
        slurm_per_s, errors = peer.submit(args.slurm_submissions, args.client_threads)
    finally:
        peer.stop()
    if errors:
        print(f"warning: {errors} sbatch calls failed")
    print(f"detail run={run} loom_submissions={args.loom_submissions} "
          f"slurm_submissions={args.slurm_submissions} client_threads={args.client_threads} "
          f"loom_per_s={loom_per_s:.0f} slurm_per_s={slurm_per_s:.0f} "
          f"ratio={loom_per_s / slurm_per_s:.2f} load_avg={os.getloadavg()[0]:.2f}", flush=True)
    return loom_per_s, slurm_per_s


def submission_peer(args):
    """--slurm_runs alternating Loom / Slurm runs; the median ratio and its spread (min-max)."""
    runs = [submission_run(args, r) for r in range(args.slurm_runs)]
    ratios = sorted(l / s for l, s in runs)
    loom = sorted(l for l, _ in runs)
    slurm = sorted(s for _, s in runs)
    mid = len(runs) // 2
    if len(runs) > 1:
        print(f"submit_vs_slurm_spread runs={len(runs)} ratio_min={ratios[0]:.2f} "
              f"ratio_max={ratios[-1]:.2f} loom_min={loom[0]:.0f} loom_max={loom[-1]:.0f} "
              f"slurm_min={slurm[0]:.0f} slurm_max={slurm[-1]:.0f}")
    print(f"submit_vs_slurm ratio={ratios[mid]:.2f} loom_per_s={loom[mid]:.0f} "
          f"slurm_per_s={slurm[mid]:.0f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", default="bazel-bin/services/scheduler/loom-scheduler")
    ap.add_argument("--loadgen", default="bazel-bin/services/scheduler/control_plane_loadgen")
    ap.add_argument("--work_dir", default="/tmp/loom_control_plane_bench")
    ap.add_argument("--nodes", default="2000", help="comma-separated node counts")
    ap.add_argument("--sweep", action="store_true",
                    help="keep doubling the node count until a target breaks")
    ap.add_argument("--max_nodes", type=int, default=32000)
    ap.add_argument("--prefill", type=int, default=20000)
    ap.add_argument("--duration_s", type=int, default=60)
    ap.add_argument("--warmup_s", type=int, default=10)
    ap.add_argument("--submit_rate", type=float, default=20)
    ap.add_argument("--min_run_s", type=int, default=20,
                    help="shortest simulated job run time (the loadgen's flag)")
    ap.add_argument("--max_run_s", type=int, default=90,
                    help="longest simulated job run time: hours keep the prefilled queue "
                         "pending once the slots are full (the 20,000-pending point)")
    ap.add_argument("--heartbeat_threads", type=int, default=64)
    ap.add_argument("--heartbeat_timeout_s", type=int, default=40,
                    help="the daemon's production default")
    ap.add_argument("--min_cycles", type=int, default=200)
    ap.add_argument("--client_threads", type=int, default=8)
    ap.add_argument("--loom_submissions", type=int, default=24000,
                    help="about as many seconds of submissions as --slurm_submissions to Slurm")
    ap.add_argument("--slurm_submissions", type=int, default=2000)
    ap.add_argument("--slurm_runs", type=int, default=3,
                    help="Loom/Slurm submission runs; the median ratio is reported")
    ap.add_argument("--skip_scale", action="store_true")
    ap.add_argument("--skip_slurm", action="store_true")
    args = ap.parse_args()
    os.makedirs(f"{args.work_dir}/fortunes", exist_ok=True)
    if not args.skip_scale:
        counts = [int(x) for x in args.nodes.split(",")]
        rows = [one_scale(args, n) for n in counts]
        if args.sweep:
            n = counts[-1]
            while holds(rows[-1]) and n * 2 <= args.max_nodes:
                n *= 2
                rows.append(one_scale(args, n))
            broke = rows[-1]
            print(f"sweep: held up to nodes={max([r['nodes'] for r in rows if holds(r)] or [0])}; "
                  f"at nodes={broke['nodes']}: heartbeat_p99_ms={broke['heartbeat_p99_ms']:.2f} "
                  f"cycle_p99_ms={broke['cycle_p99_ms']:.2f} "
                  f"false_node_losses={broke['false_node_losses']} late={broke['late']}")
    if not args.skip_slurm:
        submission_peer(args)
    shutil.rmtree(args.work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
