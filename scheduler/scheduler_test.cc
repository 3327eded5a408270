#include "scheduler/scheduler.h"

#include <prometheus/registry.h>

#include <cstdlib>
#include <memory>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/test_job_spec.h"
#include "storage/in_memory_job_store.h"
#include "storage/sqlite_job_store.h"

namespace loom {
namespace {

using loom::v1::HeartbeatRequest;
using loom::v1::HeartbeatResponse;
using loom::v1::Job;
using loom::v1::RankState;
using loom::v1::RankStatus;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

// Value of the series of `name` whose labels include `label`=`value` (-1 if absent).
double MetricValue(prometheus::Registry& registry, const std::string& name,
                   const std::string& label = "", const std::string& value = "") {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      bool match = label.empty();
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == label && l.value == value) match = true;
      }
      if (!match) continue;
      if (family.type == prometheus::MetricType::Counter) return m.counter.value;
      if (family.type == prometheus::MetricType::Gauge) return m.gauge.value;
      if (family.type == prometheus::MetricType::Histogram) {
        return static_cast<double>(m.histogram.sample_count);
      }
    }
  }
  return -1;
}

RankStatus Rank(const Job& job, int rank, RankState state, int port = 0) {
  RankStatus st;
  st.set_job_id(job.id());
  st.set_attempt(job.attempt());
  st.set_rank(rank);
  st.set_state(state);
  st.set_rendezvous_port(port);
  return st;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_root = TmpDir() + "/ckpt";
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    store_ = std::make_unique<InMemoryJobStore>();
    Start();
  }

  void Start() {
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<SchedulerMetrics>(*registry_);
    absl::StatusOr<std::unique_ptr<Scheduler>> s =
        Scheduler::Create(options_, store_.get(), &clock_, metrics_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  void Register(const std::string& node, int slots,
                loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(kind);
    inv.set_slots(slots);
    inv.set_hostname(node);
    inv.set_address(absl::StrCat("addr-", node));
    absl::StatusOr<absl::Duration> interval = scheduler_->RegisterWorker(node, inv);
    ASSERT_TRUE(interval.ok()) << interval.status();
    EXPECT_EQ(*interval, absl::Seconds(1));
  }

  Job Submit(int ranks) {
    absl::StatusOr<Job> job = scheduler_->SubmitJob(TestJobSpecWithRanks(ranks));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  void Cycle() { ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()); }

  HeartbeatResponse Beat(const std::string& node, std::vector<RankStatus> ranks = {}) {
    HeartbeatRequest req;
    req.set_node_id(node);
    for (RankStatus& r : ranks) *req.add_ranks() = std::move(r);
    absl::StatusOr<HeartbeatResponse> resp = scheduler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : HeartbeatResponse();
  }

  // Places a 2-rank job on node-a/node-b and drives it to RUNNING (rank 0 port 29500).
  Job RunTwoRankJob() {
    Register("node-a", 1);
    Register("node-b", 1);
    Job job = Submit(2);
    Cycle();
    job = Get(job.id());
    Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
    Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
    job = Get(job.id());
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);
    return job;
  }

  SchedulerOptions options_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<SchedulerMetrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, SubmitPersistsAPendingJob) {
  Job job = Submit(2);
  EXPECT_TRUE(std::regex_match(job.id(), std::regex("job-[0-9a-f]{8}"))) << job.id();
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(job.checkpoint_dir(), TmpDir() + "/ckpt/" + job.id());
  EXPECT_EQ(job.attempt(), 0);
  EXPECT_EQ(job.create_time().seconds(), absl::ToUnixSeconds(clock_.Now()));
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->phase, loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(stored->spec.resources().num_ranks(), 2);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs_submitted_total"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "RUNNING"), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_job_phase_transitions_total", "to", "PENDING"), 1);
}

