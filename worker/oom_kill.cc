#include "worker/oom_kill.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace loom::worker {
namespace {

// The value of the "oom_kill N" line of a memory.events / memory.oom_control file.
std::optional<int64_t> OomKillLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    int64_t n = 0;
    if (absl::ConsumePrefix(&rest, "oom_kill ") && absl::SimpleAtoi(rest, &n)) return n;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> ReadOomKillCount(const std::string& proc_cgroup,
                                        const std::string& cgroup_root) {
  std::ifstream in(proc_cgroup);
  if (!in) return std::nullopt;
  std::string v2_path, v1_path;
  bool has_v2 = false, has_v1 = false;
  std::string line;
  while (std::getline(in, line)) {
    // "hierarchy-ID:controller-list:cgroup-path"; the path may itself contain ':'.
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      has_v2 = true;
      v2_path = f[2];
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c == "memory") {
        has_v1 = true;
        v1_path = f[2];
      }
    }
  }
  if (has_v2) {
    if (auto n = OomKillLine(cgroup_root + (v2_path == "/" ? "" : v2_path) + "/memory.events")) {
      return n;
    }
  }
  if (has_v1) {
    return OomKillLine(cgroup_root + "/memory" + (v1_path == "/" ? "" : v1_path) +
                       "/memory.oom_control");
  }
  return std::nullopt;
}

}  // namespace loom::worker
