#include "scheduler/scheduler.h"

#include <prometheus/registry.h>
#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/test_job_spec.h"
#include "storage/checkpoint/shard_format.h"
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
    // The tests count heartbeat intervals against a 10 s timeout (the default is 40 s).
    options_.heartbeat_timeout = absl::Seconds(10);
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    // Restarts at once: these tests are about what a restart does (restart_test covers the
    // backoff before it).
    options_.restart_backoff_base = absl::ZeroDuration();
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

  Job Submit(int ranks, int max_restarts = 0, int max_infra_restarts = 0) {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(ranks);
    spec.set_max_restarts(max_restarts);
    spec.set_max_infra_restarts(max_infra_restarts);
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec);
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

  // Places a 2-rank job on node-a/node-b and drives it to RUNNING (rank 0 port 29500). With
  // `spare_node`, an idle node-c is registered too (somewhere to recover to).
  Job RunTwoRankJob(int max_restarts = 0, bool spare_node = false, int max_infra_restarts = 0) {
    Register("node-a", 1);
    Register("node-b", 1);
    if (spare_node) Register("node-c", 1);
    Job job = Submit(2, max_restarts, max_infra_restarts);
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

TEST_F(SchedulerTest, SubmissionWithARequestIdIsIdempotent) {
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  bool dedup = true;
  absl::StatusOr<Job> first = scheduler_->SubmitJob(spec, "client-7", &dedup);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(dedup);
  EXPECT_EQ(first->request_id(), "client-7");
  absl::StatusOr<Job> retry = scheduler_->SubmitJob(spec, "client-7", &dedup);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(dedup);
  EXPECT_EQ(retry->id(), first->id());
  // The same id with another spec is a client bug, not a retry.
  loom::v1::JobSpec other = spec;
  other.mutable_training()->set_steps(spec.training().steps() + 1);
  absl::StatusOr<Job> clash = scheduler_->SubmitJob(other, "client-7");
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(clash.status().message().find(first->id()), std::string::npos) << clash.status();
  // Without a request id every call creates a job.
  absl::StatusOr<Job> a = scheduler_->SubmitJob(spec), b = scheduler_->SubmitJob(spec);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id(), b->id());
  absl::StatusOr<std::vector<Job>> all = scheduler_->ListJobs(loom::v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  // A retry after a restart still finds the job (the id is persisted with it).
  scheduler_.reset();
  Start();
  absl::StatusOr<Job> after = scheduler_->SubmitJob(spec, "client-7", &dedup);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(dedup);
  EXPECT_EQ(after->id(), first->id());
  EXPECT_EQ(scheduler_->SubmitJob(spec, std::string(300, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ListJobsPagesWithTokensAndFilters) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(1);
    spec.set_name(i % 2 == 0 ? absl::StrCat("sweep-", i) : absl::StrCat("other-", i));
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec);
    ASSERT_TRUE(job.ok());
    ids.push_back(job->id());
  }
  loom::v1::ListJobsRequest req;
  req.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    absl::StatusOr<loom::v1::ListJobsResponse> resp = scheduler_->ListJobsPage(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_LE(resp->jobs_size(), 2);
    for (const Job& j : resp->jobs()) seen.push_back(j.id());
    if (resp->next_page_token().empty()) break;
    req.set_page_token(resp->next_page_token());
  }
  EXPECT_EQ(seen, ids);  // every job once, in submission order
  loom::v1::ListJobsRequest sweeps;
  sweeps.set_name_prefix("sweep-");
  absl::StatusOr<loom::v1::ListJobsResponse> only = scheduler_->ListJobsPage(sweeps);
  ASSERT_TRUE(only.ok());
  ASSERT_EQ(only->jobs_size(), 3);
  EXPECT_EQ(only->jobs(2).id(), ids[4]);
  EXPECT_TRUE(only->next_page_token().empty());
  loom::v1::ListJobsRequest bad;
  bad.set_page_token("not-a-token");
  EXPECT_EQ(scheduler_->ListJobsPage(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.set_page_token("");
  bad.set_page_size(5000);
  EXPECT_EQ(scheduler_->ListJobsPage(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ExplainPendingGivesReasonPositionAndBlockers) {
  Register("node-a", 1);
  Job running = Submit(1);
  Job second = Submit(1);
  Job third = Submit(1);
  loom::v1::JobSpec h200 = TestJobSpecWithRanks(8);
  h200.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H200);
  absl::StatusOr<Job> big = scheduler_->SubmitJob(h200);
  ASSERT_TRUE(big.ok());
  Cycle();
  absl::StatusOr<loom::v1::ExplainPendingResponse> e = scheduler_->ExplainPending(third.id());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(e->queue_position(), 2);
  ASSERT_EQ(e->jobs_ahead_size(), 1);
  EXPECT_EQ(e->jobs_ahead(0), second.id());
  EXPECT_EQ(e->reason(), "Queued");
  e = scheduler_->ExplainPending(big->id());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->reason(), "Unschedulable");
  EXPECT_EQ(e->queue_position(), 1);
  EXPECT_NE(e->message().find("needs 8 h200 rank slots"), std::string::npos) << e->message();
  e = scheduler_->ExplainPending(running.id());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(e->queue_position(), 0);
  EXPECT_EQ(scheduler_->ExplainPending("job-nope").status().code(), absl::StatusCode::kNotFound);
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

// Backfill refused: the head (b) waits for a job with no runtime estimate (a is STARTING), so
// every free slot it could use is reserved for it and c, which would fit, must wait.
TEST_F(SchedulerTest, BackfillIsRefusedWhenTheHeadHasNoEstimate) {
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
  EXPECT_EQ(c_now.message(), "waiting behind job " + b.id() +
                                 " (it holds a reservation; starting now would delay it)");

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

// A node without a topology domain is its own domain: a gang that fits one node goes to the
// best-fitting one; one that does not is spread round-robin over nodes in id order.
TEST_F(SchedulerTest, RanksPackIntoOneNodeOrSpreadInIdOrder) {
  Register("node-b", 3);
  Register("node-a", 4);
  Job job = Submit(3);
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.rank_nodes_size(), 3);
  EXPECT_EQ(job.rank_nodes(0), "node-b");  // 3 free: fits exactly
  EXPECT_EQ(job.rank_nodes(2), "node-b");
  Job wide = Submit(2);
  Register("node-c", 1);
  Cycle();
  wide = Get(wide.id());
  ASSERT_EQ(wide.rank_nodes_size(), 2);
  EXPECT_EQ(wide.rank_nodes(0), "node-a");  // 4 free: the only node with 2
  // Free now: node-a 2, node-c 1, node-d 2. Four ranks fit no single node: the fewest nodes
  // (most free first, ties by id) are node-a and node-d, filled round-robin.
  Register("node-d", 2);
  Job spread = Submit(4);
  Cycle();
  spread = Get(spread.id());
  ASSERT_EQ(spread.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(std::vector<std::string>(spread.rank_nodes().begin(), spread.rank_nodes().end()),
            (std::vector<std::string>{"node-a", "node-d", "node-a", "node-d"}));
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

TEST_F(SchedulerTest, KillStopsRanksAtOnceAndIsRefusedOnceEnded) {
  Job job = RunTwoRankJob();
  absl::StatusOr<Job> killed = scheduler_->KillJob(job.id());
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->phase(), loom::v1::JOB_PHASE_CANCELLED);
  EXPECT_EQ(killed->reason(), "Killed");
  EXPECT_NE(killed->message().find("without a final checkpoint"), std::string::npos);
  for (const auto& [node, rank] : {std::make_pair("node-a", 0), std::make_pair("node-b", 1)}) {
    HeartbeatResponse r = Beat(node, {Rank(job, rank, loom::v1::RANK_STATE_RUNNING, 29500)});
    ASSERT_EQ(r.stop_size(), 1) << node;
    EXPECT_EQ(r.stop(0).job_id(), job.id());
    EXPECT_FALSE(r.stop(0).graceful_stop());
    EXPECT_EQ(r.start_size(), 0);
  }
  for (auto call : {&Scheduler::CancelJob, &Scheduler::KillJob}) {
    absl::StatusOr<Job> again = ((*scheduler_).*call)(job.id());
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(again.status().message().find("CANCELLED"), std::string::npos);
  }
  EXPECT_EQ(scheduler_->KillJob("job-nope").status().code(), absl::StatusCode::kNotFound);

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

// Regression: slots = INT32_MAX was accepted; two such nodes overflowed the int slot totals, and
// one was enough to make placing a huge gang allocate without bound.
TEST_F(SchedulerTest, RegisterWorkerRefusesAbsurdSlotCounts) {
  loom::v1::NodeInventory inv;
  inv.set_slots(2147483647);
  absl::Status s = scheduler_->RegisterWorker("node-a", inv).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inventory.slots: must be in [1, 1024], got 2147483647"),
            std::string::npos)
      << s;
  inv.set_slots(-5);
  EXPECT_EQ(scheduler_->RegisterWorker("node-a", inv).status().code(),
            absl::StatusCode::kInvalidArgument);
  inv.set_slots(kMaxSlotsPerNode);
  EXPECT_TRUE(scheduler_->RegisterWorker("node-a", inv).ok());
}

// Regression: a 100 KB job id came back in the NOT_FOUND message, which exceeded gRPC's
// metadata limit: the client saw RESOURCE_EXHAUSTED. Over-long ids are INVALID_ARGUMENT with a
// short message; ids at the limit still get NOT_FOUND.
TEST_F(SchedulerTest, OverlongIdsAreInvalidWithShortMessages) {
  const std::string huge(100000, 'a');
  for (absl::Status s : {scheduler_->GetJob(huge).status(), scheduler_->CancelJob(huge).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.message().substr(0, 100);
    EXPECT_LT(s.message().size(), 200u);
    EXPECT_NE(s.message().find("job_id: 100000 bytes"), std::string::npos) << s;
  }
  EXPECT_EQ(scheduler_->GetJob(std::string(kMaxIdBytes, 'a')).status().code(),
            absl::StatusCode::kNotFound);
  HeartbeatRequest req;
  req.set_node_id(huge);
  absl::Status hb = scheduler_->Heartbeat(req).status();
  EXPECT_EQ(hb.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(hb.message().size(), 200u);
  loom::v1::NodeInventory inv;
  inv.set_slots(1);
  EXPECT_EQ(scheduler_->RegisterWorker(huge, inv).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Regression: rank 0 reporting rendezvous port 70000 was persisted and handed to ranks 1..N-1.
TEST_F(SchedulerTest, ImpossibleRendezvousPortFailsTheJob) {
  Register("node-a", 1);
  Register("node-b", 1);
  Job job = Submit(2);
  Cycle();
  job = Get(job.id());
  HeartbeatResponse resp = Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STARTING, 70000)});
  job = Get(job.id());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(job.failure_class(), loom::v1::FAILURE_CLASS_SETUP);
  EXPECT_EQ(job.reason(), "RendezvousFailed");
  EXPECT_NE(job.message().find("rendezvous port 70000"), std::string::npos) << job.message();
  // Rank 1 is never started with the bad port; rank 0 is told to stop.
  HeartbeatResponse b = Beat("node-b");
  EXPECT_EQ(b.start_size(), 0);
  resp = Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STARTING, 70000)});
  ASSERT_EQ(resp.stop_size(), 1);
  EXPECT_EQ(resp.stop(0).job_id(), job.id());
}

TEST_F(SchedulerTest, NegativeRendezvousPortFailsTheJob) {
  Register("node-a", 1);
  Job job = Submit(1);
  Cycle();
  job = Get(job.id());
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STARTING, -1)});
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_FAILED);
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
  EXPECT_EQ(o.heartbeat_timeout, absl::Seconds(40));  // docs/scheduling.md "Node liveness"
  o.heartbeat_interval = absl::Seconds(40);
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.Validate().message().find("heartbeat_interval"), std::string::npos);
  o.heartbeat_interval = absl::Seconds(1);
  o.resume_lookup_wait = absl::Seconds(-1);
  EXPECT_NE(o.Validate().message().find("resume_lookup_wait"), std::string::npos);
  o.resume_lookup_wait = absl::Seconds(1);
  o.checkpoint_worker.retry_initial = absl::ZeroDuration();
  EXPECT_NE(o.Validate().message().find("checkpoint_worker.retry_initial"), std::string::npos);
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

