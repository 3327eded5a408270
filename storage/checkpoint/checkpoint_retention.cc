// Checkpoint deletion and retention (DeleteCheckpoint, ApplyRetention).
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checkpoint/consolidate_internal.h"

namespace loom::storage {

using consolidate_internal::kDeletingPrefix;
using consolidate_internal::ListDir;
using consolidate_internal::RemoveTree;
using consolidate_internal::ScanAll;
using consolidate_internal::StepScan;
using consolidate_internal::TreeBytes;

namespace {

// Renames step directory `path` (step `step`) of `checkpoint_dir` aside to
// .deleting.<step dir>.<pid>[-<k>] (k when an earlier failed deletion of the same step by this
// process is still there), so no scan sees it as a checkpoint any more. Returns the new path, or
// "" when the directory was already gone (deleted concurrently).
absl::StatusOr<std::string> MoveAside(const std::string& checkpoint_dir, int64_t step,
                                      const std::string& path) {
  const std::string base =
      absl::StrCat(checkpoint_dir, "/", kDeletingPrefix, StepDirName(step), ".", ::getpid());
  for (int k = 0;; ++k) {
    std::string aside = k == 0 ? base : absl::StrCat(base, "-", k);
    if (::rename(path.c_str(), aside.c_str()) == 0) return aside;
    if (errno == ENOENT) return std::string();
    if ((errno != EEXIST && errno != ENOTEMPTY) || k >= 100) {
      return ErrnoError("cannot move aside for deletion", path);
    }
  }
}

// The step of a ".deleting.step_<S>.<suffix>" name, or nullopt.
std::optional<int64_t> PendingStep(const std::string& name) {
  if (!absl::StartsWith(name, kDeletingPrefix)) return std::nullopt;
  const std::string rest = name.substr(sizeof(kDeletingPrefix) - 1);
  return ParseStepDirName(rest.substr(0, rest.find('.')));
}

// Removes the moved-aside trees after one directory sync (so the renames are durable first) and
// syncs once more. Returns those that could not be removed, each with its error. A crash after
// the first sync leaves .deleting.* directories, which the next deletion or retention removes.
absl::StatusOr<std::vector<PendingDeletion>> RemoveMovedAside(
    const std::string& checkpoint_dir, const std::vector<std::pair<int64_t, std::string>>& aside) {
  std::vector<PendingDeletion> failed;
  if (aside.empty()) return failed;
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  for (const auto& [step, path] : aside) {
    absl::Status removed = RemoveTree(path);
    if (!removed.ok()) failed.push_back({step, path, TreeBytes(path), std::move(removed)});
  }
  RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  return failed;
}

}  // namespace

absl::StatusOr<std::vector<PendingDeletion>> ListPendingDeletions(
    const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(checkpoint_dir));
  std::vector<PendingDeletion> pending;
  for (const std::string& n : names) {
    std::optional<int64_t> step = PendingStep(n);
    if (!step.has_value()) continue;
    const std::string path = absl::StrCat(checkpoint_dir, "/", n);
    pending.push_back({*step, path, TreeBytes(path), absl::OkStatus()});
  }
  std::stable_sort(pending.begin(), pending.end(),
                   [](const PendingDeletion& a, const PendingDeletion& b) { return a.step < b.step; });
  return pending;
}

absl::StatusOr<std::vector<PendingDeletion>> RetryPendingDeletions(
    const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(std::vector<PendingDeletion> pending, ListPendingDeletions(checkpoint_dir));
  std::vector<PendingDeletion> remaining;
  bool removed_any = false;
  for (PendingDeletion& p : pending) {
    absl::Status removed = RemoveTree(p.path);
    if (removed.ok()) {
      removed_any = true;
      continue;
    }
    p.bytes = TreeBytes(p.path);
    p.status = std::move(removed);
    remaining.push_back(std::move(p));
  }
  if (removed_any) RETURN_IF_ERROR(SyncDir(checkpoint_dir));
  return remaining;
}

absl::Status DeletionFailures(absl::string_view what, const std::vector<PendingDeletion>& failed) {
  if (failed.empty()) return absl::OkStatus();
  constexpr size_t kMaxNamed = 8;  // the message ends up in RPC errors and job records
  std::string message = absl::StrCat(what, ": cannot delete ", failed.size(), " checkpoint",
                                     failed.size() == 1 ? "" : "s", " (");
  for (size_t i = 0; i < failed.size() && i < kMaxNamed; ++i) {
    absl::StrAppend(&message, i == 0 ? "" : "; ", "step ", failed[i].step, ": ",
                    failed[i].status.message());
  }
  if (failed.size() > kMaxNamed) absl::StrAppend(&message, "; ... ", failed.size(), " in all");
  absl::StrAppend(&message,
                  "); their files stay on disk, listed as delete_failed, until a later deletion "
                  "or retention removes them");
  return absl::Status(failed.front().status.code(), message);
}

