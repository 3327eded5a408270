// Internal to the :consolidate library (not a public header): the pieces consolidate.h's
// functions share, split by job into
//   checkpoint_scan.cc       listing step directories, the commit rules, temporaries of dead
//                            processes (ListCheckpoints, NewestCommittedCheckpoint);
//   shard_crc.cc             opening shards and checking their CRC-32s (VerifyCheckpointDir);
//   consolidate_plan.cc      options parsing, bf16 rounding, the shard plan;
//   checkpoint_retention.cc  deletion and retention;
//   consolidate.cc           Consolidate itself (staging, copy, publication).
// No LibTorch, no gRPC. Thread-compatible, as consolidate.h.
#ifndef LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_INTERNAL_H_
#define LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "common/file_util.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::storage::consolidate_internal {

inline constexpr char kManifestSuffix[] = ".manifest.json";
inline constexpr char kSafetensorsName[] = "model.safetensors";
inline constexpr char kConfigName[] = "config.json";
inline constexpr char kParamsSection[] = "fp32_params";
inline constexpr char kIndexName[] = "model.safetensors.index.json";
inline constexpr char kStagingPrefix[] = ".consolidate.tmp.";
inline constexpr char kDeletingPrefix[] = ".deleting.";

// Names in `dir` (not "." or ".."), sorted. NOT_FOUND if `dir` does not exist.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir);

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

// Size in bytes of `path`, -1 if it cannot be stat'ed.
int64_t FileSize(const std::string& path);
bool IsDir(const std::string& path);

// One step directory: its CheckpointInfo and the readable manifests by rank.
struct StepScan {
  CheckpointInfo info;
  std::map<int32_t, ShardManifest> manifests;
};

// Applies the commit rules (consolidate.h, CheckpointInfo) to `step_dir`.
absl::StatusOr<StepScan> ScanStep(const std::string& step_dir, int64_t step);
// Every step directory of `checkpoint_dir`, by step ascending (ListCheckpoints' errors).
absl::StatusOr<std::vector<StepScan>> ScanAll(const std::string& checkpoint_dir);
// `step`, or the newest committed one when step == 0 (Consolidate's errors for the selection).
absl::StatusOr<StepScan> SelectStep(const std::string& checkpoint_dir, int64_t step);

// rm -r `path`; OK if it does not exist (or vanishes meanwhile: another process removing it).
// An error names the entry that could not be removed and the OS error (PERMISSION_DENIED for
// EACCES/EPERM, e.g. an immutable file).
absl::Status RemoveTree(const std::string& path);
// Bytes of the regular files under `path` (symbolic links not followed); 0 if it is absent.
int64_t TreeBytes(const std::string& path);
// Removes, in `dir`, "<file>.tmp.<pid>" files and ".consolidate.tmp.<pid>" staging directories
// left by processes that no longer exist.
void RemoveDeadTemporaries(const std::string& dir);

// io_buffer_bytes rounded up to a multiple of 4 bytes, at least 4.
size_t BufferSize(int64_t io_buffer_bytes);

// A byte range of a shard whose CRC-32 is known.
struct CrcPiece {
  int64_t offset = 0;
  int64_t size = 0;
  uint32_t crc = 0;
};

struct OpenShards {
  std::vector<ScopedFd> fds;       // by rank
  std::vector<std::string> paths;  // by rank
};

// Opens every rank's shard and checks its size against the manifest.
absl::StatusOr<OpenShards> OpenShardFiles(const StepScan& scan);

// Checks every shard's CRC-32 against its manifest; DATA_LOSS "<shard path> (rank r): CRC-32 x,
// manifest says y" on a mismatch. With `known`, (*known)[r] are byte ranges of rank r whose
// CRC-32s are already known (the copy read them): only the bytes between them are read, and the
// pieces are combined in file order with zlib's crc32_combine. Overlapping pieces (a malformed
// layout) fall back to a full pass for that rank.
absl::Status VerifyShardCrcs(const StepScan& scan, const OpenShards& shards, size_t chunk_bytes,
                             std::vector<std::vector<CrcPiece>>* known = nullptr);

// Checks every side file the manifests list (ShardManifest::side_files) for size and CRC-32;
// DATA_LOSS "<path> (rank r): ..." naming the first bad one (missing, wrong size, CRC mismatch).
absl::Status VerifySideFiles(const StepScan& scan, size_t chunk_bytes);

}  // namespace loom::storage::consolidate_internal

#endif  // LOOM_STORAGE_CHECKPOINT_CONSOLIDATE_INTERNAL_H_
