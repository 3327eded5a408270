// RetentionWorker on its own, against a catalog whose answers the test controls: it can hold a
// call (a frozen loom-checkpoint) and fail calls with a given status (a service that is down,
// or a request it refuses).
#include "scheduler/retention_worker.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

class ControlledCatalog : public CheckpointCatalog {
 public:
  absl::StatusOr<CommittedCheckpoint> NewestCommitted(const std::string&,
                                                      const std::string&) override {
    return absl::NotFoundError("not used by retention");
  }
  absl::StatusOr<std::vector<int64_t>> ApplyRetention(
      const std::string& job_id, const std::string& dir, const loom::v1::CheckpointPolicy& policy,
      const std::vector<int64_t>& protected_steps) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    in_call_ = true;
    mu_.Await(absl::Condition(+[](bool* frozen) { return !*frozen; }, &frozen_));
    in_call_ = false;
    call_times_.push_back(absl::Now());
    if (failures_left_ > 0) {
      --failures_left_;
      return failure_;
    }
    applied_.push_back(job_id + ":" + dir + ":" + std::to_string(policy.keep_last()));
    protected_ = protected_steps;
    return std::vector<int64_t>{1, 2};  // "deleted" steps 1 and 2
  }
  void Freeze(bool frozen) {
    absl::MutexLock lock(&mu_);
    frozen_ = frozen;
  }
  void Fail(int n, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_left_ = n;
    failure_ = std::move(status);
  }
  bool AwaitCalls(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }
  bool AwaitInCall() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&in_call_), absl::Seconds(30));
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<std::string> applied() {
    absl::MutexLock lock(&mu_);
    return applied_;
  }
  std::vector<int64_t> protected_steps() {
    absl::MutexLock lock(&mu_);
    return protected_;
  }
  std::vector<absl::Time> call_times() {
    absl::MutexLock lock(&mu_);
    return call_times_;
  }

 private:
  absl::Mutex mu_;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  bool in_call_ ABSL_GUARDED_BY(mu_) = false;
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> applied_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> protected_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> call_times_ ABSL_GUARDED_BY(mu_);
};

RetentionWorker::Task KeepLast(int n, const std::string& dir = "/ckpt/job") {
  RetentionWorker::Task t;
  t.checkpoint_dir = dir;
  t.policy.set_keep_last(n);
  return t;
}

TEST(RetentionWorkerTest, AppliesTheTaskWithItsProtectedSteps) {
  ControlledCatalog catalog;
  RetentionWorker worker(&catalog, absl::Milliseconds(10), absl::Milliseconds(40));
  RetentionWorker::Task task = KeepLast(2, "/ckpt/job-a");
  task.protected_steps = {40};
  worker.Request("job-a", task);
  worker.WaitIdle();
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-a:/ckpt/job-a:2"});
  EXPECT_EQ(catalog.protected_steps(), std::vector<int64_t>{40});
  const RetentionWorker::Stats stats = worker.stats();
  EXPECT_EQ(stats.applied, 1);
  EXPECT_EQ(stats.deleted_steps, 2);
  EXPECT_EQ(stats.retries, 0);
  EXPECT_EQ(worker.Backlog(), 0);
}

TEST(RetentionWorkerTest, AFrozenServiceNeverBlocksTheCallerAndRetentionCatchesUp) {
  ControlledCatalog catalog;
  catalog.Freeze(true);
  RetentionWorker worker(&catalog, absl::Milliseconds(10), absl::Milliseconds(40));
  worker.Request("job-a", KeepLast(1));
  ASSERT_TRUE(catalog.AwaitInCall());  // the worker's thread is stuck in the frozen service
  // The caller's thread is not: more requests queue at once (the test would hang otherwise).
  for (int i = 0; i < 100; ++i) worker.Request("job-" + std::to_string(i % 10), KeepLast(3));
  EXPECT_EQ(worker.Backlog(), 10);  // one per job: the latest request per job wins
  catalog.Freeze(false);
  worker.WaitIdle();
  EXPECT_EQ(catalog.applied().size(), 11u);  // job-a's frozen call, then one per job
  EXPECT_EQ(worker.Backlog(), 0);
}

