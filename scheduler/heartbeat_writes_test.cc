// What a heartbeat writes to the store: nothing for the heartbeat time and rank 0's step
// progress (held in memory, written with a later scheduling cycle's one transaction), at once for
// a new checkpoint step. Regression test for the fsync per heartbeat under the scheduler's lock
// that the control-plane benchmark found (docs/benchmarks.md "Control plane at cluster scale":
// at 200 simulated nodes a heartbeat took 1.3 s at the median).
#include <memory>

#include "gtest/gtest.h"
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

// An in-memory store that counts every write.
class CountingStore final : public JobStore {
 public:
  absl::Status CreateJob(const JobRecord& job) override { ++writes; return inner_.CreateJob(job); }
  absl::Status UpdateJob(const JobRecord& job) override { ++writes; return inner_.UpdateJob(job); }
  absl::Status CreateJobs(const std::vector<JobRecord>& jobs) override {
    ++writes;
    return inner_.CreateJobs(jobs);
  }
  absl::Status UpdateJobs(const std::vector<JobRecord>& jobs) override {
    ++writes;
    return inner_.UpdateJobs(jobs);
  }
  absl::StatusOr<JobRecord> GetJob(const std::string& id) override { return inner_.GetJob(id); }
  absl::StatusOr<std::vector<JobRecord>> ListJobs(loom::v1::JobPhase phase) override {
    return inner_.ListJobs(phase);
  }
  absl::Status UpsertNode(const NodeRecord& node) override {
    ++writes;
    ++node_writes;
    return inner_.UpsertNode(node);
  }
  absl::StatusOr<NodeRecord> GetNode(const std::string& id) override { return inner_.GetNode(id); }
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override { return inner_.ListNodes(); }
  absl::Status WriteMetrics(const std::vector<MetricRow>& rows) override {
    return inner_.WriteMetrics(rows);
  }
  absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after,
                                                     int limit) override {
    return inner_.ListMetrics(job_id, after, limit);
  }

  int writes = 0;
  int node_writes = 0;

 private:
  InMemoryJobStore inner_;
};

class HeartbeatWritesTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    scheduler_.reset();
    auto counting = std::make_unique<CountingStore>();
    counting_ = counting.get();
    store_ = std::move(counting);
    Start();
  }

  RankStatus Stepping(const Job& job, int rank, int64_t step, int64_t checkpoint_step = 0) {
    RankStatus st = Rank(job, rank, loom::v1::RANK_STATE_RUNNING, rank == 0 ? 29500 : 0);
    st.mutable_progress()->set_step(step);
    st.mutable_progress()->set_loss(5.0 - 0.1 * static_cast<double>(step));
    st.mutable_progress()->set_last_checkpoint_step(checkpoint_step);
    return st;
  }

  CountingStore* counting_ = nullptr;
};

TEST_F(HeartbeatWritesTest, StepProgressIsWrittenByTheNextCycleNotByEachHeartbeat) {
  const Job job = RunTwoRankJob();
  counting_->writes = 0;
  counting_->node_writes = 0;
  for (int step = 1; step <= 10; ++step) {
    clock_.Advance(absl::Seconds(1));
    Beat("node-a", {Stepping(job, 0, step)});
    Beat("node-b", {Stepping(job, 1, step)});
    EXPECT_EQ(Get(job.id()).progress().step(), step) << "progress is visible at once";
  }
  EXPECT_EQ(counting_->node_writes, 0) << "heartbeat times are not stored";
  EXPECT_EQ(counting_->writes, 0) << "step progress waits for the cycle's transaction";
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_LT(stored->progress.step(), 10);

  Cycle();
  EXPECT_EQ(counting_->writes, 1) << "one transaction for the cycle";
  stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->progress.step(), 10);
  EXPECT_DOUBLE_EQ(stored->progress.loss(), 4.0);

  // At shutdown the daemon flushes what came after the last cycle.
  clock_.Advance(absl::Seconds(1));
  Beat("node-a", {Stepping(job, 0, 11)});
  ASSERT_TRUE(scheduler_->FlushProgress().ok());
  stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->progress.step(), 11);

  // A restarted scheduler reads it back.
  scheduler_.reset();
  Start();
  EXPECT_EQ(Get(job.id()).progress().step(), 11);
}

