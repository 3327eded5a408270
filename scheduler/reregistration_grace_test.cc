// Re-registration grace after a scheduler start (SchedulerOptions::reregistration_grace; issue
// 18): a restarted scheduler over the same SQLite file gives the nodes it knows time to heartbeat
// again before any is declared lost, and re-adopts the ranks they report.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_job_spec.h"
#include "storage/sqlite_job_store.h"

namespace loom {
namespace {

using loom::v1::HeartbeatRequest;
using loom::v1::HeartbeatResponse;
using loom::v1::Job;
using loom::v1::RankStatus;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

class ReregistrationGraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_root = TmpDir() + "/ckpt";
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    options_.heartbeat_timeout = absl::Seconds(10);
    options_.reregistration_grace = absl::Seconds(30);
    db_ = TmpDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db";
    Start();
  }

  // (Re)opens the SQLite file and creates a scheduler over it, as a daemon start does.
  void Start() {
    scheduler_.reset();
    store_.reset();
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store = SqliteJobStore::Open(db_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    absl::StatusOr<std::unique_ptr<Scheduler>> s =
        Scheduler::Create(options_, store_.get(), &clock_, /*metrics=*/nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  void Register(const std::string& node) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    inv.set_slots(1);
    inv.set_hostname(node);
    inv.set_address(absl::StrCat("addr-", node));
    ASSERT_TRUE(scheduler_->RegisterWorker(node, inv).ok());
  }

  HeartbeatResponse Beat(const std::string& node, std::vector<RankStatus> ranks = {}) {
    HeartbeatRequest req;
    req.set_node_id(node);
    for (RankStatus& r : ranks) *req.add_ranks() = std::move(r);
    absl::StatusOr<HeartbeatResponse> resp = scheduler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << node << ": " << resp.status();
    return resp.ok() ? *resp : HeartbeatResponse();
  }

  static RankStatus Rank(const Job& job, int rank, loom::v1::RankState state, int port = 0) {
    RankStatus st;
    st.set_job_id(job.id());
    st.set_attempt(job.attempt());
    st.set_rank(rank);
    st.set_state(state);
    st.set_rendezvous_port(port);
    return st;
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  // Node id -> live, from the admin view.
  std::map<std::string, bool> Live() {
    std::map<std::string, bool> live;
    absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
    EXPECT_TRUE(nodes.ok()) << nodes.status();
    if (nodes.ok()) {
      for (const auto& n : *nodes) live[n.node_id()] = n.live();
    }
    return live;
  }

  void Cycle() { ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()); }

  SchedulerOptions options_;
  FakeClock clock_;
  std::string db_;
  std::unique_ptr<SqliteJobStore> store_;
  std::unique_ptr<Scheduler> scheduler_;
};

// Regression (issue 18): a restarted scheduler declared every node lost heartbeat_timeout after
// its start, failing the running job, when the workers were slower than that to come back.
TEST_F(ReregistrationGraceTest, RestartedSchedulerWaitsForNodesAndReadoptsTheirRanks) {
  for (const char* n : {"node-a", "node-b", "node-c", "node-d"}) Register(n);
  absl::StatusOr<Job> submitted = scheduler_->SubmitJob(TestJobSpecWithRanks(2));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  Cycle();
  Job job = Get(submitted->id());
  ASSERT_EQ(job.rank_nodes_size(), 2);
  ASSERT_EQ(job.rank_nodes(0), "node-a");
  ASSERT_EQ(job.rank_nodes(1), "node-b");
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  for (const char* n : {"node-c", "node-d"}) Beat(n);
  job = Get(job.id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING);

  // kill -9 and start again on the same file.
  clock_.Advance(absl::Seconds(3));
  Start();
  const absl::Time started = clock_.Now();

  // node-d comes back at once, then goes silent: heard from, it is judged by heartbeat_timeout.
  clock_.Set(started + absl::Seconds(1));
  Beat("node-d");
  // Past heartbeat_timeout (10 s), inside the grace (30 s): only node-d is lost.
  clock_.Set(started + absl::Seconds(15));
  Cycle();
  std::map<std::string, bool> live = Live();
  EXPECT_TRUE(live["node-a"]);
  EXPECT_TRUE(live["node-b"]);
  EXPECT_TRUE(live["node-c"]);
  EXPECT_FALSE(live["node-d"]);
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);

  // The job's workers report its ranks: re-adopted, nothing started or stopped.
  for (const auto& [node, rank] : {std::pair<std::string, int>{"node-a", 0}, {"node-b", 1}}) {
    HeartbeatResponse r = Beat(node, {Rank(job, rank, loom::v1::RANK_STATE_RUNNING, rank == 0 ? 29500 : 0)});
    EXPECT_EQ(r.start_size(), 0) << node;
    EXPECT_EQ(r.stop_size(), 0) << node;
  }
  clock_.Set(started + absl::Seconds(24));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  Cycle();
  EXPECT_TRUE(Live()["node-c"]) << "node-c lost inside the grace";

  // Past the grace, node-c (never heard from) is lost; the job's nodes are not.
  clock_.Set(started + absl::Seconds(31));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  Cycle();
  live = Live();
  EXPECT_TRUE(live["node-a"]);
  EXPECT_TRUE(live["node-b"]);
  EXPECT_FALSE(live["node-c"]);
  Job still = Get(job.id());
  EXPECT_EQ(still.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(still.attempt(), 1);

  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_SUCCEEDED, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  Job done = Get(job.id());
  EXPECT_EQ(done.phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  EXPECT_EQ(done.attempt(), 1);
}

// A grace shorter than the heartbeat timeout changes nothing: the timeout still applies.
TEST_F(ReregistrationGraceTest, GraceShorterThanTheHeartbeatTimeoutKeepsTheTimeout) {
  options_.reregistration_grace = absl::Seconds(2);
  Start();
  Register("node-a");
  Start();
  const absl::Time started = clock_.Now();
  clock_.Set(started + absl::Seconds(9));
  Cycle();
  EXPECT_TRUE(Live()["node-a"]);
  clock_.Set(started + absl::Seconds(11));
  Cycle();
  EXPECT_FALSE(Live()["node-a"]);
}

TEST(ReregistrationGraceOptionsTest, NegativeGraceIsInvalidNamingTheField) {
  SchedulerOptions options;
  options.checkpoint_root = "/tmp/ckpt";
  options.reregistration_grace = absl::Seconds(-1);
  absl::Status s = options.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("reregistration_grace"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace loom