TEST_F(SchedulerTest, InvalidSpecIsRejectedAndNotStored) {
  absl::StatusOr<Job> job = scheduler_->SubmitJob(TestJobSpecWithRanks(0));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("resources.num_ranks"), std::string::npos);
  absl::StatusOr<std::vector<JobRecord>> all = store_->ListJobs();
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty());
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs_submitted_total"), 0);
}

TEST_F(SchedulerTest, GetAndCancelUnknownJobAreNotFound) {
  EXPECT_EQ(scheduler_->GetJob("job-nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->CancelJob("job-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, ListJobsInSubmissionOrderWithPhaseFilter) {
  Register("node-a", 1);
  Job a = Submit(1);
  Job b = Submit(1);
  Job c = Submit(1);
  Cycle();  // a placed; b, c pending
  absl::StatusOr<std::vector<Job>> all = scheduler_->ListJobs(loom::v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id(), a.id());
  EXPECT_EQ((*all)[1].id(), b.id());
  EXPECT_EQ((*all)[2].id(), c.id());
  absl::StatusOr<std::vector<Job>> pending = scheduler_->ListJobs(loom::v1::JOB_PHASE_PENDING);
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->size(), 2u);
  EXPECT_EQ((*pending)[0].id(), b.id());
  EXPECT_EQ((*pending)[1].id(), c.id());
}

TEST_F(SchedulerTest, FifoWithoutBackfill) {
  Register("node-a", 3);
  Job a = Submit(2);
  Job b = Submit(2);
  Job c = Submit(1);
  Cycle();
  EXPECT_EQ(Get(a.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  Job b_now = Get(b.id());
  EXPECT_EQ(b_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(b_now.reason(), "WaitingForSlots");
  EXPECT_EQ(b_now.message(), "needs 2 cpu rank slots; 1 of 3 are free");
  // c would fit in the free slot, but it is behind b.
  Job c_now = Get(c.id());
  EXPECT_EQ(c_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(c_now.reason(), "Queued");
  EXPECT_EQ(c_now.message(), "waiting behind job " + b.id());

  a = Get(a.id());
  Beat("node-a", {Rank(a, 0, loom::v1::RANK_STATE_SUCCEEDED, 1234),
                  Rank(a, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  EXPECT_EQ(Get(a.id()).phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  Cycle();
  EXPECT_EQ(Get(b.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Get(c.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 3);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 0);
}

TEST_F(SchedulerTest, GangIsAllOrNothing) {
  Register("node-a", 1);
  Register("node-b", 1);
  Job x = Submit(1);
  Cycle();
  x = Get(x.id());
  ASSERT_EQ(x.phase(), loom::v1::JOB_PHASE_STARTING);
  ASSERT_EQ(x.rank_nodes_size(), 1);
  EXPECT_EQ(x.rank_nodes(0), "node-a");

  Job y = Submit(2);
  Cycle();
  y = Get(y.id());
  EXPECT_EQ(y.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(y.rank_nodes_size(), 0);
  EXPECT_EQ(y.attempt(), 0);
  // node-b has a free slot, but half a gang is never started.
  EXPECT_EQ(Beat("node-b").start_size(), 0);

  Beat("node-a", {Rank(x, 0, loom::v1::RANK_STATE_SUCCEEDED)});
  Cycle();
  y = Get(y.id());
  EXPECT_EQ(y.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(y.attempt(), 1);
  ASSERT_EQ(y.rank_nodes_size(), 2);
  EXPECT_EQ(y.rank_nodes(0), "node-a");
  EXPECT_EQ(y.rank_nodes(1), "node-b");
}

TEST_F(SchedulerTest, RanksSpreadOverNodesInIdOrder) {
  Register("node-b", 4);
  Register("node-a", 4);
  Job job = Submit(3);
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.rank_nodes_size(), 3);
  EXPECT_EQ(job.rank_nodes(0), "node-a");
  EXPECT_EQ(job.rank_nodes(1), "node-b");
  EXPECT_EQ(job.rank_nodes(2), "node-a");
}

TEST_F(SchedulerTest, NeverFittingJobIsUnschedulableAndDoesNotBlockOthers) {
  Register("node-a", 1);
  Job big = Submit(2);
  loom::v1::JobSpec gpu_spec = TestJobSpecWithRanks(1);
  gpu_spec.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  absl::StatusOr<Job> gpu = scheduler_->SubmitJob(gpu_spec);
  ASSERT_TRUE(gpu.ok());
  Job small = Submit(1);
  Cycle();
  Job big_now = Get(big.id());
  EXPECT_EQ(big_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(big_now.reason(), "Unschedulable");
  EXPECT_EQ(big_now.message(),
            "needs 2 cpu rank slots; the 1 live cpu nodes offer 1 in total (register more "
            "workers)");
  Job gpu_now = Get(gpu->id());
  EXPECT_EQ(gpu_now.reason(), "Unschedulable");
  EXPECT_NE(gpu_now.message().find("needs 1 h100 rank slots; the 0 live h100 nodes offer 0"),
            std::string::npos)
      << gpu_now.message();
  EXPECT_EQ(Get(small.id()).phase(), loom::v1::JOB_PHASE_STARTING);

  // More capacity makes it schedulable.
  Register("node-b", 1);
  Beat("node-a", {Rank(Get(small.id()), 0, loom::v1::RANK_STATE_SUCCEEDED)});
  Cycle();
  EXPECT_EQ(Get(big.id()).phase(), loom::v1::JOB_PHASE_STARTING);
}

TEST_F(SchedulerTest, RendezvousHandshakeOrder) {
  Register("node-a", 1);
  Register("node-b", 1);
  Job job = Submit(2);
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(job.attempt(), 1);

  // Rank 1 is not handed out before rank 0's port is known.
  EXPECT_EQ(Beat("node-b").start_size(), 0);
  HeartbeatResponse a1 = Beat("node-a");
  ASSERT_EQ(a1.start_size(), 1);
  const loom::v1::RankAssignment& r0 = a1.start(0);
  EXPECT_EQ(r0.job_id(), job.id());
  EXPECT_EQ(r0.attempt(), 1);
  EXPECT_EQ(r0.rank(), 0);
  EXPECT_EQ(r0.world_size(), 2);
  EXPECT_EQ(r0.master_addr(), "addr-node-a");
  EXPECT_EQ(r0.master_port(), 0);
  EXPECT_EQ(r0.checkpoint_dir(), job.checkpoint_dir());
  EXPECT_EQ(r0.spec().training().steps(), 20);
  // Re-sent until the worker reports the rank.
  EXPECT_EQ(Beat("node-a").start_size(), 1);
  EXPECT_EQ(Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STARTING)}).start_size(), 0);
  EXPECT_EQ(Beat("node-b").start_size(), 0);

  // Rank 0 reports its port; it is stored with the attempt and rank 1 gets it.
  EXPECT_EQ(Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STARTING, 29511)}).start_size(), 0);
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->rendezvous_port, 29511);
  HeartbeatResponse b2 = Beat("node-b");
  ASSERT_EQ(b2.start_size(), 1);
  EXPECT_EQ(b2.start(0).rank(), 1);
  EXPECT_EQ(b2.start(0).master_addr(), "addr-node-a");
  EXPECT_EQ(b2.start(0).master_port(), 29511);
  EXPECT_EQ(Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_STARTING)}).start_size(), 0);

  // RUNNING once every rank runs; progress comes from rank 0.
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29511)});
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  RankStatus with_progress = Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29511);
  with_progress.mutable_progress()->set_step(5);
  with_progress.mutable_progress()->set_total_steps(20);
  with_progress.mutable_progress()->set_loss(3.25);
  with_progress.mutable_progress()->set_tokens_per_second(1000);
  Beat("node-a", {with_progress});
  Job running = Get(job.id());
  EXPECT_EQ(running.progress().step(), 5);
  EXPECT_DOUBLE_EQ(running.progress().loss(), 3.25);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 2);

  // SUCCEEDED when every rank succeeded; slots are free again.
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_SUCCEEDED, 29511)});
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  Job done = Get(job.id());
  EXPECT_EQ(done.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  EXPECT_TRUE(done.has_end_time());
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 2);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "SUCCEEDED"), 1);
}