// Regression: after a restart of the whole cluster, the workers came back without the ranks of a
// RUNNING job and the scheduler handed the same attempt out again, which restarted training
// from step 0. A running rank that its worker no longer reports is lost.
TEST_F(SchedulerTest, RestartDoesNotRestartRunningRanksThatTheirWorkersLost) {
  Job running = RunTwoRankJob();
  scheduler_.reset();
  Start();
  HeartbeatResponse a = Beat("node-a");  // node-a restarted too: it runs nothing
  EXPECT_EQ(a.start_size(), 0);
  Job j = Get(running.id());
  EXPECT_EQ(j.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(j.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
  EXPECT_EQ(j.reason(), "RankLost");
  // The other rank is told to stop.
  HeartbeatResponse b = Beat("node-b", {Rank(j, 1, loom::v1::RANK_STATE_RUNNING)});
  EXPECT_EQ(b.start_size(), 0);
  ASSERT_EQ(b.stop_size(), 1);
  EXPECT_EQ(b.stop(0).job_id(), running.id());
}

// Writes a committed checkpoint of `step` (every rank's shard + manifest) for `job`.
void WriteCommittedCheckpoint(const Job& job, int64_t step, int world_size) {
  for (int r = 0; r < world_size; ++r) {
    storage::ShardManifest m;
    m.step = step;
    m.rank = r;
    m.world_size = world_size;
    m.params.push_back({"w", {4}, 4, 0, 0});
    storage::AssignPartitionLayout(m);
    std::vector<float> data(m.section_numel, 1.0f);
    const float* sections[] = {data.data()};
    ASSERT_TRUE(storage::WriteShard(absl::StrCat(job.checkpoint_dir(), "/",
                                                 storage::StepDirName(step)),
                                    m, sections)
                    .ok());
  }
}

TEST_F(SchedulerTest, FailedAttemptWithRestartsLeftResumesFromNewestCommittedCheckpoint) {
  Register("node-a", 1);
  Register("node-b", 1);
  Register("node-c", 1);
  Job job = Submit(2, /*max_restarts=*/1);
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.rank_nodes(0), "node-a");
  ASSERT_EQ(job.rank_nodes(1), "node-b");
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  WriteCommittedCheckpoint(job, 10, 2);
  // A partial newer checkpoint (rank 1 never reported) must not be used.
  {
    storage::ShardManifest m;
    m.step = 20;
    m.world_size = 2;
    m.params.push_back({"w", {4}, 4, 0, 0});
    storage::AssignPartitionLayout(m);
    std::vector<float> data(m.section_numel, 2.0f);
    const float* sections[] = {data.data()};
    ASSERT_TRUE(storage::WriteShard(job.checkpoint_dir() + "/" + storage::StepDirName(20), m,
                                    sections)
                    .ok());
  }

  // Rank 1 crashes on node-b: the attempt ends, the job is RECOVERING, rank 0 is told to stop.
  RankStatus crash = Rank(job, 1, loom::v1::RANK_STATE_FAILED);
  crash.set_exit_code(139);
  crash.set_error("Segmentation fault");
  Beat("node-b", {crash});
  Job recovering = Get(job.id());
  EXPECT_EQ(recovering.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(recovering.reason(), "RankFailed");
  EXPECT_NE(recovering.message().find("restart 1 of 1"), std::string::npos) << recovering.message();
  HeartbeatResponse a = Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
  ASSERT_EQ(a.stop_size(), 1);
  // Not placed again while rank 0 of attempt 1 still runs.
  Cycle();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
  Cycle();
  Job second = Get(job.id());
  EXPECT_EQ(second.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(second.attempt(), 2);
  // node-b (the suspect) is avoided: node-a and node-c take the gang.
  EXPECT_EQ(second.rank_nodes(0), "node-a");
  EXPECT_EQ(second.rank_nodes(1), "node-c");
  const std::string step10 = job.checkpoint_dir() + "/" + storage::StepDirName(10);
  HeartbeatResponse start0 = Beat("node-a");
  ASSERT_EQ(start0.start_size(), 1);
  EXPECT_EQ(start0.start(0).attempt(), 2);
  EXPECT_EQ(start0.start(0).resume_from(), step10);
  Beat("node-a", {Rank(second, 0, loom::v1::RANK_STATE_RUNNING, 29600)});
  HeartbeatResponse start1 = Beat("node-c");
  ASSERT_EQ(start1.start_size(), 1);
  EXPECT_EQ(start1.start(0).resume_from(), step10);
  EXPECT_EQ(start1.start(0).master_port(), 29600);

  // The second failure uses up the budget: FAILED with the last error.
  RankStatus again = Rank(second, 1, loom::v1::RANK_STATE_FAILED);
  again.set_exit_code(1);
  again.set_error("boom");
  Beat("node-c", {again});
  Job failed = Get(job.id());
  EXPECT_EQ(failed.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_NE(failed.message().find("all 1 user restarts used"), std::string::npos) << failed.message();
}

TEST_F(SchedulerTest, RetentionKeepsTheLastAndTheResumeCheckpoint) {
  Register("node-a", 1);
  loom::v1::JobSpec spec = TestJobSpecWithRanks(1);
  spec.set_max_restarts(1);
  spec.mutable_checkpoint()->set_keep_last(1);
  absl::StatusOr<Job> submitted = scheduler_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok());
  Cycle();
  Job job = Get(submitted->id());
  auto exists = [&](int64_t step) {
    struct stat st;
    return ::stat(absl::StrCat(job.checkpoint_dir(), "/", storage::StepDirName(step)).c_str(),
                  &st) == 0;
  };
  auto report = [&](const Job& attempt, int64_t step) {
    RankStatus st = Rank(attempt, 0, loom::v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(step);
    st.mutable_progress()->set_last_checkpoint_step(step);
    Beat("node-a", {st});
  };
  WriteCommittedCheckpoint(job, 10, 1);
  report(job, 10);
  WriteCommittedCheckpoint(job, 20, 1);
  report(job, 20);
  scheduler_->WaitForCheckpointRetention();  // retention runs off the scheduler's lock
  EXPECT_FALSE(exists(10));
  EXPECT_TRUE(exists(20));
  // Attempt 2 resumes from step 20; it stays protected while newer checkpoints come and go.
  RankStatus crash = Rank(job, 0, loom::v1::RANK_STATE_FAILED);
  crash.set_exit_code(1);
  Beat("node-a", {crash});
  Cycle();
  Job second = Get(job.id());
  ASSERT_EQ(second.attempt(), 2);
  for (int64_t step : {30, 40}) {
    WriteCommittedCheckpoint(job, step, 1);
    report(second, step);
    scheduler_->WaitForCheckpointRetention();
  }
  EXPECT_TRUE(exists(20));
  EXPECT_FALSE(exists(30));
  EXPECT_TRUE(exists(40));
  // Once the job succeeds, the resume checkpoint is no longer protected.
  RankStatus done = Rank(second, 0, loom::v1::RANK_STATE_SUCCEEDED);
  done.mutable_progress()->set_step(40);
  done.mutable_progress()->set_last_checkpoint_step(40);
  Beat("node-a", {done});
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  scheduler_->WaitForCheckpointRetention();
  EXPECT_FALSE(exists(20));
  EXPECT_TRUE(exists(40));
}

// A rank failing with a collective error while its peer's node has gone silent: the silent node
// is named as the likely cause and avoided by the next attempt.
TEST_F(SchedulerTest, RankFailureNamesASilentPeerNodeAsTheLikelyCause) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*spare_node=*/true, /*max_infra_restarts=*/1);
  Beat("node-c");
  clock_.Advance(absl::Seconds(5));  // node-b goes silent (its worker died)
  Beat("node-c");
  RankStatus reset = Rank(job, 0, loom::v1::RANK_STATE_FAILED);
  reset.set_exit_code(1);
  reset.set_error("allgather: Read error: Connection reset by peer");
  Beat("node-a", {reset});
  Job recovering = Get(job.id());
  EXPECT_EQ(recovering.phase(), loom::v1::JOB_PHASE_RECOVERING);
  // The peer's silent node is the cause: an infra failure, on the infra budget.
  EXPECT_EQ(recovering.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
  EXPECT_EQ(recovering.infra_restarts(), 1);
  EXPECT_NE(recovering.message().find("node node-b, with another rank of this job, has not "
                                      "heartbeated for 5s: likely the cause"),
            std::string::npos)
      << recovering.message();
}

// The peer's failure can arrive before its node looks silent; when the node is then declared
// lost, the recovering job's message names it.
TEST_F(SchedulerTest, NodeLostWhileRecoveringIsNamedInTheJobMessage) {
  Job job = RunTwoRankJob(/*max_restarts=*/1, /*spare_node=*/true);
  RankStatus reset = Rank(job, 0, loom::v1::RANK_STATE_FAILED);
  reset.set_exit_code(1);
  reset.set_error("Connection reset by peer");
  Beat("node-a", {reset});
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
  for (int i = 0; i < 11; ++i) {  // node-b never heartbeats again
    clock_.Advance(absl::Seconds(1));
    Beat("node-a");
    Beat("node-c");
    Cycle();
  }
  Job placed = Get(job.id());
  EXPECT_EQ(placed.attempt(), 2);
  EXPECT_NE(placed.message().find("Previously: attempt 1 failed: rank 0 on node node-a"),
            std::string::npos)
      << placed.message();
  EXPECT_NE(placed.message().find("then node node-b lost: no heartbeat for 11s (timeout 10s): "
                                  "likely the cause"),
            std::string::npos)
      << placed.message();
  for (const std::string& n : placed.rank_nodes()) EXPECT_NE(n, "node-b");
}

TEST_F(SchedulerTest, LostNodeWithRestartsLeftRecoversOnTheOtherNodes) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*spare_node=*/true, /*max_infra_restarts=*/2);
  Beat("node-c");
  // node-b goes silent; node-a and node-c keep heartbeating.
  clock_.Advance(absl::Seconds(6));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
  Beat("node-c");
  clock_.Advance(absl::Seconds(6));
  HeartbeatResponse a = Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
  Beat("node-c");
  Cycle();  // node-b declared lost
  Job recovering = Get(job.id());
  EXPECT_EQ(recovering.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(recovering.reason(), "NodeLost");
  EXPECT_EQ(recovering.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
  Cycle();
  Job second = Get(job.id());
  EXPECT_EQ(second.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(second.attempt(), 2);
  EXPECT_EQ(second.rank_nodes(0), "node-a");
  EXPECT_EQ(second.rank_nodes(1), "node-c");
  // No checkpoint was committed: the new attempt starts over.
  HeartbeatResponse start0 = Beat("node-a");
  ASSERT_EQ(start0.start_size(), 1);
  EXPECT_EQ(start0.start(0).resume_from(), "");
}

TEST_F(SchedulerTest, SilentNodeWhoseJobKeepsSteppingIsNotLost) {
  Job job = RunTwoRankJob();  // rank 0 on node-a, rank 1 on node-b
  // node-b stops heartbeating; rank 0 (node-a) keeps reporting new steps.
  for (int step = 1; step <= 30; ++step) {
    clock_.Advance(absl::Seconds(1));
    RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(step);
    Beat("node-a", {st});
    Cycle();
  }
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 0);
  // Once the steps stop too, the silent node is lost and takes the job with it.
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
    Cycle();
  }
  Job lost = Get(job.id());
  EXPECT_EQ(lost.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(lost.reason(), "NodeLost");
  EXPECT_NE(lost.message().find("node-b"), std::string::npos) << lost.message();
}

// Regression (issue 16): the worker hosting rank 0 went silent (SIGSTOP) while both trainers
// kept stepping; only rank 0's progress counted, so its node was declared lost after the
// heartbeat timeout and the job restarted. Rank 1's steps (reported by node-b) prove the gang
// alive: node-a is unreachable, not lost, gets no new ranks, and the job keeps its attempt.
TEST_F(SchedulerTest, SilentRankZeroNodeIsKeptWhileAnotherRankSteps) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*spare_node=*/true);  // node-c idle
  const int32_t attempt = job.attempt();
  for (int step = 1; step <= 30; ++step) {  // 30 s: three times the 10 s timeout
    clock_.Advance(absl::Seconds(1));
    RankStatus st = Rank(job, 1, loom::v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(step);
    Beat("node-b", {st});
    Beat("node-c");
    Cycle();
  }
  Job kept = Get(job.id());
  EXPECT_EQ(kept.phase(), loom::v1::JOB_PHASE_RUNNING) << kept.message();
  EXPECT_EQ(kept.attempt(), attempt);
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 0);
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  std::map<std::string, loom::v1::NodeInfo> by_id;
  for (const loom::v1::NodeInfo& n : *nodes) by_id[n.node_id()] = n;
  EXPECT_TRUE(by_id["node-a"].live());
  EXPECT_TRUE(by_id["node-a"].unreachable());
  EXPECT_FALSE(by_id["node-b"].unreachable());
  // No new rank goes to the unreachable node: a 1-rank job lands on node-c, the next one waits.
  Job one = Submit(1);
  Job two = Submit(1);
  Cycle();
  EXPECT_EQ(Get(one.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  ASSERT_EQ(Get(one.id()).rank_nodes_size(), 1);
  EXPECT_EQ(Get(one.id()).rank_nodes(0), "node-c");
  EXPECT_EQ(Get(two.id()).phase(), loom::v1::JOB_PHASE_PENDING);
  // node-a heartbeats again (SIGCONT): reachable, and rank 0's progress is the job's again.
  RankStatus r0 = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
  r0.mutable_progress()->set_step(31);
  Beat("node-a", {r0});
  Cycle();
  EXPECT_EQ(Get(job.id()).progress().step(), 31);
  EXPECT_EQ(Get(job.id()).attempt(), attempt);
  // Once no rank steps any more, a silent node is lost after the timeout.
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
    Beat("node-c");
    Cycle();
  }
  Job lost = Get(job.id());
  EXPECT_EQ(lost.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(lost.reason(), "NodeLost");
  EXPECT_NE(lost.message().find("node-a"), std::string::npos) << lost.message();
}

// Regression: a node went silent while the job finished; rank 0 (elsewhere) SUCCEEDED, the silent
// node's rank could not report, and the node's loss then FAILED a job whose training had completed.
TEST_F(SchedulerTest, NodeLostAfterRankZeroSucceededCompletesTheJob) {
  Job job = RunTwoRankJob();
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_SUCCEEDED)});
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);  // rank 1 has not reported yet
  for (int i = 0; i < 12; ++i) {  // node-b stays silent past the 10 s timeout
    clock_.Advance(absl::Seconds(1));
    Beat("node-a");
    Cycle();
  }
  Job done = Get(job.id());
  EXPECT_EQ(done.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  EXPECT_NE(done.message().find("node node-b lost"), std::string::npos) << done.message();
}

