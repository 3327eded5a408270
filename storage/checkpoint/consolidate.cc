#include "storage/checkpoint/consolidate.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

using nlohmann::json;

constexpr char kManifestSuffix[] = ".manifest.json";
constexpr char kSafetensorsName[] = "model.safetensors";
constexpr char kConfigName[] = "config.json";
constexpr char kParamsSection[] = "fp32_params";

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&& o) = delete;
  ScopedFd(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Names in `dir` (not "." or ".."). NOT_FOUND if `dir` does not exist.
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

// `prefix` + decimal integer + `suffix`, in the canonical spelling `canonical(value)` produces.
template <typename Int, typename Canonical>
bool ParseNumbered(const std::string& name, absl::string_view prefix, absl::string_view suffix,
                   Canonical canonical, Int* value) {
  if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, suffix)) return false;
  if (name.size() <= prefix.size() + suffix.size()) return false;
  absl::string_view digits(name.data() + prefix.size(), name.size() - prefix.size() - suffix.size());
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  Int v;
  if (!absl::SimpleAtoi(digits, &v)) return false;
  if (canonical(v) != name) return false;
  *value = v;
  return true;
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

// Reads exactly `size` bytes at `offset`; DATA_LOSS naming the shard on a short read.
absl::Status PreadExactly(int fd, char* dst, size_t size, int64_t offset, const std::string& path,
                          int32_t rank) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, dst + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat("cannot read (rank ", rank, ")"), path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, " (rank ", rank, "): ends at byte ",
                                              offset + done, ", expected at least ",
                                              offset + size));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

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

struct StepScan {
  CheckpointInfo info;
  std::map<int32_t, ShardManifest> manifests;  // readable manifests by rank
};

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

// Removes "<name>.tmp.<pid>" files in `dir` left by processes that no longer exist.
void RemoveDeadTemporaries(const std::string& dir, const std::vector<std::string>& finals) {
  auto names = ListDir(dir);
  if (!names.ok()) return;
  for (const std::string& n : *names) {
    for (const std::string& f : finals) {
      std::string prefix = absl::StrCat(f, ".tmp.");
      int pid = 0;
      if (!absl::StartsWith(n, prefix) || !absl::SimpleAtoi(n.substr(prefix.size()), &pid)) continue;
      if (pid <= 0 || pid == ::getpid()) continue;
      if (::kill(pid, 0) != 0 && errno == ESRCH) ::unlink(absl::StrCat(dir, "/", n).c_str());
    }
  }
}

}  // namespace

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

std::string DefaultConsolidationDir(const std::string& checkpoint_dir, int64_t step) {
  return absl::StrCat(checkpoint_dir, "/", StepDirName(step), "/hf");
}

