#include "storage/checkpoint/consolidate.h"

#include <optional>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <utility>
#include <zlib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "storage/checkpoint/corrupt_mark.h"
#include "storage/checkpoint/mapped_chunks.h"
#include "common/status_macros.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/checkpoint/tokenizer_export.h"
#include "storage/safetensors/safetensors.h"

namespace loom::storage {
namespace {

using nlohmann::json;

constexpr char kManifestSuffix[] = ".manifest.json";
constexpr char kSafetensorsName[] = "model.safetensors";
constexpr char kConfigName[] = "config.json";
constexpr char kParamsSection[] = "fp32_params";
constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kStagingPrefix[] = ".consolidate.tmp.";
constexpr char kDeletingPrefix[] = ".deleting.";


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

bool ProcessIsDead(int pid) {
  return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

int RemoveEntry(const char* path, const struct stat* /*st*/, int /*type*/, struct FTW* /*ftw*/) {
  return ::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

// rm -r `path`; OK if it does not exist.
absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError("cannot stat", path);
  }
  if (::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    return ErrnoError("cannot remove", path);
  }
  return absl::OkStatus();
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

// Removes ".deleting.step_*.<pid>" directories of dead processes (deletions cut short by a crash).
void RemoveInterruptedDeletions(const std::string& checkpoint_dir) {
  auto names = ListDir(checkpoint_dir);
  if (!names.ok()) return;
  for (const std::string& n : *names) {
    if (!absl::StartsWith(n, kDeletingPrefix)) continue;
    int pid = 0;
    size_t dot = n.rfind('.');
    if (!absl::SimpleAtoi(n.substr(dot + 1), &pid)) continue;
    if (ProcessIsDead(pid)) (void)RemoveTree(absl::StrCat(checkpoint_dir, "/", n));
  }
}

bool IsOutputFile(const std::string& name) {
  if (name == kSafetensorsName || name == kIndexName) return true;
  // model-00001-of-00002.safetensors
  return absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors") &&
         absl::StrContains(name, "-of-");
}

// Removes a previous export in `dir`: completion markers first, so that an interrupted removal
// never leaves a complete-looking mixture.
absl::Status RemovePreviousOutputs(const std::string& dir) {
  for (const char* marker : {kIndexName, kSafetensorsName}) {
    std::string path = absl::StrCat(dir, "/", marker);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  for (const std::string& n : names) {
    if (!IsOutputFile(n)) continue;
    std::string path = absl::StrCat(dir, "/", n);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path);
  }
  return absl::OkStatus();
}

size_t BufferSize(int64_t io_buffer_bytes) {
  int64_t n = std::max<int64_t>(io_buffer_bytes, 4);
  return static_cast<size_t>((n + 3) / 4 * 4);
}

// A byte range of a shard whose CRC-32 is known.
struct CrcPiece {
  int64_t offset = 0;
  int64_t size = 0;
  uint32_t crc = 0;
};

struct OpenShards {
  std::vector<ScopedFd> fds;
  std::vector<std::string> paths;
};

// Opens every rank's shard and checks its size against the manifest.
absl::StatusOr<OpenShards> OpenShardFiles(const StepScan& scan) {
  OpenShards out;
  const int32_t world_size = scan.manifests.begin()->second.world_size;
  for (int32_t r = 0; r < world_size; ++r) {
    const ShardManifest& m = scan.manifests.at(r);
    ASSIGN_OR_RETURN(ScopedFd fd, OpenShardFile(scan.info.path, m));
    out.fds.push_back(std::move(fd));
    out.paths.push_back(absl::StrCat(scan.info.path, "/", ShardFileName(r)));
  }
  return out;
}

// CRC-32 of `size` bytes of `fd` at `offset`, chained onto `crc`, computed on the page cache's
// pages (ForEachMappedChunk, `chunk_bytes` at a time) rather than on a copy.
absl::StatusOr<uint32_t> CrcRange(int fd, uint32_t crc, int64_t offset, int64_t size,
                                  size_t chunk_bytes, const std::string& path) {
  RETURN_IF_ERROR(ForEachMappedChunk(fd, offset, size, chunk_bytes, path,
                                     [&](const char* data, size_t n) {
                                       crc = Crc32(crc, data, n);
                                       return absl::OkStatus();
                                     }));
  return crc;
}

// Checks every shard's CRC-32 against its manifest; DATA_LOSS naming the file and rank on a
// mismatch. With `known`, (*known)[r] are byte ranges of rank r whose CRC-32s are already known
// (the copy read them): only the bytes between them are read, and the pieces are combined in
// file order with zlib's crc32_combine. Overlapping pieces (a malformed layout) fall back to a
// full pass for that rank.
absl::Status VerifyShardCrcs(const StepScan& scan, const OpenShards& shards, size_t chunk_bytes,
                             std::vector<std::vector<CrcPiece>>* known = nullptr) {
  for (size_t r = 0; r < shards.fds.size(); ++r) {
    const int32_t rank = static_cast<int32_t>(r);
    const ShardManifest& m = scan.manifests.at(rank);
    const int fd = shards.fds[r].get();
    std::vector<CrcPiece> pieces;
    if (known != nullptr) pieces = (*known)[r];
    std::sort(pieces.begin(), pieces.end(),
              [](const CrcPiece& a, const CrcPiece& b) { return a.offset < b.offset; });
    bool overlapping = false;
    for (size_t i = 1; i < pieces.size(); ++i) {
      if (pieces[i].offset < pieces[i - 1].offset + pieces[i - 1].size) overlapping = true;
    }
    if (overlapping) pieces.clear();
    uint32_t crc = Crc32(0, nullptr, 0);
    int64_t pos = 0;
    for (const CrcPiece& p : pieces) {
      if (p.size == 0) continue;
      ASSIGN_OR_RETURN(crc, CrcRange(fd, crc, pos, p.offset - pos, chunk_bytes, shards.paths[r]));
      crc = static_cast<uint32_t>(crc32_combine64(crc, p.crc, p.size));
      pos = p.offset + p.size;
    }
    ASSIGN_OR_RETURN(crc,
                     CrcRange(fd, crc, pos, m.shard_bytes - pos, chunk_bytes, shards.paths[r]));
    if (crc != m.shard_crc32) {
      return absl::DataLossError(absl::StrFormat("%s (rank %d): CRC-32 %08x, manifest says %08x",
                                                 shards.paths[r], rank, crc, m.shard_crc32));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseShardSize(absl::string_view text) {
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty()) return 0;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_shard_size: '", text, "' is not a size (e.g. \"5GB\", \"500MB\", \"1.5GiB\", bytes)"));
  };
  size_t i = 0;
  while (i < t.size() && (absl::ascii_isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  const std::string number = t.substr(0, i);
  const std::string unit = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(t.substr(i)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},          {"B", 1},           {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},       {"KIB", 1024.0},    {"MIB", 1048576.0},
      {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto u = kUnits.find(unit);
  if (number.empty() || u == kUnits.end() || std::count(number.begin(), number.end(), '.') > 1) {
    return bad();
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value)) return bad();
  const double bytes = value * u->second;
  if (bytes >= 9.2e18) return bad();
  if (value > 0 && bytes < 1) return bad();
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<std::string> NormalizeOutputDtype(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t.empty() || t == "f32" || t == "fp32" || t == "float32") return std::string("F32");
  if (t == "bf16" || t == "bfloat16") return std::string("BF16");
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: '", text, "' is not an output dtype (fp32 or bf16)"));
}

uint16_t Fp32ToBf16(float value) {
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

std::vector<ShardPlanFile> PlanShards(const std::vector<std::pair<std::string, int64_t>>& tensors,
                                      int64_t max_shard_size_bytes) {
  std::vector<ShardPlanFile> shards;
  if (max_shard_size_bytes <= 0) {
    ShardPlanFile one;
    for (const auto& [name, bytes] : tensors) {
      one.tensors.push_back(name);
      one.tensor_bytes += bytes;
    }
    shards.push_back(std::move(one));
  } else {
    ShardPlanFile current;
    for (const auto& [name, bytes] : tensors) {
      if (bytes > max_shard_size_bytes) {
        shards.push_back({"", {name}, bytes});
        continue;
      }
      if (current.tensor_bytes + bytes > max_shard_size_bytes) {
        shards.push_back(std::move(current));
        current = ShardPlanFile();
      }
      current.tensors.push_back(name);
      current.tensor_bytes += bytes;
    }
    if (!current.tensors.empty() || shards.empty()) shards.push_back(std::move(current));
  }
  if (shards.size() == 1) {
    shards[0].file_name = kSafetensorsName;
  } else {
    for (size_t k = 0; k < shards.size(); ++k) {
      shards[k].file_name =
          absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, shards.size());
    }
  }
  return shards;
}

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
  ASSIGN_OR_RETURN(const std::string dtype, NormalizeOutputDtype(options.dtype));
  const bool bf16 = dtype == "BF16";
  ASSIGN_OR_RETURN(StepScan scan, SelectStep(checkpoint_dir, step));
  const CheckpointInfo& info = scan.info;
  const ShardManifest& ref = scan.manifests.begin()->second;
  const int32_t world_size = ref.world_size;

  // Open every shard once and check its size. CRC-32s: either a full pass before writing
  // anything, or (default) computed on the bytes the copy reads anyway, the rest of each shard
  // (other sections, padding, skipped tensors) read afterwards, the pieces combined in file order
  // (crc32_combine) and compared before anything is published.
  // Reads go through read-only maps of `chunk` bytes (mapped_chunks.h): the CRC-32 and the
  // write(2) into the output both read the page cache's pages, with no pread copy in between,
  // and the CRC of a chunk runs just before its write, while the chunk is in the CPU cache.
  const size_t chunk = BufferSize(options.io_buffer_bytes);
  std::vector<uint16_t> converted(bf16 ? chunk / sizeof(float) : 0);
  ASSIGN_OR_RETURN(OpenShards shards, OpenShardFiles(scan));
  const bool fused_crc = options.verify_checksums && !options.checksum_before_writing;
  if (options.verify_checksums && !fused_crc) {
    RETURN_IF_ERROR(VerifyShardCrcs(scan, shards, chunk));
  }
  std::vector<std::vector<CrcPiece>> pieces(static_cast<size_t>(world_size));

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
  result.dtype = dtype;
  const int64_t out_elem_bytes = bf16 ? 2 : 4;
  std::vector<std::pair<std::string, int64_t>> sizes;
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
    sizes.emplace_back(p.name, p.numel * out_elem_bytes);
    result.tensor_bytes += p.numel * out_elem_bytes;
  }
  result.num_tensors = static_cast<int64_t>(sizes.size());
  const std::vector<ShardPlanFile> plan = PlanShards(sizes, options.max_shard_size_bytes);
  const bool sharded = plan.size() > 1;

  // zero_to_fp32 stage 3: full = cat_r rank_r[offset : offset + p], first numel elements.
  // Shards and safetensors are both little-endian, so F32 bytes are copied unchanged.
  auto source = [&](const safetensors::TensorEntry& e,
                    const safetensors::ByteSink& sink) -> absl::Status {
    const ShardParam& p = *by_name.at(e.name);
    int64_t remaining = p.numel;
    for (int32_t r = 0; r < world_size && remaining > 0; ++r) {
      const int64_t take = std::min(p.partition_numel, remaining);
      int64_t off = (section_offset + p.partition_offset) * static_cast<int64_t>(sizeof(float));
      int64_t left = take * static_cast<int64_t>(sizeof(float));
      CrcPiece piece{off, left, Crc32(0, nullptr, 0)};
      RETURN_IF_ERROR(ForEachMappedChunk(
          shards.fds[r].get(), off, left, chunk, shards.paths[r],
          [&](const char* data, size_t n) -> absl::Status {
            if (fused_crc) piece.crc = Crc32(piece.crc, data, n);
            if (!bf16) return sink(data, n);
            const size_t count = n / sizeof(float);
            for (size_t i = 0; i < count; ++i) {
              float f;
              std::memcpy(&f, data + i * sizeof(float), sizeof(float));
              converted[i] = Fp32ToBf16(f);
            }
            return sink(converted.data(), count * sizeof(uint16_t));
          }));
      if (fused_crc) pieces[static_cast<size_t>(r)].push_back(piece);
      remaining -= take;
    }
    return absl::OkStatus();
  };

  // F32: the bytes pass unchanged, so the file is written here rather than through
  // safetensors::WriteFile: the same header (PlanHeader + SerializeHeader, the reference writer's
  // layout), then each rank slice copied inside the kernel (copy_file_range, as cp does) after
  // its mapped bytes are checksummed (CopyRangeMapped). It lives in the staging directory, so a
  // partial file is never published; fsynced before it is.
  auto write_f32 = [&](const std::string& path,
                       std::vector<safetensors::TensorSpec> specs) -> absl::StatusOr<int64_t> {
    ASSIGN_OR_RETURN(safetensors::Header header,
                     safetensors::PlanHeader(std::move(specs), safetensors::WriterOptions().metadata));
    ASSIGN_OR_RETURN(std::string text, safetensors::SerializeHeader(header));
    std::string head(8, '\0');
    for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    head += text;
    ScopedFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (out.get() < 0) return ErrnoError("cannot create", path);
    for (size_t done = 0; done < head.size();) {
      const ssize_t k = ::pwrite(out.get(), head.data() + done, head.size() - done, done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return ErrnoError("cannot write", path);
      done += static_cast<size_t>(k);
    }
    int64_t pos = static_cast<int64_t>(head.size());
    int64_t unsynced = 0;
    for (const safetensors::TensorEntry& e : header.tensors) {
      const ShardParam& p = *by_name.at(e.name);
      int64_t remaining = p.numel;
      for (int32_t r = 0; r < world_size && remaining > 0; ++r) {
        const int64_t take = std::min(p.partition_numel, remaining);
        const int64_t off =
            (section_offset + p.partition_offset) * static_cast<int64_t>(sizeof(float));
        const int64_t left = take * static_cast<int64_t>(sizeof(float));
        CrcPiece piece{off, left, Crc32(0, nullptr, 0)};
        RETURN_IF_ERROR(CopyRangeMapped(
            shards.fds[r].get(), off, left, chunk, shards.paths[r], out.get(), &pos, path,
            [&](const char* data, size_t n) {
              if (fused_crc) piece.crc = Crc32(piece.crc, data, n);
              unsynced += static_cast<int64_t>(n);
              if (options.writeback_bytes > 0 && unsynced >= options.writeback_bytes) {
                unsynced = 0;  // a hint: errors surface in the fsync
                (void)::sync_file_range(out.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
              }
              return absl::OkStatus();
            }));
        if (fused_crc) pieces[static_cast<size_t>(r)].push_back(piece);
        remaining -= take;
      }
    }
    if (::fsync(out.get()) != 0) return ErrnoError("cannot fsync", path);
    return pos;
  };

  result.output_dir = output_dir.empty() ? DefaultConsolidationDir(checkpoint_dir, info.step)
                                         : output_dir;
  RETURN_IF_ERROR(MakeDirs(result.output_dir));
  RemoveDeadTemporaries(result.output_dir);
  const std::string staging =
      absl::StrCat(result.output_dir, "/", kStagingPrefix, ::getpid());
  (void)RemoveTree(staging);  // a previous failed run of this very process
  RETURN_IF_ERROR(MakeDirs(staging));
  struct StagingCleanup {
    std::string dir;
    ~StagingCleanup() { (void)RemoveTree(dir); }
  } cleanup{staging};

  // 1. Everything into the staging directory, each file fsynced.
  ASSIGN_OR_RETURN(const std::vector<std::string> tokenizer_files,
                   StageTokenizerFiles(checkpoint_dir, staging, &config));
  RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(staging, "/", kConfigName), config.dump(2) + "\n"));
  json weight_map = json::object();
  for (const ShardPlanFile& f : plan) {
    std::vector<safetensors::TensorSpec> specs;
    for (const std::string& name : f.tensors) {
      const ShardParam& p = *by_name.at(name);
      specs.push_back({p.name, dtype, p.shape});
      weight_map[name] = f.file_name;
    }
    const std::string path = absl::StrCat(staging, "/", f.file_name);
    int64_t bytes = 0;
    if (bf16) {
      safetensors::WriterOptions writer_options;
      writer_options.writeback_bytes = options.writeback_bytes;
      ASSIGN_OR_RETURN(bytes, safetensors::WriteFile(path, std::move(specs), source, writer_options));
    } else {
      ASSIGN_OR_RETURN(bytes, write_f32(path, std::move(specs)));
    }
    result.safetensors_bytes += bytes;
  }
  if (sharded) {
    json index = {{"metadata", {{"total_size", result.tensor_bytes}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(staging, "/", kIndexName), index.dump(2) + "\n"));
  }

  // 2. The checksums must match.
  if (fused_crc) RETURN_IF_ERROR(VerifyShardCrcs(scan, shards, chunk, &pieces));

  // 3. Retire the previous output (its completion markers first), then publish, marker last.
  RETURN_IF_ERROR(RemovePreviousOutputs(result.output_dir));
  auto publish = [&](const std::string& name) -> absl::Status {
    const std::string from = absl::StrCat(staging, "/", name);
    const std::string to = absl::StrCat(result.output_dir, "/", name);
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoError("cannot rename into place", to);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(publish(kConfigName));
  for (const std::string& name : tokenizer_files) RETURN_IF_ERROR(publish(name));
  for (const ShardPlanFile& f : plan) {
    if (sharded) RETURN_IF_ERROR(publish(f.file_name));
  }
  if (sharded) {
    RETURN_IF_ERROR(SyncDir(result.output_dir));  // the shards are durable before the marker
    RETURN_IF_ERROR(publish(kIndexName));
  } else {
    RETURN_IF_ERROR(publish(kSafetensorsName));
  }
  RETURN_IF_ERROR(SyncDir(result.output_dir));

  result.config_path = absl::StrCat(result.output_dir, "/", kConfigName);
  for (const ShardPlanFile& f : plan) {
    result.files.push_back(absl::StrCat(result.output_dir, "/", f.file_name));
  }
  if (sharded) {
    result.index_path = absl::StrCat(result.output_dir, "/", kIndexName);
    result.safetensors_path = result.index_path;
  } else {
    result.safetensors_path = result.files.front();
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

absl::StatusOr<CheckpointInfo> VerifyCheckpointDir(const std::string& step_dir,
                                                   int64_t io_buffer_bytes) {
  std::string dir = step_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  const std::string base = slash == std::string::npos ? dir : dir.substr(slash + 1);
  int64_t step = 0;
  if (!ParseNumbered<int64_t>(base, "step_", "", StepDirName, &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_dir, ": not a checkpoint step directory (step_<8 digits>)"));
  }
  if (!IsDir(dir)) return absl::NotFoundError(absl::StrCat("no directory ", step_dir));
  ASSIGN_OR_RETURN(StepScan scan, ScanStep(dir, step));
  if (!scan.info.committed) return scan.info.commit_status;
  ASSIGN_OR_RETURN(OpenShards shards, OpenShardFiles(scan));
  RETURN_IF_ERROR(VerifyShardCrcs(scan, shards, BufferSize(io_buffer_bytes)));
  return std::move(scan.info);
}

absl::StatusOr<DeleteResult> DeleteCheckpoint(const std::string& checkpoint_dir, int64_t step,
                                              const std::vector<int64_t>& protected_steps) {
  if (step <= 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  ASSIGN_OR_RETURN(std::vector<StepScan> scans, ScanAll(checkpoint_dir));
  RemoveInterruptedDeletions(checkpoint_dir);
  DeleteResult result;
  const StepScan* target = nullptr;
  const StepScan* newest_committed = nullptr;
  for (const StepScan& s : scans) {
    if (s.info.step == step) target = &s;
    if (s.info.committed) newest_committed = &s;
  }
  if (target == nullptr) return result;  // already gone: idempotent
  if (newest_committed == target) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is the newest committed checkpoint of ", checkpoint_dir,
        " and is never deleted"));
  }
  if (std::find(protected_steps.begin(), protected_steps.end(), step) != protected_steps.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " of ", checkpoint_dir, " is protected (in use)"));
  }
  const std::string doomed = absl::StrCat(checkpoint_dir, "/", kDeletingPrefix,
                                          StepDirName(step), ".", ::getpid());
  if (::rename(target->info.path.c_str(), doomed.c_str()) != 0) {
    if (errno == ENOENT) return result;  // deleted concurrently
    return ErrnoError("cannot move aside for deletion", target->info.path);
  }
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  RETURN_IF_ERROR(RemoveTree(doomed));
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  result.deleted = true;
  return result;
}

absl::StatusOr<RetentionResult> ApplyRetention(const std::string& checkpoint_dir,
                                               const RetentionPolicy& policy,
                                               const std::vector<int64_t>& protected_steps) {
  if (policy.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last: ", policy.keep_last, " (must be at least 1)"));
  }
  if (policy.keep_best < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_best: ", policy.keep_best, " (must be at least 0)"));
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> list, ListCheckpoints(checkpoint_dir));
  RetentionResult result;
  std::vector<int64_t> committed;
  std::vector<std::pair<double, int64_t>> ranked;  // (metric, step), committed ones that have it
  for (const CheckpointInfo& c : list) {
    if (!c.committed) continue;
    committed.push_back(c.step);
    auto metric = c.metrics.find(policy.best_metric);
    if (metric != c.metrics.end()) ranked.emplace_back(metric->second, c.step);
  }
  std::sort(ranked.begin(), ranked.end());
  if (committed.empty()) {
    for (const CheckpointInfo& c : list) result.kept_steps.push_back(c.step);
    return result;
  }
  const int64_t newest = committed.back();
  const size_t keep_from =
      committed.size() > static_cast<size_t>(policy.keep_last)
          ? committed.size() - static_cast<size_t>(policy.keep_last)
          : 0;
  std::set<int64_t> keep(committed.begin() + static_cast<std::ptrdiff_t>(keep_from), committed.end());
  keep.insert(protected_steps.begin(), protected_steps.end());
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(policy.keep_best); ++i) {
    keep.insert(ranked[i].second);
  }
  for (const CheckpointInfo& c : list) {
    if (c.step >= newest || keep.count(c.step) > 0) {
      result.kept_steps.push_back(c.step);
      continue;
    }
    ASSIGN_OR_RETURN(DeleteResult d, DeleteCheckpoint(checkpoint_dir, c.step, protected_steps));
    if (d.deleted) result.deleted_steps.push_back(c.step);
  }
  return result;
}

}  // namespace loom::storage