TEST_F(SchedulerTest, JobWhoseStepsStopIsHungAndItsAttemptEnds) {
  options_.hang_step_time_factor = 10;
  options_.hang_min_timeout = absl::Seconds(30);
  scheduler_.reset();
  Start();
  Job job = RunTwoRankJob();
  auto step_to = [&](int step) {
    RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(step);
    Beat("node-a", {st});
    Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  };
  // Steps every 5 s: median step time 5 s -> limit max(30 s, 10 x 5 s) = 50 s.
  for (int step = 1; step <= 6; ++step) {
    clock_.Advance(absl::Seconds(5));
    step_to(step);
    Cycle();
  }
  // A pause shorter than the limit (an evaluation, a checkpoint) is fine.
  for (int i = 0; i < 9; ++i) {
    clock_.Advance(absl::Seconds(5));
    Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
    Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
    Cycle();
  }
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  step_to(7);
  // Heartbeats go on, steps do not: after 50 s the job is hung.
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(absl::Seconds(5));
    Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
    Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
    Cycle();
  }
  Job hung = Get(job.id());
  EXPECT_EQ(hung.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(hung.reason(), "Hang");
  EXPECT_EQ(hung.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
  EXPECT_NE(hung.message().find("no step progress for 55s after step 7"), std::string::npos)
      << hung.message();
  // Both ranks are told to stop.
  EXPECT_EQ(Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)}).stop_size(), 1);
  EXPECT_EQ(Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)}).stop_size(), 1);
}

