// Choosing the checkpoint a restarted attempt resumes from: the newest committed step whose
// shards pass their CRC-32 check. A committed step that fails it (a byte flipped on disk after the
// commit) is marked corrupt (corrupt_mark.h) and skipped, so that no attempt resumes from it
// again, listings show it as corrupt, and the step before it is used. No LibTorch, no gRPC.
//
// Cost: verifying reads every shard of the chosen step once (streamed, one I/O buffer), plus those
// of the newer corrupt ones. Callers must not hold locks others wait on meanwhile.
// Thread-safe (no shared state; concurrent marks of one step are atomic file replacements).
#ifndef LOOM_STORAGE_CHECKPOINT_RESUME_POINT_H_
#define LOOM_STORAGE_CHECKPOINT_RESUME_POINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/checkpoint/consolidate.h"

namespace loom::storage {

// A committed step newer than the resume point that was not used, and why.
struct SkippedCheckpoint {
  int64_t step = 0;
  std::string path;
  std::string reason;  // the verification error (names the file and rank)
};

struct ResumePoint {
  // The newest intact committed checkpoint; nullopt when there is none (start over).
  std::optional<CheckpointInfo> checkpoint;
  // Steps newer than `checkpoint` that are marked corrupt (now or earlier), newest first.
  std::vector<SkippedCheckpoint> skipped;
  // "skipped step 8 (<reason>)" for each skipped step, joined by "; " ("" if none).
  std::string SkippedSummary() const;
};

// Verifies `step_dir` (VerifyCheckpointDir) and, when it fails with DATA_LOSS (CRC-32 or size
// mismatch, unreadable manifest), marks it corrupt before returning that error. Other errors
// (NOT_FOUND, FAILED_PRECONDITION for an uncommitted step, INVALID_ARGUMENT) mark nothing.
absl::StatusOr<CheckpointInfo> VerifyAndMarkCorrupt(const std::string& step_dir);

// The resume point of `checkpoint_dir`: newest committed steps first, each verified
// (VerifyAndMarkCorrupt) until one passes. A missing directory or no committed checkpoint is OK
// with no checkpoint. Errors other than DATA_LOSS from verification (I/O) are returned: the
// caller should retry rather than start over.
absl::StatusOr<ResumePoint> NewestIntactCheckpoint(const std::string& checkpoint_dir);

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_RESUME_POINT_H_
