// Checkpoint deletion and retention (DeleteCheckpoint, ApplyRetention).
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate_internal.h"

namespace loom::storage {

using consolidate_internal::kDeletingPrefix;
using consolidate_internal::RemoveInterruptedDeletions;
using consolidate_internal::RemoveTree;
using consolidate_internal::ScanAll;
using consolidate_internal::StepScan;

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
