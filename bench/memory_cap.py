#!/opt/loom/venv/bin/python3
"""Per-process memory caps for benchmarks: one cgroup v1 memory group per rank.

Each rank runs in its own group under /sys/fs/cgroup/memory (docs/benchmarks.md, "Memory
caps"): memory.limit_in_bytes is the cap, the rank joins before exec (children inherit the
group), and after it exits memory.max_usage_in_bytes is its peak charge, memory.failcnt how often
it hit the cap and memory.oom_control's oom_kill how many processes the kernel killed for it.
Page cache is charged too in v1, so the capacity runs put NVMe swap files behind O_DIRECT.
Needs root and a writable v1 memory controller; `available()` says whether this machine has one.
"""
import os

ROOT = "/sys/fs/cgroup/memory"


def available():
    return os.access(os.path.join(ROOT, "cgroup.procs"), os.W_OK)


class MemoryCap:
    """One cgroup with a hard memory cap (bytes). Use as a context manager: removed on exit."""

    def __init__(self, name, cap_bytes):
        self.path = os.path.join(ROOT, name)
        self.cap_bytes = int(cap_bytes)
        os.makedirs(self.path, exist_ok=True)
        self._write("memory.limit_in_bytes", str(self.cap_bytes))
        # No swap here, but cap memory+swap as well where the kernel accounts it.
        if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
            self._write("memory.memsw.limit_in_bytes", str(self.cap_bytes))

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def _read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def join_self(self):
        """Moves the calling process into the group (use as Popen's preexec_fn)."""
        self._write("cgroup.procs", str(os.getpid()))

    def peak_bytes(self):
        return int(self._read("memory.max_usage_in_bytes"))

    def failcnt(self):
        return int(self._read("memory.failcnt"))

    def oom_kills(self):
        for line in self._read("memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self):
        # The group can be removed only once it has no processes; the caller has reaped them.
        try:
            os.rmdir(self.path)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False
