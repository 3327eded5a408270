// CheckpointWorker against a catalog whose answers the test controls: it can hold calls (a
// frozen loom-checkpoint) and fail them with UNAVAILABLE (a service that is down).
#include "scheduler/checkpoint_worker.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

class ControlledCatalog : public CheckpointCatalog {
 public:
  absl::StatusOr<CommittedCheckpoint> NewestCommitted(const std::string& job_id,
                                                      const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    ++lookups_;
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !frozen_; };
    mu_.Await(absl::Condition(&open));
    if (failures_left_ > 0) {
      --failures_left_;
      return absl::UnavailableError("loom-checkpoint: connection refused");
    }
    return CommittedCheckpoint{step_, dir + "/step_" + std::to_string(step_), ""};
  }
  absl::StatusOr<std::vector<int64_t>> ApplyRetention(const std::string& job_id,
                                                      const std::string& dir,
                                                      const loom::v1::CheckpointPolicy& policy,
                                                      const std::vector<int64_t>&) override {
    absl::MutexLock lock(&mu_);
    ++retentions_;
    if (failures_left_ > 0) {
      --failures_left_;
      return absl::UnavailableError("loom-checkpoint: connection refused");
    }
    applied_.push_back(job_id + ":" + std::to_string(policy.keep_last()));
    return std::vector<int64_t>{};
  }
  void Freeze(bool frozen) {
    absl::MutexLock lock(&mu_);
    frozen_ = frozen;
  }
  void FailNext(int n) {
    absl::MutexLock lock(&mu_);
    failures_left_ = n;
  }
  int lookups() {
    absl::MutexLock lock(&mu_);
    return lookups_;
  }
  int retentions() {
    absl::MutexLock lock(&mu_);
    return retentions_;
  }
  std::vector<std::string> applied() {
    absl::MutexLock lock(&mu_);
    return applied_;
  }
  // Waits (deadline 30 s) until at least `n` lookups / retention calls were made.
  bool AwaitCalls(int lookups, int retentions) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return lookups_ >= lookups && retentions_ >= retentions;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }
  int64_t step_ = 8;

 private:
  absl::Mutex mu_;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int retentions_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> applied_ ABSL_GUARDED_BY(mu_);
};

CheckpointWorkerOptions FastRetries() {
  CheckpointWorkerOptions o;
  o.retry_initial = absl::Milliseconds(10);
  o.retry_max = absl::Milliseconds(40);
  return o;
}

CheckpointWorker::RetentionTask KeepLast(int n) {
  CheckpointWorker::RetentionTask t;
  t.checkpoint_dir = "/ckpt/job";
  t.policy.set_keep_last(n);
  return t;
}

TEST(CheckpointWorkerTest, ResumeLookupIsAnsweredOffTheCallersThread) {
  ControlledCatalog catalog;
  CheckpointWorker worker(&catalog, FastRetries());
  EXPECT_TRUE(worker.RequestResume("job-a", 1, "/ckpt/job-a"));
  EXPECT_FALSE(worker.RequestResume("job-a", 1, "/ckpt/job-a"));  // already queued or answered
  ASSERT_TRUE(worker.AwaitResume({{"job-a", 1}}, absl::Seconds(30)));
  std::optional<CheckpointWorker::ResumeAnswer> a = worker.Resume("job-a", 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->definite);
  ASSERT_TRUE(a->result.ok());
  EXPECT_EQ(a->result->step, 8);
  EXPECT_EQ(a->result->path, "/ckpt/job-a/step_8");
  EXPECT_FALSE(worker.Resume("job-a", 2).has_value());  // another attempt: not answered
  EXPECT_FALSE(worker.RequestResume("job-a", 1, "/ckpt/job-a"));  // fresh definite answer reused
  EXPECT_EQ(catalog.lookups(), 1);
}

