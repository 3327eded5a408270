"""Slurm submission peer for the control-plane benchmark (bench/control_plane_bench.py).

Starts a private slurmctld (Debian's slurm-wlm 22.05, munge authentication through a private
munged) with its state saved under a scratch directory, then submits jobs with `sbatch` from
`threads` parallel clients, as Slurm users submit: one `sbatch --hold --wrap=true` process per job.
No slurmd runs, so the held jobs stay pending. Nothing listens beyond 127.0.0.1.

Durability, as Slurm does it: slurmctld answers sbatch once the job is in its memory and its
script is written to StateSaveLocation; the job state file is saved by a background thread
(not fsynced per job). Loom's SubmitJob returns after the SQLite commit (synchronous=FULL).
The benchmark states both.
"""

import os
import shutil
import socket
import subprocess
import threading
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, deadline_s, what):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)  # polling a daemon's readiness, with a deadline
    raise RuntimeError(f"slurm peer: {what} not ready within {deadline_s} s")


class SlurmPeer:
    def __init__(self, work_dir):
        for tool in ("slurmctld", "sbatch", "scontrol", "munged"):
            if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
                raise RuntimeError(
                    f"slurm peer: {tool} not found; install Debian's slurmctld, slurm-client "
                    "and munge (bench/control_plane_bench.sh installs them)")
        self.dir = os.path.abspath(work_dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(f"{self.dir}/state")
        os.makedirs(f"{self.dir}/spool")
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=f"{self.dir}/slurm.conf")

    def start(self):
        sock = f"{self.dir}/munge.socket"
        key = "/etc/munge/munge.key"
        if not os.path.exists(key):
            subprocess.run(["/usr/sbin/mungekey", "--create", "--keyfile", key], check=True)
        munged = subprocess.Popen(
            ["/usr/sbin/munged", "--foreground", "--force", f"--socket={sock}",
             f"--key-file={key}", f"--pid-file={self.dir}/munged.pid",
             f"--log-file={self.dir}/munged.log", f"--seed-file={self.dir}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.procs.append(munged)
        _wait(lambda: os.path.exists(sock), 20, "munged")
        host = socket.gethostname().split(".")[0]
        conf = f"""ClusterName=loombench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
StateSaveLocation={self.dir}/state
SlurmdSpoolDir={self.dir}/spool
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmctldLogFile={self.dir}/slurmctld.log
SlurmctldDebug=error
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MaxJobCount=1000000
MinJobAge=300
ReturnToService=2
NodeName=sim[0001-0016] NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=bench Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(f"{self.dir}/slurm.conf", "w") as f:
            f.write(conf)
        ctld = subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-c", "-f", f"{self.dir}/slurm.conf"],
                                env=self.env, stdout=open(f"{self.dir}/slurmctld.out", "w"),
                                stderr=subprocess.STDOUT)
        self.procs.append(ctld)

        def up():
            if ctld.poll() is not None:
                raise RuntimeError("slurm peer: slurmctld exited: "
                                   + open(f"{self.dir}/slurmctld.out").read()[-2000:])
            r = subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True, text=True)
            return r.returncode == 0 and "UP" in r.stdout
        _wait(up, 60, "slurmctld")

    def submit(self, total, threads):
        """Submits `total` held jobs from `threads` clients; returns (jobs/s, errors)."""
        nxt = [0]
        lock = threading.Lock()
        errors = [0]

        def client():
            while True:
                with lock:
                    if nxt[0] >= total:
                        return
                    nxt[0] += 1
                r = subprocess.run(["sbatch", "--parsable", "--hold", "--job-name=bench",
                                    "-o", "/dev/null", "--wrap=true"],
                                   env=self.env, capture_output=True, text=True)
                if r.returncode != 0:
                    with lock:
                        errors[0] += 1
        ts = [threading.Thread(target=client) for _ in range(threads)]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.monotonic() - t0
        return (total - errors[0]) / elapsed, errors[0]

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []
