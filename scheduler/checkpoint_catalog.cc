#include "scheduler/checkpoint_catalog.h"

#include "absl/strings/str_cat.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/resume_point.h"

namespace loom {

absl::StatusOr<CommittedCheckpoint> LocalCheckpointCatalog::NewestCommitted(
    const std::string& /*job_id*/, const std::string& checkpoint_dir) {
  absl::StatusOr<storage::CheckpointInfo> newest =
      storage::NewestCommittedCheckpoint(checkpoint_dir);
  if (!newest.ok()) {
    // No directory, no checkpoint or none committed: nothing to resume from.
    if (absl::IsNotFound(newest.status()) || absl::IsFailedPrecondition(newest.status())) {
      return absl::NotFoundError(newest.status().message());
    }
    return newest.status();
  }
  return CommittedCheckpoint{newest->step, newest->path};
}

absl::StatusOr<CommittedCheckpoint> LocalCheckpointCatalog::NewestIntact(
    const std::string& /*job_id*/, const std::string& checkpoint_dir) {
  absl::StatusOr<storage::ResumePoint> point = storage::NewestIntactCheckpoint(checkpoint_dir);
  if (!point.ok()) return point.status();
  if (!point->checkpoint.has_value()) {
    return absl::NotFoundError(
        point->skipped.empty()
            ? absl::StrCat("no committed checkpoint in ", checkpoint_dir)
            : absl::StrCat("no intact committed checkpoint in ", checkpoint_dir, "; ",
                           point->SkippedSummary()));
  }
  return CommittedCheckpoint{point->checkpoint->step, point->checkpoint->path,
                             point->SkippedSummary()};
}

absl::StatusOr<std::vector<int64_t>> LocalCheckpointCatalog::ApplyRetention(
    const std::string& /*job_id*/, const std::string& checkpoint_dir,
    const loom::v1::CheckpointPolicy& policy, const std::vector<int64_t>& protected_steps) {
  storage::RetentionPolicy retention;
  retention.keep_last = policy.keep_last();
  retention.keep_best = policy.keep_best();
  if (!policy.best_metric().empty()) retention.best_metric = policy.best_metric();
  absl::StatusOr<storage::RetentionResult> result =
      storage::ApplyRetention(checkpoint_dir, retention, protected_steps);
  if (!result.ok()) return result.status();
  return result->deleted_steps;
}

}  // namespace loom