absl::StatusOr<ConsolidateResult> Consolidate(const std::string& checkpoint_dir, int64_t step,
                                              const std::string& output_dir,
                                              const ConsolidateOptions& options) {
  const absl::Time start = absl::Now();
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
  ASSIGN_OR_RETURN(StepScan scan, SelectStep(checkpoint_dir, step));
  const CheckpointInfo& info = scan.info;
  const ShardManifest& ref = scan.manifests.begin()->second;
  const int32_t world_size = ref.world_size;

  // Open every shard once; check its size and (streamed) CRC-32 before writing anything.
  std::vector<char> buffer(static_cast<size_t>(std::max<int64_t>(options.io_buffer_bytes, 1)));
  std::vector<ScopedFd> fds;
  std::vector<std::string> shard_paths;
  for (int32_t r = 0; r < world_size; ++r) {
    const ShardManifest& m = scan.manifests.at(r);
    std::string path = absl::StrCat(info.path, "/", ShardFileName(r));
    // O_NONBLOCK: a FIFO planted as a shard must not block the service (it is refused below).
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      if (errno == ENOENT) {
        return absl::DataLossError(absl::StrCat(path, " (rank ", r, "): missing"));
      }
      return ErrnoError(absl::StrCat("cannot open (rank ", r, ")"), path);
    }
    fds.emplace_back(fd);
    shard_paths.push_back(path);
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoError("cannot stat", path);
    if (!S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(path, " (rank ", r, "): not a regular file"));
    }
    if (st.st_size != m.shard_bytes) {
      return absl::DataLossError(absl::StrCat(path, " (rank ", r, "): ", st.st_size,
                                              " bytes, manifest says ", m.shard_bytes));
    }
    if (!options.verify_checksums) continue;
    uint32_t crc = Crc32(0, nullptr, 0);
    for (int64_t off = 0; off < m.shard_bytes;) {
      size_t n = static_cast<size_t>(std::min<int64_t>(buffer.size(), m.shard_bytes - off));
      RETURN_IF_ERROR(PreadExactly(fd, buffer.data(), n, off, path, r));
      crc = Crc32(crc, buffer.data(), n);
      off += static_cast<int64_t>(n);
    }
    if (crc != m.shard_crc32) {
      return absl::DataLossError(absl::StrFormat("%s (rank %d): CRC-32 %08x, manifest says %08x",
                                                 path, r, crc, m.shard_crc32));
    }
  }

  // config.json and the tie.
  json config = json::parse(ref.model_config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(info.path, ": manifest model_config is not a JSON object"));
  }
  auto tie_it = config.find("tie_word_embeddings");
  const bool tied = tie_it != config.end() && tie_it->is_boolean() && tie_it->get<bool>();

  auto section = SectionOffset(ref, kParamsSection);
  if (!section.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(info.path, ": ", section.status().message()));
  }
  const int64_t section_offset = *section;

  ConsolidateResult result;
  result.step = info.step;
  std::vector<safetensors::TensorSpec> specs;
  std::map<std::string, const ShardParam*> by_name;
  for (const ShardParam& p : ref.params) {
    if (tied && p.name == "lm_head.weight") {
      result.skipped_tensors.push_back(p.name);
      continue;
    }
    if (!by_name.emplace(p.name, &p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(info.path, ": parameter '", p.name, "' appears twice in the manifest"));
    }
    specs.push_back({p.name, "F32", p.shape});
    result.tensor_bytes += p.numel * static_cast<int64_t>(sizeof(float));
  }
  result.num_tensors = static_cast<int64_t>(specs.size());

  // zero_to_fp32 stage 3: full = cat_r rank_r[offset : offset + p], first numel elements.
  // Shards and safetensors are both little-endian fp32, so bytes are copied unchanged.
  auto source = [&](const safetensors::TensorEntry& e,
                    const safetensors::ByteSink& sink) -> absl::Status {
    const ShardParam& p = *by_name.at(e.name);
    int64_t remaining = p.numel;
    for (int32_t r = 0; r < world_size && remaining > 0; ++r) {
      const int64_t take = std::min(p.partition_numel, remaining);
      int64_t off = (section_offset + p.partition_offset) * static_cast<int64_t>(sizeof(float));
      int64_t left = take * static_cast<int64_t>(sizeof(float));
      while (left > 0) {
        size_t n = static_cast<size_t>(std::min<int64_t>(buffer.size(), left));
        RETURN_IF_ERROR(PreadExactly(fds[r].get(), buffer.data(), n, off, shard_paths[r], r));
        RETURN_IF_ERROR(sink(buffer.data(), n));
        off += static_cast<int64_t>(n);
        left -= static_cast<int64_t>(n);
      }
      remaining -= take;
    }
    return absl::OkStatus();
  };

  result.output_dir = output_dir.empty() ? DefaultConsolidationDir(checkpoint_dir, info.step)
                                         : output_dir;
  RETURN_IF_ERROR(MakeDirs(result.output_dir));
  RemoveDeadTemporaries(result.output_dir, {kSafetensorsName, kConfigName});
  result.safetensors_path = absl::StrCat(result.output_dir, "/", kSafetensorsName);
  result.config_path = absl::StrCat(result.output_dir, "/", kConfigName);
  // config.json first: a model.safetensors at its final name then implies a complete output.
  RETURN_IF_ERROR(WriteFileAtomically(result.config_path, config.dump(2) + "\n"));
  ASSIGN_OR_RETURN(result.safetensors_bytes,
                   safetensors::WriteFile(result.safetensors_path, std::move(specs), source));
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace loom::storage
