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
  // Every doomed step is deleted from this one scan (DeleteCheckpoint's checks hold by
  // construction: the newest committed step and the protected ones are kept above): move them
  // all aside, make the renames durable with one directory sync, then remove the trees and sync
  // once more. Calling DeleteCheckpoint per step re-scanned every step directory and synced the
  // directory twice per step: quadratic in the backlog, so after the checkpoint service had been
  // stopped for 20 s (hundreds of step directories from a fast job) one pass outlasted the RPC
  // deadline, every retry had a larger backlog, and retention never caught up
  // (tests/e2e:liveness_e2e_test). A crash after the first sync leaves .deleting-* directories,
  // removed by the next scan (RemoveInterruptedDeletions), as before.
  RemoveInterruptedDeletions(checkpoint_dir);
  std::vector<std::pair<int64_t, std::string>> doomed;  // (step, moved-aside path)
  for (const CheckpointInfo& c : list) {
    if (c.step >= newest || keep.count(c.step) > 0) {
      result.kept_steps.push_back(c.step);
      continue;
    }
    std::string aside = absl::StrCat(checkpoint_dir, "/", kDeletingPrefix, StepDirName(c.step),
                                     ".", ::getpid());
    if (::rename(c.path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) continue;  // deleted concurrently
      return ErrnoError("cannot move aside for deletion", c.path);
    }
    doomed.emplace_back(c.step, std::move(aside));
  }
  if (doomed.empty()) return result;
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  for (const auto& [step, aside] : doomed) {
    RETURN_IF_ERROR(RemoveTree(aside));
    result.deleted_steps.push_back(step);
  }
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  return result;
}

}  // namespace loom::storage