TEST_F(SchedulerTest, RankFailureFailsTheJobAndStopsTheOtherRanks) {
  Job job = RunTwoRankJob();
  RankStatus failed = Rank(job, 1, loom::v1::RANK_STATE_FAILED);
  failed.set_exit_code(3);
  failed.set_error("ValueError: boom");
  HeartbeatResponse b = Beat("node-b", {failed});
  EXPECT_EQ(b.stop_size(), 0);  // the failed rank has already ended
  Job now = Get(job.id());
  EXPECT_EQ(now.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(now.failure_class(), loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(now.reason(), "RankFailed");
  EXPECT_EQ(now.message(), "rank 1 on node node-b exited with code 3: ValueError: boom");

  HeartbeatResponse a = Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  ASSERT_EQ(a.stop_size(), 1);
  EXPECT_EQ(a.stop(0).job_id(), job.id());
  EXPECT_EQ(a.stop(0).attempt(), 1);
  EXPECT_EQ(a.start_size(), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 1);
  // Told again until it has stopped; then its slot is free.
  EXPECT_EQ(Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)}).stop_size(), 1);
  EXPECT_EQ(Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED, 29500)}).stop_size(), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "FAILED"), 1);
}

TEST_F(SchedulerTest, OutOfMemoryExitIsClassifiedOom) {
  Job job = RunTwoRankJob();
  RankStatus failed = Rank(job, 0, loom::v1::RANK_STATE_FAILED);
  failed.set_exit_code(137);
  Beat("node-a", {failed});
  Job now = Get(job.id());
  EXPECT_EQ(now.failure_class(), loom::v1::FAILURE_CLASS_OOM);
  EXPECT_EQ(now.message(), "rank 0 on node node-a exited with code 137");
}

