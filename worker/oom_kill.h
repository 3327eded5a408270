// How many processes the kernel's OOM killer has killed in this process's memory cgroup, so that
// the worker can tell a rank the OOM killer ended from one that somebody else SIGKILLed (both die
// of SIGKILL, exit status 137; issue 53: every `kill -9` was counted as cause "oom").
//
// The count is the `oom_kill` line of the cgroup's memory.events (cgroup v2: the cgroup and its
// descendants, killed by any OOM killer, the global one included) or memory.oom_control (cgroup
// v1's memory controller, kernel >= 4.13). A trainer is spawned into the worker's own cgroup, so
// a rise of the worker's count across a rank's life that ends in SIGKILL is the OOM killer's.
// Thread-safe (reads files only).
#ifndef LOOM_WORKER_OOM_KILL_H_
#define LOOM_WORKER_OOM_KILL_H_

#include <cstdint>
#include <optional>
#include <string>

namespace loom::worker {

// The oom_kill count of the memory cgroup that `proc_cgroup` (a /proc/<pid>/cgroup file) names,
// under the cgroup filesystem mounted at `cgroup_root`: the v2 entry ("0::<path>",
// <root><path>/memory.events) when that file exists, else the v1 memory controller's
// ("N:memory:<path>", <root>/memory<path>/memory.oom_control). nullopt when neither can be read
// (no memory accounting, a container without /sys/fs/cgroup, an old kernel).
std::optional<int64_t> ReadOomKillCount(const std::string& proc_cgroup = "/proc/self/cgroup",
                                        const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace loom::worker

#endif  // LOOM_WORKER_OOM_KILL_H_