TEST_F(SchedulerTest, ResumedAttemptKeepsTheJobsInitialEvalLoss) {
  Register("node-a", 1);
  Job job = Submit(1, /*max_restarts=*/1);
  Cycle();
  job = Get(job.id());
  RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
  st.mutable_progress()->set_has_eval_loss(true);
  st.mutable_progress()->set_initial_eval_loss(5.5);
  st.mutable_progress()->set_eval_loss(5.5);
  Beat("node-a", {st});
  st.set_state(loom::v1::RANK_STATE_FAILED);
  st.set_exit_code(1);
  Beat("node-a", {st});
  Cycle();
  Job second = Get(job.id());
  ASSERT_EQ(second.attempt(), 2);
  // The new rank's first heartbeat carries no progress yet: the job keeps what it had.
  Beat("node-a", {Rank(second, 0, loom::v1::RANK_STATE_STARTING)});
  EXPECT_TRUE(Get(job.id()).progress().has_eval_loss());
  EXPECT_DOUBLE_EQ(Get(job.id()).progress().initial_eval_loss(), 5.5);
  RankStatus resumed = Rank(second, 0, loom::v1::RANK_STATE_RUNNING);
  resumed.mutable_progress()->set_has_eval_loss(true);
  resumed.mutable_progress()->set_initial_eval_loss(3.0);  // first eval of the resumed attempt
  resumed.mutable_progress()->set_eval_loss(3.0);
  Beat("node-a", {resumed});
  EXPECT_DOUBLE_EQ(Get(job.id()).progress().initial_eval_loss(), 5.5);
  EXPECT_DOUBLE_EQ(Get(job.id()).progress().eval_loss(), 3.0);
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

namespace loom {
namespace {

// A spec that does not mention max_infra_restarts gets the scheduler's default infra budget
// (3): a lost node is retried, not a failed job (regression: proto3's implicit 0 meant none).
TEST_F(SchedulerTest, UnsetInfraBudgetUsesTheSchedulerDefault) {
  Register("node-a", 1);
  Register("node-b", 1);
  Register("node-c", 1);
  loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
  ASSERT_FALSE(spec.has_max_infra_restarts());
  absl::StatusOr<Job> submitted = scheduler_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  Cycle();
  Job job = Get(submitted->id());
  ASSERT_EQ(job.rank_nodes_size(), 2);
  Beat(job.rank_nodes(0), {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat(job.rank_nodes(1), {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  const std::string lost = job.rank_nodes(1);
  for (int i = 0; i < 12; ++i) {  // `lost` never heartbeats again; nothing steps
    clock_.Advance(absl::Seconds(1));
    for (const std::string& n : {std::string("node-a"), std::string("node-b"),
                                 std::string("node-c")}) {
      if (n == job.rank_nodes(0) && i < 11) {
        Beat(n, {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});  // rank 0 waits on rank 1
      } else if (n != lost) {
        Beat(n);
      }
    }
    Cycle();
  }
  Job after = Get(job.id());
  EXPECT_NE(after.phase(), loom::v1::JOB_PHASE_FAILED) << after.message();
  EXPECT_EQ(after.infra_restarts(), 1) << after.message();
  EXPECT_NE(after.message().find("infra restart 1 of 3"), std::string::npos) << after.message();
}

}  // namespace
}  // namespace loom