absl::StatusOr<DeleteResult> DeleteCheckpoint(const std::string& checkpoint_dir, int64_t step,
                                              const std::vector<int64_t>& protected_steps) {
  if (step <= 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  ASSIGN_OR_RETURN(std::vector<StepScan> scans, ScanAll(checkpoint_dir));
  // Earlier deletions first: a step whose files could not be removed before is retried here
  // instead of being reported "already gone" while its bytes stay on disk.
  ASSIGN_OR_RETURN(std::vector<PendingDeletion> was_pending, ListPendingDeletions(checkpoint_dir));
  ASSIGN_OR_RETURN(std::vector<PendingDeletion> still_pending,
                   RetryPendingDeletions(checkpoint_dir));
  DeleteResult result;
  const StepScan* target = nullptr;
  const StepScan* newest_committed = nullptr;
  for (const StepScan& s : scans) {
    if (s.info.step == step) target = &s;
    if (s.info.committed) newest_committed = &s;
  }
  auto of_step = [step](const PendingDeletion& p) { return p.step == step; };
  std::vector<PendingDeletion> failed;
  std::copy_if(still_pending.begin(), still_pending.end(), std::back_inserter(failed), of_step);
  if (target == nullptr) {
    RETURN_IF_ERROR(DeletionFailures(checkpoint_dir, failed));
    // Removed just now if an earlier deletion had left it pending; else already gone.
    result.deleted = std::any_of(was_pending.begin(), was_pending.end(), of_step);
    return result;
  }
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
  if (!aside.empty()) {
    ASSIGN_OR_RETURN(std::vector<PendingDeletion> left,
                     RemoveMovedAside(checkpoint_dir, {{step, aside}}));
    failed.insert(failed.end(), left.begin(), left.end());
  }
  RETURN_IF_ERROR(DeletionFailures(checkpoint_dir, failed));
  result.deleted = !aside.empty() || std::any_of(was_pending.begin(), was_pending.end(), of_step);
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
  // Earlier deletions first (their steps are no longer in `list`): one whose files could not be
  // removed is retried on every pass, and reported again while it fails.
  ASSIGN_OR_RETURN(std::vector<PendingDeletion> was_pending, ListPendingDeletions(checkpoint_dir));
  ASSIGN_OR_RETURN(result.failed, RetryPendingDeletions(checkpoint_dir));
  std::set<int64_t> deleted;  // pending ones removed now, then the doomed ones of this pass
  for (const PendingDeletion& p : was_pending) deleted.insert(p.step);
  for (const PendingDeletion& p : result.failed) deleted.erase(p.step);
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
    result.deleted_steps.assign(deleted.begin(), deleted.end());
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
  std::vector<std::pair<int64_t, std::string>> aside;
  for (const CheckpointInfo& c : list) {
    if (c.step >= newest || keep.count(c.step) > 0) {
      result.kept_steps.push_back(c.step);
      continue;
    }
    absl::StatusOr<std::string> moved = MoveAside(checkpoint_dir, c.step, c.path);
    if (!moved.ok()) {
      // E.g. the step directory itself is immutable: it stays where it is, still a checkpoint.
      result.failed.push_back({c.step, c.path, c.total_bytes, moved.status()});
      continue;
    }
    if (moved->empty()) continue;  // deleted concurrently
    aside.emplace_back(c.step, *std::move(moved));
  }
  ASSIGN_OR_RETURN(std::vector<PendingDeletion> left, RemoveMovedAside(checkpoint_dir, aside));
  for (const auto& [step, path] : aside) deleted.insert(step);
  for (PendingDeletion& p : left) {
    deleted.erase(p.step);
    result.failed.push_back(std::move(p));
  }
  std::stable_sort(result.failed.begin(), result.failed.end(),
                   [](const PendingDeletion& a, const PendingDeletion& b) { return a.step < b.step; });
  result.deleted_steps.assign(deleted.begin(), deleted.end());
  return result;
}

}  // namespace loom::storage