TEST_F(SchedulerTest, RankThatVanishesFromItsWorkerFailsTheJob) {
  Job job = RunTwoRankJob();
  Beat("node-b", {});
  Job now = Get(job.id());
  EXPECT_EQ(now.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(now.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
  EXPECT_EQ(now.message(), "rank 1 on node node-b is no longer reported by its worker");
}

TEST_F(SchedulerTest, CancelStopsRanksAndIsRefusedOnceEnded) {
  Job job = RunTwoRankJob();
  absl::StatusOr<Job> cancelled = scheduler_->CancelJob(job.id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(cancelled->reason(), "Cancelled");
  for (const auto& [node, rank] : {std::make_pair("node-a", 0), std::make_pair("node-b", 1)}) {
    HeartbeatResponse r = Beat(node, {Rank(job, rank, loom::v1::RANK_STATE_RUNNING, 29500)});
    ASSERT_EQ(r.stop_size(), 1) << node;
    EXPECT_EQ(r.stop(0).job_id(), job.id());
    EXPECT_EQ(r.start_size(), 0);
  }
  absl::StatusOr<Job> again = scheduler_->CancelJob(job.id());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("CANCELLED"), std::string::npos);

  // A pending job is cancelled before it is ever placed.
  Job pending = Submit(2);
  ASSERT_TRUE(scheduler_->CancelJob(pending.id()).ok());
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_STOPPED)});
  Cycle();
  EXPECT_EQ(Get(pending.id()).phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(Get(pending.id()).attempt(), 0);
  EXPECT_EQ(Beat("node-a").start_size(), 0);
}

