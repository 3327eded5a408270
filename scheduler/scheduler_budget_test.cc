// Gang-ready timeouts with backoff, separate restart budgets, cordon and drain, durability of
// all of it across a restart, and group commit of submissions (scheduler_policy_test_fixture.h).
#include "scheduler/scheduler_policy_test_fixture.h"

namespace loom {
namespace {

TEST_F(PolicyTest, ReadyTimeoutTearsDownAndBacksOffExponentially) {
  options_.ready_timeout = absl::Minutes(1);
  options_.ready_backoff_base = absl::Seconds(10);
  options_.ready_backoff_cap = absl::Seconds(25);
  scheduler_.reset();
  Start();
  start_running_ = false;  // ranks stay STARTING forever
  Register("node-a", 1);
  loom::v1::JobSpec spec = Spec(1);
  spec.set_max_infra_restarts(3);
  const std::string j = Submit(spec);
  absl::Duration expected_backoff[] = {absl::Seconds(10), absl::Seconds(20), absl::Seconds(25)};
  for (int k = 0; k < 3; ++k) {
    Settle(1);
    ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_STARTING) << k;
    EXPECT_EQ(Get(j).attempt(), k + 1);
    clock_.Advance(absl::Seconds(61));
    Settle(1);  // timeout: ranks stopped, RECOVERING with a backoff
    Job torn = Get(j);
    EXPECT_EQ(torn.phase(), loom::v1::JOB_PHASE_RECOVERING) << k;
    EXPECT_EQ(torn.infra_restarts(), k + 1);
    EXPECT_EQ(torn.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
    absl::StatusOr<JobRecord> stored = store_->GetJob(j);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->state.ready_timeouts(), k + 1);
    EXPECT_EQ(absl::FromUnixMicros(stored->state.not_before_us()),
              clock_.Now() + expected_backoff[k]);
    Settle(2);  // the slot is free, but the backoff holds the job
    EXPECT_EQ(Get(j).reason(), "Backoff");
    EXPECT_EQ(Get(j).phase(), loom::v1::JOB_PHASE_RECOVERING);
    clock_.Advance(expected_backoff[k]);
  }
  // The fourth timeout exceeds the infra budget of 3.
  Settle(1);
  clock_.Advance(absl::Seconds(61));
  Settle(1);
  Job failed = Get(j);
  EXPECT_EQ(failed.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(failed.reason(), "ReadyTimeout");
  EXPECT_NE(failed.message().find("all 3 infra restarts used"), std::string::npos)
      << failed.message();
}

TEST_F(PolicyTest, UserAndInfraFailuresUseSeparateBudgets) {
  Register("node-a", 1);
  Register("node-b", 1);
  loom::v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(0);
  spec.set_max_infra_restarts(-1);  // the scheduler's default (3)
  const std::string j = Submit(spec);
  Settle(4);
  ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_RUNNING);
  const std::string first_node = Get(j).rank_nodes(0);
  const std::string other = first_node == "node-a" ? "node-b" : "node-a";
  // The node goes silent: lost, an infra failure with restarts left.
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(absl::Seconds(1));
    WorkerBeat(other);
    Cycle();
  }
  // Lost at 11 s; the same cycle placed attempt 2 on the other node.
  Job recovering = Get(j);
  EXPECT_EQ(recovering.attempt(), 2);
  EXPECT_EQ(recovering.infra_restarts(), 1);
  EXPECT_NE(recovering.message().find("lost: no heartbeat for 11s"), std::string::npos)
      << recovering.message();
  EXPECT_NE(recovering.message().find("infra restart 1 of 3"), std::string::npos)
      << recovering.message();
  workers_.erase(first_node);
  for (int i = 0; i < 4; ++i) {
    WorkerBeat(other);
    Cycle();
  }
  Job second = Get(j);
  ASSERT_EQ(second.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(second.rank_nodes(0), other);
  // A user failure finds max_restarts = 0: FAILED although infra restarts are left.
  workers_[other].begin()->second.set_state(loom::v1::RANK_STATE_FAILED);
  workers_[other].begin()->second.set_exit_code(1);
  WorkerBeat(other);
  Job failed = Get(j);
  EXPECT_EQ(failed.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(failed.failure_class(), loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(failed.user_restarts(), 0);
  EXPECT_EQ(failed.infra_restarts(), 1);
}

TEST_F(PolicyTest, DrainRequeuesJobsElsewhereWithoutUsingBudgets) {
  Register("node-a", 2);
  Register("node-b", 2);
  const std::string j = Submit(Spec(2));
  Settle(4);
  ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_RUNNING);
  const std::string node = Get(j).rank_nodes(0);
  const std::string other = node == "node-a" ? "node-b" : "node-a";
  absl::StatusOr<loom::v1::DrainNodeResponse> drained = scheduler_->DrainNode(node, "kernel update");
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_EQ(drained->requeued_job_ids_size(), 1);
  EXPECT_EQ(drained->requeued_job_ids(0), j);
  EXPECT_TRUE(drained->node().cordoned());
  EXPECT_TRUE(drained->node().draining());
  Job requeued = Get(j);
  EXPECT_EQ(requeued.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(requeued.reason(), "Drained");
  Settle(5);
  Job moved = Get(j);
  EXPECT_EQ(moved.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(moved.attempt(), 2);
  for (const std::string& n : moved.rank_nodes()) EXPECT_EQ(n, other);
  EXPECT_EQ(moved.user_restarts() + moved.infra_restarts() + moved.preemptions(), 0);
  // Re-registration keeps the cordon; ListNodes shows it.
  Register(node, 2);
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  for (const auto& n : *nodes) {
    if (n.node_id() == node) {
      EXPECT_TRUE(n.cordoned());
      EXPECT_EQ(n.admin_reason(), "kernel update");
      EXPECT_EQ(n.used_slots(), 0);
    } else {
      EXPECT_EQ(n.used_slots(), 2);
      EXPECT_EQ(n.job_ids_size(), 1);
    }
  }
  EXPECT_EQ(scheduler_->DrainNode("ghost", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PolicyTest, CordonsBackoffBudgetsAndQueuesSurviveARestart) {
  const std::string db = TmpDir() + "/policy_restart.db";
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  store_ = std::move(*sqlite);
  options_.ready_timeout = absl::Minutes(1);
  UseQueues("queues: [{name: qa, tenant: t1, quota: {cpu: 4}}]");
  start_running_ = false;
  Register("node-a", 2);
  Register("node-b", 2);
  ASSERT_TRUE(scheduler_->CordonNode("node-b", "flaky NIC").ok());
  loom::v1::JobSpec spec = Spec(1, 3, "qa");
  spec.set_max_infra_restarts(2);
  const std::string j = Submit(spec, "t1");
  Settle(1);
  clock_.Advance(absl::Seconds(61));
  Settle(1);
  ASSERT_EQ(Get(j).reason(), "ReadyTimeout");

  scheduler_.reset();
  Start();
  Cycle();
  Job after = Get(j);
  EXPECT_EQ(after.reason(), "Backoff");
  EXPECT_EQ(after.infra_restarts(), 1);
  EXPECT_EQ(after.tenant(), "t1");
  EXPECT_EQ(after.spec().queue(), "qa");
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_FALSE((*nodes)[0].cordoned());
  EXPECT_TRUE((*nodes)[1].cordoned());
  EXPECT_EQ((*nodes)[1].admin_reason(), "flaky NIC");
  // After the backoff it is placed again, not on the cordoned node.
  clock_.Advance(absl::Seconds(11));
  Settle(1);
  Job placed = Get(j);
  EXPECT_EQ(placed.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(placed.attempt(), 2);
  EXPECT_EQ(placed.rank_nodes(0), "node-a");
  absl::StatusOr<std::vector<loom::v1::QueueInfo>> queues = scheduler_->ListQueues();
  ASSERT_TRUE(queues.ok());
  EXPECT_EQ((*queues)[0].usage().at("cpu"), 1);
}

// Group commit: concurrent submissions share transactions; every acknowledged job is stored
// with a unique id and sequence, and request ids stay idempotent.
TEST_F(PolicyTest, ConcurrentSubmissionsAreGroupCommitted) {
  const std::string db = TmpDir() + "/group_commit.db";
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  store_ = std::move(*sqlite);
  scheduler_.reset();
  Start();
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // Threads 0 and 1 use the same request ids: one job each, whoever wins.
        const std::string request = t < 2 ? absl::StrCat("shared-", i) : "";
        absl::StatusOr<Job> job = scheduler_->SubmitJob(Spec(1), request);
        while (job.status().code() == absl::StatusCode::kUnavailable) {
          job = scheduler_->SubmitJob(Spec(1), request);  // the other one is committing it
        }
        ASSERT_TRUE(job.ok()) << job.status();
        ids[t].push_back(job->id());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> unique;
  for (const auto& v : ids) unique.insert(v.begin(), v.end());
  EXPECT_EQ(unique.size(), static_cast<size_t>((kThreads - 1) * kEach));
  EXPECT_EQ(ids[0], ids[1]);
  absl::StatusOr<std::vector<JobRecord>> stored = store_->ListJobs();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), unique.size());
  std::set<int64_t> sequences;
  for (const JobRecord& r : *stored) sequences.insert(r.sequence);
  EXPECT_EQ(sequences.size(), stored->size());
}

// A drained job whose node dies while its ranks are being stopped stays PENDING (no attempt is
// running that could fail), and the cycle goes on for the other jobs.
TEST_F(PolicyTest, NodeLostWhileARequeuedJobStopsIsHarmless) {
  Register("node-a", 1);
  Register("node-b", 1);
  Register("node-c", 1);
  const std::string j = Submit(Spec(1));
  const std::string k = Submit(Spec(1));
  Settle(4);
  ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_RUNNING);
  ASSERT_EQ(Phase(k), loom::v1::JOB_PHASE_RUNNING);
  const std::string node = Get(j).rank_nodes(0);
  ASSERT_TRUE(scheduler_->DrainNode(node, "").ok());
  workers_.erase(node);
  for (int i = 0; i < 12; ++i) {  // node goes silent; the others keep heartbeating
    clock_.Advance(absl::Seconds(1));
    for (const std::string& n : Nodes()) {
      if (n != node) WorkerBeat(n);
    }
    ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()) << i;
  }
  Job moved = Get(j);
  EXPECT_EQ(moved.attempt(), 2);
  EXPECT_EQ(moved.user_restarts() + moved.infra_restarts(), 0);
  EXPECT_NE(moved.rank_nodes(0), node);
  EXPECT_EQ(Phase(k), loom::v1::JOB_PHASE_RUNNING);
}

}  // namespace
}  // namespace loom
