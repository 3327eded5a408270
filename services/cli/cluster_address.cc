#include "services/cli/cluster_address.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/daemon.h"
#include "common/file_util.h"

namespace loom::cli {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

std::string CurrentClusterPointerPath() {
  if (std::string xdg = Env("XDG_CONFIG_HOME"); !xdg.empty()) return xdg + "/loom/cluster";
  if (std::string home = Env("HOME"); !home.empty()) return home + "/.config/loom/cluster";
  return "";
}

std::vector<std::string> CandidateClusterDirs(const std::string& cluster_dir_flag,
                                              const std::string& cwd) {
  if (!cluster_dir_flag.empty()) return {cluster_dir_flag};
  if (std::string home = Env("LOOM_HOME"); !home.empty()) return {home + "/cluster"};
  std::vector<std::string> dirs;
  std::error_code ec;
  for (std::filesystem::path dir(cwd); !dir.empty(); dir = dir.parent_path()) {
    const std::filesystem::path candidate = dir / ".loom" / "cluster";
    if (std::filesystem::is_directory(candidate, ec)) {
      dirs.push_back(candidate.string());
      break;
    }
    if (dir == dir.parent_path()) break;  // the root
  }
  if (dirs.empty()) dirs.push_back(".loom/cluster");  // named in the error
  if (const std::string pointer = CurrentClusterPointerPath(); !pointer.empty()) {
    if (absl::StatusOr<std::string> text = ReadFile(pointer); text.ok()) {
      std::string recorded(absl::StripAsciiWhitespace(*text));
      if (!recorded.empty() && recorded != dirs.back()) dirs.push_back(recorded);
    }
  }
  return dirs;
}

absl::StatusOr<std::string> ResolveDaemonAddress(const std::string& flag_value,
                                                 const std::string& flag_name,
                                                 const std::string& env,
                                                 const std::string& ready_name,
                                                 const std::string& cluster_dir_flag) {
  if (!flag_value.empty()) return flag_value;
  if (std::string e = Env(env.c_str()); !e.empty()) return e;
  std::string cwd = ".";
  if (char buf[4096]; getcwd(buf, sizeof(buf)) != nullptr) cwd = buf;
  std::vector<std::string> tried;
  for (const std::string& dir : CandidateClusterDirs(cluster_dir_flag, cwd)) {
    const std::string path = absl::StrCat(dir, "/", ready_name, ".json");
    absl::StatusOr<ReadyInfo> info = ReadReadyFile(path);
    if (info.ok()) return info->grpc_address;
    tried.push_back(absl::StrCat(path, ": ", info.status().message()));
  }
  return absl::UnavailableError(absl::StrCat(
      "no ", ready_name, " address: pass --", flag_name, ", set ", env,
      " or LOOM_HOME, or start a local cluster (scripts/local_cluster.sh start); looked at ",
      absl::StrJoin(tried, "; ")));
}

}  // namespace loom::cli