TEST_F(SchedulerTest, LostNodeFailsItsJobsWithInfra) {
  Job job = RunTwoRankJob();
  clock_.Advance(absl::Seconds(6));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  clock_.Advance(absl::Seconds(5));  // node-b: 11 s since its last heartbeat
  Cycle();
  Job now = Get(job.id());
  EXPECT_EQ(now.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(now.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
  EXPECT_EQ(now.reason(), "NodeLost");
  EXPECT_EQ(now.message(), "node node-b lost: no heartbeat for 11s (timeout 10s)");
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "live"), 1);

  HeartbeatResponse a = Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  ASSERT_EQ(a.stop_size(), 1);
  EXPECT_EQ(a.stop(0).job_id(), job.id());

  HeartbeatRequest from_b;
  from_b.set_node_id("node-b");
  EXPECT_EQ(scheduler_->Heartbeat(from_b).status().code(), absl::StatusCode::kNotFound);
  // After registering again, the stale rank it still runs is stopped.
  Register("node-b", 1);
  HeartbeatResponse b = Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  ASSERT_EQ(b.stop_size(), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 0);
}

TEST_F(SchedulerTest, UnknownNodeHeartbeatIsNotFound) {
  HeartbeatRequest req;
  req.set_node_id("node-ghost");
  absl::StatusOr<HeartbeatResponse> r = scheduler_->Heartbeat(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("node-ghost"), std::string::npos);
}

TEST_F(SchedulerTest, RegisterWorkerValidatesInventory) {
  loom::v1::NodeInventory inv;
  inv.set_slots(0);
  EXPECT_EQ(scheduler_->RegisterWorker("node-a", inv).status().code(),
            absl::StatusCode::kInvalidArgument);
  inv.set_slots(1);
  EXPECT_EQ(scheduler_->RegisterWorker("", inv).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, QueueWaitIsObservedWhenAJobIsPlaced) {
  Register("node-a", 1);
  Job a = Submit(1);
  Job b = Submit(1);
  // Let time pass in 8 s steps with heartbeats, so that node-a stays live.
  auto wait = [this](int steps) {
    for (int i = 0; i < steps; ++i) {
      clock_.Advance(absl::Seconds(8));
      Beat("node-a");
    }
  };
  wait(5);
  Cycle();  // a is placed after 40 s; b waits
  EXPECT_EQ(MetricValue(*registry_, "loom_job_queue_wait_seconds"), 1);
  a = Get(a.id());
  Beat("node-a", {Rank(a, 0, loom::v1::RANK_STATE_SUCCEEDED, 1234)});
  wait(15);
  Cycle();  // b is placed after 160 s
  EXPECT_EQ(Get(b.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(MetricValue(*registry_, "loom_job_queue_wait_seconds"), 2);
  for (const prometheus::MetricFamily& f : registry_->Collect()) {
    if (f.name != "loom_job_queue_wait_seconds") continue;
    EXPECT_DOUBLE_EQ(f.metric[0].histogram.sample_sum, 200);
    // Buckets 1 5 15 30 60 120 300 ...: 40 s lands in le=60, 160 s in le=300.
    EXPECT_EQ(f.metric[0].histogram.bucket[3].cumulative_count, 0u);  // le=30
    EXPECT_EQ(f.metric[0].histogram.bucket[4].cumulative_count, 1u);  // le=60
    EXPECT_EQ(f.metric[0].histogram.bucket[5].cumulative_count, 1u);  // le=120
    EXPECT_EQ(f.metric[0].histogram.bucket[6].cumulative_count, 2u);  // le=300
  }
  // A job cancelled while pending did not wait for placement: not observed.
  Job c = Submit(1);
  ASSERT_TRUE(scheduler_->CancelJob(c.id()).ok());
  EXPECT_EQ(MetricValue(*registry_, "loom_job_queue_wait_seconds"), 2);
}

TEST_F(SchedulerTest, SchedulingCycleIsTimed) {
  Cycle();
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_scheduling_cycle_seconds"), 2);
}

TEST_F(SchedulerTest, EveryPhaseGaugeIsPresentFromTheStart) {
  for (const char* phase : {"PENDING", "ADMITTED", "STARTING", "RUNNING", "RECOVERING",
                            "STOPPING", "SUCCEEDED", "FAILED", "CANCELLED"}) {
    EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", phase), 0) << phase;
  }
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "live"), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 0);
  Register("node-a", 3);
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "live"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 3);
  Job job = Submit(2);
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "STARTING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 0);
  EXPECT_EQ(MetricValue(*registry_, "loom_job_phase_transitions_total", "from", "PENDING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), 2);
  EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), 1);
}