TEST(CheckpointWorkerTest, FrozenCatalogDelaysOnlyTheLookupAndRetentionStillRuns) {
  ControlledCatalog catalog;
  CheckpointWorker worker(&catalog, FastRetries());
  catalog.Freeze(true);
  worker.RequestResume("job-a", 1, "/ckpt/job-a");
  const absl::Time before = absl::Now();
  EXPECT_FALSE(worker.AwaitResume({{"job-a", 1}}, absl::Milliseconds(100)));
  EXPECT_LT(absl::Now() - before, absl::Seconds(5));  // bounded by the caller's timeout
  EXPECT_FALSE(worker.Resume("job-a", 1).has_value());
  // Retention has its own thread: not stuck behind the frozen lookup.
  worker.RequestRetention("job-b", KeepLast(2));
  worker.WaitForRetention();
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-b:2"});
  catalog.Freeze(false);
  ASSERT_TRUE(worker.AwaitResume({{"job-a", 1}}, absl::Seconds(30)));
  EXPECT_TRUE(worker.Resume("job-a", 1)->definite);
}

TEST(CheckpointWorkerTest, FailedLookupShowsItsErrorAndIsRetriedWithBackoff) {
  ControlledCatalog catalog;
  catalog.FailNext(3);
  CheckpointWorker worker(&catalog, FastRetries());
  worker.RequestResume("job-a", 1, "/ckpt/job-a");
  ASSERT_TRUE(worker.AwaitResume({{"job-a", 1}}, absl::Seconds(30)));
  std::optional<CheckpointWorker::ResumeAnswer> a = worker.Resume("job-a", 1);
  ASSERT_TRUE(a.has_value());
  // The first answer is the error (the job's reason shows it) or, if the retries were quicker
  // than this check, the definite answer after them.
  if (!a->definite) {
    EXPECT_TRUE(absl::IsUnavailable(a->result.status())) << a->result.status();
  }
  ASSERT_TRUE(catalog.AwaitCalls(4, 0));
  // The 4th call answered; its answer is stored right after the call returns.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!worker.Resume("job-a", 1)->definite && absl::Now() < deadline) {
    worker.AwaitResume({{"job-a", 1}}, absl::Milliseconds(10));
  }
  ASSERT_TRUE(worker.Resume("job-a", 1)->definite);
  EXPECT_EQ(worker.Resume("job-a", 1)->result->step, 8);
  EXPECT_EQ(catalog.lookups(), 4);  // 3 failures, then the answer
}

TEST(CheckpointWorkerTest, RetentionCatchesUpAfterTheServiceAnswersAgain) {
  ControlledCatalog catalog;
  catalog.FailNext(4);
  CheckpointWorker worker(&catalog, FastRetries());
  worker.RequestRetention("job-a", KeepLast(3));
  worker.WaitForRetention();  // waits through the retries
  EXPECT_EQ(catalog.retentions(), 5);
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-a:3"});
  EXPECT_EQ(worker.RetentionBacklog(), 0);
}

TEST(CheckpointWorkerTest, NewerRetentionRequestReplacesAQueuedOne) {
  ControlledCatalog catalog;
  catalog.FailNext(1000000);  // down until told otherwise
  CheckpointWorker worker(&catalog, FastRetries());
  worker.RequestRetention("job-a", KeepLast(1));
  ASSERT_TRUE(catalog.AwaitCalls(0, 2));  // failed, and retried
  worker.RequestRetention("job-a", KeepLast(2));
  catalog.FailNext(0);
  worker.WaitForRetention();
  // Only the newest request was applied (the failed keep_last 1 was replaced).
  EXPECT_EQ(catalog.applied(), std::vector<std::string>{"job-a:2"});
}

TEST(CheckpointWorkerTest, RetainResumeDropsLookupsOfJobsNoLongerWaiting) {
  ControlledCatalog catalog;
  CheckpointWorker worker(&catalog, FastRetries());
  worker.RequestResume("job-a", 1, "/ckpt/job-a");
  ASSERT_TRUE(worker.AwaitResume({{"job-a", 1}}, absl::Seconds(30)));
  worker.RetainResume({});
  EXPECT_FALSE(worker.Resume("job-a", 1).has_value());
  EXPECT_TRUE(worker.RequestResume("job-a", 1, "/ckpt/job-a"));  // asked again
}

}  // namespace
}  // namespace loom
