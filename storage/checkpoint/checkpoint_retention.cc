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

namespace {

// Renames step directory `path` (step `step`) of `checkpoint_dir` aside to
// .deleting.<step dir>.<pid>, so no scan sees it as a checkpoint any more. Returns the new
// path, or "" when the directory was already gone (deleted concurrently).
absl::StatusOr<std::string> MoveAside(const std::string& checkpoint_dir, int64_t step,
                                      const std::string& path) {
  std::string aside =
      absl::StrCat(checkpoint_dir, "/", kDeletingPrefix, StepDirName(step), ".", ::getpid());
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    if (errno == ENOENT) return std::string();
    return ErrnoError("cannot move aside for deletion", path);
  }
  return aside;
}

// Makes the renames durable (one directory sync), removes the moved-aside trees and syncs once
// more. A crash after the first sync leaves .deleting.* directories, which the next scan
// removes (RemoveInterruptedDeletions).
absl::Status RemoveMovedAside(const std::string& checkpoint_dir,
                              const std::vector<std::string>& aside) {
  if (aside.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  for (const std::string& path : aside) RETURN_IF_ERROR(RemoveTree(path));
  return SyncDir(checkpoint_dir);
}

}  // namespace

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
  ASSIGN_OR_RETURN(std::string aside, MoveAside(checkpoint_dir, step, target->info.path));
  if (aside.empty()) return result;  // deleted concurrently
  RETURN_IF_ERROR(RemoveMovedAside(checkpoint_dir, {aside}));
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
  // construction: the newest committed step and the protected ones are kept above), all moved
  // aside before one pair of directory syncs. Calling DeleteCheckpoint per step re-scanned every
  // step directory and synced twice per step: quadratic in the backlog, so after the checkpoint
  // service had been stopped for 20 s (hundreds of step directories from a fast job) one pass
  // outlasted the RPC deadline and retention never caught up (tests/e2e:liveness_e2e_test).
  RemoveInterruptedDeletions(checkpoint_dir);
  std::vector<std::string> aside;
  std::vector<int64_t> doomed;
  for (const CheckpointInfo& c : list) {
    if (c.step >= newest || keep.count(c.step) > 0) {
      result.kept_steps.push_back(c.step);
      continue;
    }
    ASSIGN_OR_RETURN(std::string moved, MoveAside(checkpoint_dir, c.step, c.path));
    if (moved.empty()) continue;  // deleted concurrently
    aside.push_back(std::move(moved));
    doomed.push_back(c.step);
  }
  RETURN_IF_ERROR(RemoveMovedAside(checkpoint_dir, aside));
  result.deleted_steps = std::move(doomed);
  return result;
}

}  // namespace loom::storage
