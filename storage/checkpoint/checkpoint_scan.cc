// Listing step directories and the commit rules (consolidate.h: ListCheckpoints,
// NewestCommittedCheckpoint), and the removal of temporaries left by dead processes.
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate_internal.h"
#include "storage/checkpoint/corrupt_mark.h"

namespace loom::storage {
namespace consolidate_internal {
namespace {


// "0, 1, 2" -- at most 16 ranks, then "... (N in total)": the list ends up in RPC error messages,
// which must stay far below gRPC's metadata limit whatever a manifest claims.
std::string RankList(const std::vector<int32_t>& ranks) {
  constexpr size_t kMaxListed = 16;
  if (ranks.size() <= kMaxListed) return absl::StrJoin(ranks, ", ");
  return absl::StrCat(absl::StrJoin(ranks.begin(), ranks.begin() + kMaxListed, ", "), ", ... (",
                      ranks.size(), " in total)");
}

// What two manifests of one checkpoint must agree on. Empty if they agree.
std::string Disagreement(const ShardManifest& a, const ShardManifest& b) {
  auto say = [&](absl::string_view field, const std::string& va, const std::string& vb) {
    return absl::StrCat("rank ", a.rank, " says ", field, " ", va, ", rank ", b.rank, " says ", vb);
  };
  if (a.format != b.format) return say("format", a.format, b.format);
  if (a.step != b.step) return say("step", absl::StrCat(a.step), absl::StrCat(b.step));
  if (a.world_size != b.world_size) {
    return say("world_size", absl::StrCat(a.world_size), absl::StrCat(b.world_size));
  }
  if (a.zero_stage != b.zero_stage) {
    return say("zero_stage", absl::StrCat(a.zero_stage), absl::StrCat(b.zero_stage));
  }
  if (a.sections != b.sections) {
    return say("sections", absl::StrJoin(a.sections, ","), absl::StrJoin(b.sections, ","));
  }
  if (a.params.size() != b.params.size()) {
    return say("param count", absl::StrCat(a.params.size()), absl::StrCat(b.params.size()));
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    const ShardParam& pa = a.params[i];
    const ShardParam& pb = b.params[i];
    if (pa.name != pb.name || pa.shape != pb.shape) {
      return say(absl::StrCat("params[", i, "]"),
                 absl::StrCat(pa.name, " [", absl::StrJoin(pa.shape, ","), "]"),
                 absl::StrCat(pb.name, " [", absl::StrJoin(pb.shape, ","), "]"));
    }
  }
  if (a.model_config_json != b.model_config_json) return say("model_config", "...", "something else");
  return "";
}

bool ProcessIsDead(int pid) {
  return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

// The remove(3) RemoveTree uses (test seam: TEST_SetRemoveFunction), and the entry whose
// removal failed last on this thread (nftw's callback has no user argument).
std::atomic<int (*)(const char*)> remove_function{&::remove};
thread_local std::string failed_entry;

thread_local int64_t tree_bytes = 0;  // TreeBytes' running sum

int AddFileBytes(const char* /*path*/, const struct stat* st, int type, struct FTW* /*ftw*/) {
  if (type == FTW_F) tree_bytes += st->st_size;
  return 0;
}

int RemoveEntry(const char* path, const struct stat* /*st*/, int /*type*/, struct FTW* /*ftw*/) {
  if (remove_function.load()(path) == 0 || errno == ENOENT) return 0;
  const int err = errno;
  failed_entry = path;
  errno = err;
  return -1;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("cannot list", dir);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return st.st_size;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<StepScan> ScanStep(const std::string& step_dir, int64_t step) {
  StepScan scan;
  CheckpointInfo& info = scan.info;
  info.step = step;
  info.path = step_dir;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(step_dir));
  std::vector<std::string> data_loss;
  for (const std::string& name : names) {
    int32_t rank = 0;
    if (!ParseNumbered<int32_t>(name, "rank_", kManifestSuffix, ManifestFileName, &rank)) continue;
    info.ranks_reported.push_back(rank);
    int64_t size = FileSize(absl::StrCat(step_dir, "/", name));
    if (size > 0) info.total_bytes += size;
    auto m = ReadManifest(step_dir, rank);
    if (!m.ok()) {
      data_loss.push_back(absl::StrCat("unreadable manifest of rank ", rank, ": ", m.status().message()));
      continue;
    }
    scan.manifests.emplace(rank, *std::move(m));
  }
  std::sort(info.ranks_reported.begin(), info.ranks_reported.end());

  std::string disagreement;
  if (!scan.manifests.empty()) {
    const ShardManifest& ref = scan.manifests.begin()->second;
    info.world_size = ref.world_size;
    info.metrics = ref.metrics;
    for (const auto& [rank, m] : scan.manifests) {
      if (disagreement.empty()) disagreement = Disagreement(ref, m);
      if (disagreement.empty() && m.step != step) {
        disagreement = absl::StrCat("rank ", rank, " manifest says step ", m.step,
                                    " inside the directory of step ", step);
      }
      std::string shard = absl::StrCat(step_dir, "/", ShardFileName(rank));
      int64_t size = FileSize(shard);
      if (size < 0) {
        data_loss.push_back(absl::StrCat(shard, " (rank ", rank,
                                         "): missing although its manifest is present"));
        continue;
      }
      info.total_bytes += size;
      if (size != m.shard_bytes) {
        data_loss.push_back(absl::StrCat(shard, " (rank ", rank, "): ", size,
                                         " bytes, manifest says ", m.shard_bytes));
      }
    }
    for (int32_t r = 0; r < info.world_size; ++r) {
      if (!std::binary_search(info.ranks_reported.begin(), info.ranks_reported.end(), r)) {
        info.missing_ranks.push_back(r);
      }
    }
  }

  if (!data_loss.empty()) {
    info.commit_status = absl::DataLossError(
        absl::StrCat(step_dir, ": ", absl::StrJoin(data_loss, "; ")));
  } else if (!disagreement.empty()) {
    info.commit_status = absl::FailedPreconditionError(
        absl::StrCat(step_dir, ": not committed: manifests disagree: ", disagreement));
  } else if (scan.manifests.empty()) {
    info.commit_status = absl::FailedPreconditionError(
        absl::StrCat(step_dir, ": not committed: no rank has reported"));
  } else if (!info.missing_ranks.empty()) {
    info.commit_status = absl::FailedPreconditionError(absl::StrCat(
        step_dir, ": not committed: world_size ", info.world_size, ", missing ranks ",
        RankList(info.missing_ranks), " (reported: ", RankList(info.ranks_reported), ")"));
  } else if (std::optional<std::string> mark = CorruptMarkReason(step_dir); mark.has_value()) {
    // Committed once, then failed verification (corrupt_mark.h): skipped like a partial one.
    info.corrupt = true;
    info.corrupt_reason = *mark;
    info.commit_status =
        absl::DataLossError(absl::StrCat(step_dir, ": marked corrupt: ", *mark));
  } else {
    info.committed = true;
  }
  return scan;
}

absl::StatusOr<std::vector<StepScan>> ScanAll(const std::string& checkpoint_dir) {
  if (!IsDir(checkpoint_dir)) {
    if (FileSize(checkpoint_dir) >= 0) {
      return absl::FailedPreconditionError(absl::StrCat(checkpoint_dir, " is not a directory"));
    }
    return absl::NotFoundError(absl::StrCat("no checkpoint directory ", checkpoint_dir));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(checkpoint_dir));
  std::vector<StepScan> scans;
  for (const std::string& name : names) {
    int64_t step = 0;
    if (!ParseNumbered<int64_t>(name, "step_", "", StepDirName, &step)) continue;
    std::string path = absl::StrCat(checkpoint_dir, "/", name);
    if (!IsDir(path)) continue;
    auto scan = ScanStep(path, step);
    if (!scan.ok()) {
      if (scan.status().code() == absl::StatusCode::kNotFound) continue;  // removed meanwhile
      return scan.status();
    }
    scans.push_back(*std::move(scan));
  }
  std::sort(scans.begin(), scans.end(),
            [](const StepScan& a, const StepScan& b) { return a.info.step < b.info.step; });
  return scans;
}

// Picks the scan to consolidate: `step`, or the newest committed one when step == 0.
absl::StatusOr<StepScan> SelectStep(const std::string& checkpoint_dir, int64_t step) {
  ASSIGN_OR_RETURN(std::vector<StepScan> scans, ScanAll(checkpoint_dir));
  if (scans.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoints in ", checkpoint_dir));
  }
  if (step == 0) {
    for (auto it = scans.rbegin(); it != scans.rend(); ++it) {
      if (it->info.committed) return std::move(*it);
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no committed checkpoint in ", checkpoint_dir, "; newest: ",
                     scans.back().info.commit_status.message()));
  }
  for (StepScan& s : scans) {
    if (s.info.step != step) continue;
    if (!s.info.committed) return s.info.commit_status;
    return std::move(s);
  }
  return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, " in ", checkpoint_dir));
}

// rm -r `path`; OK if it does not exist.
absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError("cannot stat", path);
  }
  failed_entry.clear();
  if (::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    const int err = errno;
    // Another process removing the same tree (a moved-aside step is swept by whoever comes
    // first) makes parts of it vanish under the walk: done if the whole tree is gone.
    if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return absl::OkStatus();
    errno = err;
    if (failed_entry.empty() || failed_entry == path) return ErrnoError("cannot remove", path);
    return ErrnoError("cannot remove", absl::StrCat(failed_entry, " (of ", path, ")"));
  }
  return absl::OkStatus();
}