TEST(SchedulerOptionsTest, Validate) {
  SchedulerOptions o;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.checkpoint_root = "/tmp/x";
  EXPECT_TRUE(o.Validate().ok());
  o.heartbeat_interval = absl::Seconds(20);
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.Validate().message().find("heartbeat_interval"), std::string::npos);
}

// Restart: a new Scheduler over the same SQLite file keeps every acknowledged job and re-adopts
// the ranks the workers still run.
TEST_F(SchedulerTest, RestartRecoversJobsFromSqlite) {
  const std::string db = TmpDir() + "/restart.db";
  {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db);
    ASSERT_TRUE(sqlite.ok()) << sqlite.status();
    scheduler_.reset();
    store_ = std::move(*sqlite);
    Start();
  }
  Job running = RunTwoRankJob();
  Job pending = Submit(2);
  Cycle();
  ASSERT_EQ(Get(pending.id()).reason(), "WaitingForSlots");

  // "Crash": drop the scheduler and the store, reopen the file.
  scheduler_.reset();
  store_.reset();
  clock_.Advance(absl::Minutes(5));  // longer than the heartbeat timeout
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> reopened = SqliteJobStore::Open(db);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  store_ = std::move(*reopened);
  Start();

  Job r = Get(running.id());
  EXPECT_EQ(r.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(r.attempt(), 1);
  ASSERT_EQ(r.rank_nodes_size(), 2);
  Job p = Get(pending.id());
  EXPECT_EQ(p.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "RUNNING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 1);

  // Nodes get a fresh timeout of grace: no node is declared lost right after the restart.
  Cycle();
  EXPECT_EQ(Get(running.id()).phase(), loom::v1::JOB_PHASE_RUNNING);

  // node-a heartbeats as before; node-b (restarted worker) registers again. Both report their
  // ranks, which are re-adopted: no start, no stop.
  HeartbeatResponse a = Beat("node-a", {Rank(r, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  EXPECT_EQ(a.start_size(), 0);
  EXPECT_EQ(a.stop_size(), 0);
  Register("node-b", 1);
  HeartbeatResponse b = Beat("node-b", {Rank(r, 1, loom::v1::RANK_STATE_RUNNING)});
  EXPECT_EQ(b.start_size(), 0);
  EXPECT_EQ(b.stop_size(), 0);
  HeartbeatRequest ghost;
  ghost.set_node_id("node-z");
  EXPECT_EQ(scheduler_->Heartbeat(ghost).status().code(), absl::StatusCode::kNotFound);

  Beat("node-a", {Rank(r, 0, loom::v1::RANK_STATE_SUCCEEDED, 29500)});
  Beat("node-b", {Rank(r, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  EXPECT_EQ(Get(running.id()).phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  Cycle();
  EXPECT_EQ(Get(pending.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  // Job ids and sequences continue after the reload.
  Job later = Submit(1);
  absl::StatusOr<std::vector<Job>> all = scheduler_->ListJobs(loom::v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ(all->back().id(), later.id());
}

TEST_F(SchedulerTest, RestartResendsAssignmentsNotYetAcknowledged) {
  Register("node-a", 1);
  Register("node-b", 1);
  Job job = Submit(2);
  Cycle();
  job = Get(job.id());
  // Restart before any worker saw the assignment (in-memory store kept across the restart).
  scheduler_.reset();
  Start();
  HeartbeatResponse a = Beat("node-a");
  ASSERT_EQ(a.start_size(), 1);
  EXPECT_EQ(a.start(0).rank(), 0);
  EXPECT_EQ(a.start(0).master_port(), 0);
  EXPECT_EQ(Beat("node-b").start_size(), 0);
}

}  // namespace
}  // namespace loom