// SchedulerOptions::progress_store_interval (default 5 s): a job's progress-only change waits
// for the first cycle at least that long after it, so a job stepping every second is stored at
// most once per interval, not by every cycle (at 2,000 nodes: hundreds of records a cycle).
TEST_F(HeartbeatWritesTest, ProgressIsStoredAtMostOncePerInterval) {
  ASSERT_EQ(SchedulerOptions().progress_store_interval, absl::Seconds(5));
  const Job job = RunTwoRankJob();
  Cycle();  // whatever the placement left to store
  counting_->writes = 0;
  // Steps 1-5 one second apart, a cycle after each: nothing stored while the oldest unstored
  // change (step 1's) is less than 5 s old.
  const absl::Time first_change = clock_.Now() + absl::Seconds(1);
  for (int64_t step = 1; step <= 5; ++step) {
    clock_.Advance(absl::Seconds(1));
    Beat("node-a", {Stepping(job, 0, step)});
    Beat("node-b", {Stepping(job, 1, step)});
    Cycle();
    EXPECT_EQ(counting_->writes, 0) << "step " << step << ", oldest change "
                                    << absl::FormatDuration(clock_.Now() - first_change) << " old";
    EXPECT_EQ(Get(job.id()).progress().step(), step) << "published at once";
  }
  // Step 6, 5 s after step 1: that cycle stores the latest progress, in one write.
  clock_.Advance(absl::Seconds(1));
  Beat("node-a", {Stepping(job, 0, 6)});
  Beat("node-b", {Stepping(job, 1, 6)});
  Cycle();
  EXPECT_EQ(counting_->writes, 1);
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->progress.step(), 6);
  // Stored: the interval starts again from the next change.
  clock_.Advance(absl::Seconds(1));
  Beat("node-a", {Stepping(job, 0, 7)});
  Cycle();
  EXPECT_EQ(counting_->writes, 1);
  // A shutdown stores it whatever its age.
  ASSERT_TRUE(scheduler_->FlushProgress().ok());
  EXPECT_EQ(counting_->writes, 2);
  stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->progress.step(), 7);
}

TEST_F(HeartbeatWritesTest, NewCheckpointStepIsWrittenAtOnce) {
  const Job job = RunTwoRankJob();
  counting_->writes = 0;
  clock_.Advance(absl::Seconds(1));
  Beat("node-a", {Stepping(job, 0, 5, /*checkpoint_step=*/5)});
  EXPECT_EQ(counting_->writes, 1);
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->progress.last_checkpoint_step(), 5);
  EXPECT_EQ(stored->progress.step(), 5);
}

TEST_F(HeartbeatWritesTest, SilentNodeIsStillLostAfterTheTimeout) {
  // The heartbeat time lives in memory only; liveness must still see it.
  Register("node-a", 1);
  Register("node-z", 1);
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat("node-a");
    Cycle();
  }
  int lost = 0, live = 0;
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  for (const auto& n : *nodes) (n.live() ? live : lost) += 1;
  EXPECT_EQ(live, 1);
  EXPECT_EQ(lost, 1);
}

// Issue 53: a killed job keeps the steps rank 0 made between its last heartbeat and its stop
// (the record read step 8119 while the rank's final step, which the dashboards showed, was
// 8199); a later, lower or other-attempt report changes nothing, and the change is stored.
TEST_F(HeartbeatWritesTest, KilledJobKeepsRankZerosFinalStep) {
  const Job job = RunTwoRankJob();
  clock_.Advance(absl::Seconds(1));
  Beat("node-a", {Stepping(job, 0, 10)});
  Beat("node-b", {Stepping(job, 1, 10)});
  ASSERT_TRUE(scheduler_->KillJob(job.id()).ok());
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(Get(job.id()).progress().step(), 10);

  RankStatus stopped = Stepping(job, 0, 14, /*checkpoint_step=*/0);
  stopped.set_state(loom::v1::RANK_STATE_STOPPED);
  Beat("node-a", {stopped});
  EXPECT_EQ(Get(job.id()).progress().step(), 14);
  EXPECT_DOUBLE_EQ(Get(job.id()).progress().loss(), 3.6);
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->progress.step(), 14) << "the final step is stored, not only held";

  // Rank 1's report does not move the job's progress (rank 0 speaks for the job), nor does a
  // report of another attempt.
  RankStatus other = Stepping(job, 1, 20);
  other.set_state(loom::v1::RANK_STATE_STOPPED);
  Beat("node-b", {other});
  RankStatus old_attempt = Stepping(job, 0, 30);
  old_attempt.set_attempt(job.attempt() + 1);
  old_attempt.set_state(loom::v1::RANK_STATE_STOPPED);
  Beat("node-a", {old_attempt});
  EXPECT_EQ(Get(job.id()).progress().step(), 14);
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_CANCELLED);
}

}  // namespace
}  // namespace loom