int64_t TreeBytes(const std::string& path) {
  tree_bytes = 0;
  (void)::nftw(path.c_str(), AddFileBytes, 16, FTW_PHYS);
  return tree_bytes;
}

// Removes, in `dir`, "<file>.tmp.<pid>" files and ".consolidate.tmp.<pid>" staging directories
// left by processes that no longer exist.
void RemoveDeadTemporaries(const std::string& dir) {
  auto names = ListDir(dir);
  if (!names.ok()) return;
  for (const std::string& n : *names) {
    size_t pos = n.rfind(".tmp.");
    if (pos == std::string::npos) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(n.substr(pos + 5), &pid)) continue;
    if (ProcessIsDead(pid)) (void)RemoveTree(absl::StrCat(dir, "/", n));
  }
}

}  // namespace consolidate_internal

void TEST_SetRemoveFunction(int (*remove)(const char* path)) {
  consolidate_internal::remove_function.store(remove != nullptr ? remove : &::remove);
}

using consolidate_internal::ScanAll;
using consolidate_internal::SelectStep;
using consolidate_internal::StepScan;

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(std::vector<StepScan> scans, ScanAll(checkpoint_dir));
  std::vector<CheckpointInfo> out;
  out.reserve(scans.size());
  for (StepScan& s : scans) out.push_back(std::move(s.info));
  return out;
}

absl::StatusOr<CheckpointInfo> NewestCommittedCheckpoint(const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(StepScan scan, SelectStep(checkpoint_dir, 0));
  return std::move(scan.info);
}

}  // namespace loom::storage
