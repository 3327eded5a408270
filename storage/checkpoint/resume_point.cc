#include "storage/checkpoint/resume_point.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "storage/checkpoint/corrupt_mark.h"

namespace loom::storage {

std::string ResumePoint::SkippedSummary() const {
  std::string out;
  for (const SkippedCheckpoint& s : skipped) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "skipped step ", s.step, " (", s.reason, ")");
  }
  return out;
}

absl::StatusOr<CheckpointInfo> VerifyAndMarkCorrupt(const std::string& step_dir) {
  absl::StatusOr<CheckpointInfo> verified = VerifyCheckpointDir(step_dir);
  if (verified.ok() || !absl::IsDataLoss(verified.status())) return verified;
  if (!CorruptMarkReason(step_dir).has_value()) {  // not marked yet
    absl::Status marked =
        MarkCheckpointCorrupt(step_dir, std::string(verified.status().message()));
    if (!marked.ok()) {
      LOG(WARNING) << "cannot mark " << step_dir << " corrupt: " << marked;
    } else {
      LOG(WARNING) << "marked " << step_dir << " corrupt: " << verified.status().message();
    }
  }
  return verified.status();
}

absl::StatusOr<ResumePoint> NewestIntactCheckpoint(const std::string& checkpoint_dir) {
  ResumePoint point;
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(checkpoint_dir);
  if (absl::IsNotFound(list.status())) return point;
  if (!list.ok()) return list.status();
  for (auto it = list->rbegin(); it != list->rend(); ++it) {
    if (it->corrupt) {
      point.skipped.push_back({it->step, it->path, absl::StrCat("marked corrupt: ", it->corrupt_reason)});
      continue;
    }
    if (!it->committed) {
      // A damaged step (an unreadable manifest, a shard of the wrong size: DATA_LOSS) is named
      // like a corrupt one; it used to be passed over in silence, like a partial one.
      if (absl::IsDataLoss(it->commit_status)) {
        point.skipped.push_back({it->step, it->path, std::string(it->commit_status.message())});
      }
      continue;  // partial: being written, or abandoned
    }
    absl::StatusOr<CheckpointInfo> verified = VerifyAndMarkCorrupt(it->path);
    if (verified.ok()) {
      point.checkpoint = *std::move(verified);
      return point;
    }
    if (absl::IsDataLoss(verified.status())) {
      point.skipped.push_back({it->step, it->path, std::string(verified.status().message())});
      continue;
    }
    if (absl::IsNotFound(verified.status()) || absl::IsFailedPrecondition(verified.status())) {
      continue;  // deleted or rewritten meanwhile
    }
    return verified.status();
  }
  return point;
}

}  // namespace loom::storage