TEST(RetentionWorkerTest, TransientFailuresAreRetriedWithExponentialBackoff) {
  ControlledCatalog catalog;
  catalog.Fail(4, absl::UnavailableError("loom-checkpoint: connection refused"));
  RetentionWorker worker(&catalog, absl::Milliseconds(20), absl::Milliseconds(80));
  worker.Request("job-a", KeepLast(3));
  worker.WaitIdle();
  EXPECT_EQ(catalog.calls(), 5);
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-a:/ckpt/job:3"});
  EXPECT_EQ(worker.stats().retries, 4);
  // Gaps of at least 20, 40, 80 and 80 ms (capped at retry_max).
  const std::vector<absl::Time> t = catalog.call_times();
  ASSERT_EQ(t.size(), 5u);
  const int64_t expected_ms[] = {20, 40, 80, 80};
  for (int i = 0; i < 4; ++i) {
    EXPECT_GE(absl::ToInt64Milliseconds(t[i + 1] - t[i]), expected_ms[i]) << "retry " << i + 1;
  }
}

TEST(RetentionWorkerTest, APermanentErrorIsDroppedNotRetried) {
  ControlledCatalog catalog;
  catalog.Fail(1, absl::InvalidArgumentError("checkpoint.keep_last: must be >= 1"));
  RetentionWorker worker(&catalog, absl::Milliseconds(10), absl::Milliseconds(40));
  worker.Request("job-a", KeepLast(0));
  worker.WaitIdle();
  EXPECT_EQ(catalog.calls(), 1);
  EXPECT_TRUE(catalog.applied().empty());
  EXPECT_EQ(worker.stats().dropped, 1);
  EXPECT_EQ(worker.Backlog(), 0);
}

TEST(RetentionWorkerTest, ANewerRequestReplacesARetryingOneAndKeepsItsBackoff) {
  ControlledCatalog catalog;
  catalog.Fail(1000000, absl::UnavailableError("down"));
  RetentionWorker worker(&catalog, absl::Milliseconds(10), absl::Milliseconds(40));
  worker.Request("job-a", KeepLast(1));
  ASSERT_TRUE(catalog.AwaitCalls(2));  // failed, and retried
  worker.Request("job-a", KeepLast(2));
  EXPECT_EQ(worker.Backlog(), 1);
  catalog.Fail(0, absl::OkStatus());
  worker.WaitIdle();
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-a:/ckpt/job:2"});
}

// Issue 42 defect 4: a deletion that fails (a step whose files cannot be removed) was logged in
// the scheduler's log and dropped. Now the job's owner is told (once per distinct error, and
// once more when it clears) and the pass is retried until the step is gone.
TEST(RetentionWorkerTest, AFailedDeletionIsReportedOnceRetriedAndClearedWhenItSucceeds) {
  ControlledCatalog catalog;
  const absl::Status stuck = absl::PermissionDeniedError(
      "retention of job 'job-a': cannot delete 1 checkpoint (step 20: cannot remove "
      "/ckpt/job-a/.deleting.step_00000020.7/rank_0.shard: Operation not permitted)");
  catalog.Fail(3, stuck);
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Status>> reports;
  RetentionWorker worker(&catalog, absl::Milliseconds(10), absl::Milliseconds(40),
                         [&](const std::string& job_id, const absl::Status& status) {
                           absl::MutexLock lock(&mu);
                           reports.emplace_back(job_id, status);
                         });
  worker.Request("job-a", KeepLast(1));
  worker.WaitIdle();
  EXPECT_EQ(catalog.calls(), 4);  // three failures, each retried, then the step went
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-a:/ckpt/job:1"});
  absl::MutexLock lock(&mu);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].first, "job-a");
  EXPECT_EQ(reports[0].second, stuck);  // the same error three times: reported once
  EXPECT_EQ(reports[1].first, "job-a");
  EXPECT_TRUE(reports[1].second.ok());
  const RetentionWorker::Stats stats = worker.stats();
  EXPECT_EQ(stats.retries, 3);
  EXPECT_EQ(stats.reported, 1);
  EXPECT_EQ(stats.dropped, 0);
}

TEST(RetentionWorkerTest, AnUnreachableServiceIsNotReportedToTheJob) {
  ControlledCatalog catalog;
  catalog.Fail(2, absl::UnavailableError("loom-checkpoint: connection refused"));
  int reports = 0;
  RetentionWorker worker(&catalog, absl::Milliseconds(10), absl::Milliseconds(40),
                         [&](const std::string&, const absl::Status&) { ++reports; });
  worker.Request("job-a", KeepLast(1));
  worker.WaitIdle();
  EXPECT_EQ(catalog.calls(), 3);
  EXPECT_EQ(reports, 0);
}

}  // namespace
}  // namespace loom
