// The scheduler's restart paths (restart_policy.h): configuration errors are final, data errors
// use the infra budget, restarts back off exponentially, failures are attributed to the likeliest
// rank, a corrupt newest checkpoint is skipped, and an ended job's history is kept and replayed.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_job_spec.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/sqlite_job_store.h"
#include "worker/trainer/exit_codes.h"

namespace loom {
namespace {

using loom::v1::Job;
using loom::v1::RankStatus;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

RankStatus Rank(const Job& job, int rank, loom::v1::RankState state, int port = 0) {
  RankStatus st;
  st.set_job_id(job.id());
  st.set_attempt(job.attempt());
  st.set_rank(rank);
  st.set_state(state);
  st.set_rendezvous_port(port);
  return st;
}

RankStatus Failed(const Job& job, int rank, int code, const std::string& error, int signal = 0,
                  int64_t exit_time_us = 0) {
  RankStatus st = Rank(job, rank, loom::v1::RANK_STATE_FAILED);
  st.set_exit_code(code);
  st.set_error(error);
  st.set_term_signal(signal);
  st.set_exit_time_us(exit_time_us);
  return st;
}

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options_.checkpoint_root = absl::StrCat(TmpDir(), "/", name, "/ckpt");
    // The tests count heartbeat intervals against a 10 s timeout (the default is 40 s).
    options_.heartbeat_timeout = absl::Seconds(10);
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    db_ = absl::StrCat(TmpDir(), "/", name, ".db");
    Start();
  }

  void Start() {
    scheduler_.reset();
    store_.reset();
    auto store = SqliteJobStore::Open(db_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto s = Scheduler::Create(options_, store_.get(), &clock_, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  void Register(const std::string& node) {
    loom::v1::NodeInventory inv;
    inv.set_slots(1);
    inv.set_address(absl::StrCat("addr-", node));
    ASSERT_TRUE(scheduler_->RegisterWorker(node, inv).ok());
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  void Cycle() { ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()); }

  loom::v1::HeartbeatResponse Beat(const std::string& node, std::vector<RankStatus> ranks = {}) {
    loom::v1::HeartbeatRequest req;
    req.set_node_id(node);
    for (RankStatus& r : ranks) *req.add_ranks() = std::move(r);
    auto resp = scheduler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : loom::v1::HeartbeatResponse();
  }

  // A 2-rank job on node-a / node-b (node-c spare), RUNNING.
  Job RunTwoRankJob(int max_restarts, int max_infra_restarts = 0) {
    Register("node-a");
    Register("node-b");
    Register("node-c");
    loom::v1::JobSpec spec = TestJobSpecWithRanks(2);
    spec.set_max_restarts(max_restarts);
    spec.set_max_infra_restarts(max_infra_restarts);
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    Cycle();
    return BringUp(job->id());
  }

  // Drives the placed attempt of `id` to RUNNING.
  Job BringUp(const std::string& id) {
    Job job = Get(id);
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING) << job.message();
    Beat(job.rank_nodes(0), {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
    Beat(job.rank_nodes(1), {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
    job = Get(id);
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING) << job.message();
    return job;
  }

  // Rank `failed` of the running attempt fails with `code`; the other rank then stops.
  Job FailRank(const Job& job, int failed, int code, const std::string& error) {
    Beat(job.rank_nodes(failed), {Failed(job, failed, code, error)});
    const int other = 1 - failed;
    Beat(job.rank_nodes(other), {Rank(job, other, loom::v1::RANK_STATE_STOPPED)});
    return Get(job.id());
  }

  SchedulerOptions options_;
  std::string db_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(RestartTest, ConfigurationErrorExitFailsTheJobWithoutARestart) {
  Job job = RunTwoRankJob(/*max_restarts=*/3);
  job = FailRank(job, 1, kTrainerExitConfigError,
                 "model.init_from: model.embed_tokens.weight has shape [256,64], model.config "
                 "wants [256,48]");
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED) << job.message();
  EXPECT_EQ(job.reason(), "ConfigError");
  EXPECT_EQ(job.failure_class(), loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(job.user_restarts(), 0);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_TRUE(absl::StrContains(job.message(), "configuration error")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "not restarted")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "model.init_from")) << job.message();
}

// Issue 42 defect 5: a dataset that changed under the job fails it at once, with restarts left
// on both budgets (it was exit 1: retried until the user's restarts were spent).
TEST_F(RestartTest, DatasetErrorExitFailsTheJobWithoutARestart) {
  Job job = RunTwoRankJob(/*max_restarts=*/3, /*max_infra_restarts=*/3);
  job = FailRank(job, 0, kTrainerExitDatasetError,
                 "dataset.path: /data/x.txt changed since the job first started: size 542789 -> "
                 "414383 bytes");
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED) << job.message();
  EXPECT_EQ(job.reason(), "DatasetError");
  EXPECT_EQ(job.failure_class(), loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(job.user_restarts(), 0);
  EXPECT_EQ(job.infra_restarts(), 0);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_TRUE(absl::StrContains(job.message(), "(dataset error)")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "a dataset error fails the same way every time: "
                                               "not restarted")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "/data/x.txt changed")) << job.message();
}

TEST_F(RestartTest, DataErrorIsChargedToTheInfraBudgetNotTheUsers) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*max_infra_restarts=*/1);
  job = FailRank(job, 1, kTrainerExitDataError, "rank_1.shard (rank 1): CRC-32 mismatch");
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING) << job.message();
  EXPECT_EQ(job.reason(), "DataError");
  EXPECT_EQ(job.user_restarts(), 0);
  EXPECT_EQ(job.infra_restarts(), 1);
}

TEST_F(RestartTest, RestartsBackOffExponentially) {
  options_.restart_backoff_base = absl::Seconds(4);
  options_.restart_backoff_cap = absl::Seconds(60);
  Start();
  Job job = RunTwoRankJob(/*max_restarts=*/3);
  job = FailRank(job, 0, 1, "boom");
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_TRUE(absl::StrContains(job.message(), "(backoff 4s)")) << job.message();
  Cycle();
  job = Get(job.id());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(job.reason(), "Backoff");
  EXPECT_TRUE(absl::StrContains(job.message(), "after restart 1")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "attempt 1 failed: rank 0")) << job.message();
  clock_.Advance(absl::Seconds(3));
  Cycle();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
  clock_.Advance(absl::Seconds(1));
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING) << job.message();
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_TRUE(absl::StrContains(job.message(), "Previously: attempt 1 failed: rank 0"))
      << job.message();

  // The second restart waits twice as long.
  job = BringUp(job.id());
  job = FailRank(job, 0, 1, "boom again");
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_TRUE(absl::StrContains(job.message(), "(backoff 8s)")) << job.message();
  clock_.Advance(absl::Seconds(7));
  Cycle();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
  clock_.Advance(absl::Seconds(1));
  Cycle();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_STARTING);
}

// Rank 0 is SIGKILLed; rank 1's report ("Connection closed by peer") arrives first. Rank 0's
// later report takes the blame, and the message names both.
TEST_F(RestartTest, RankKilledBySignalIsBlamedOverAPeerThatSawTheConnectionClose) {
  Job job = RunTwoRankJob(/*max_restarts=*/2);
  Beat("node-b", {Failed(job, 1, 1, "Connection closed by peer [addr-node-a]:29500", 0, 2000)});
  Job first = Get(job.id());
  ASSERT_EQ(first.phase(), loom::v1::JOB_PHASE_RECOVERING);
  ASSERT_TRUE(absl::StrContains(first.message(), "attempt 1 failed: rank 1 on node node-b"))
      << first.message();
  Beat("node-a", {Failed(job, 0, 137, "", /*signal=*/9, 1000)});
  job = Get(job.id());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_TRUE(absl::StrContains(
      job.message(),
      "attempt 1 failed: rank 0 on node node-a exited with code 137 (killed by signal 9, SIGKILL) "
      "(likely the cause: killed by a signal); rank 1 on node node-b reported first: rank 1 on "
      "node node-b exited with code 1: Connection closed by peer"))
      << job.message();
  EXPECT_EQ(job.failure_class(), loom::v1::FAILURE_CLASS_OOM);  // exit 137
  EXPECT_EQ(job.user_restarts(), 1);  // one restart, charged once, to the cause's budget
  // A third report (the peer again, or anything less likely) changes nothing.
  const std::string settled = job.message();
  Beat("node-b", {Failed(job, 1, 1, "Connection reset by peer", 0, 500)});
  EXPECT_EQ(Get(job.id()).message(), settled);
}

// Issue 42 defect 7: a peer's "Connection closed by peer" arrives first and is charged to the
// infra budget provisionally ("infra restart 1 of 3"); the SIGKILLed rank's report then moves the
// restart to the user budget. The message, the events WatchJob streams and the history it
// replays must name the budget the record charged (user_restarts: 1), not the provisional one.
TEST_F(RestartTest, ReattributedRestartNamesTheBudgetTheRecordCharged) {
  Job job = RunTwoRankJob(/*max_restarts=*/2, /*max_infra_restarts=*/3);
  auto sub = scheduler_->WatchJob(job.id(), [] {});
  ASSERT_TRUE(sub.ok()) << sub.status();
  Beat("node-b", {Failed(job, 1, 1, "Connection closed by peer [addr-node-a]:29500", 0, 2000)});
  Job first = Get(job.id());
  ASSERT_EQ(first.infra_restarts(), 1);
  ASSERT_TRUE(absl::StrContains(first.message(), "(infra restart 1 of 3)")) << first.message();
  Beat("node-a", {Failed(job, 0, 137, "", /*signal=*/9, 1000)});
  job = Get(job.id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(job.user_restarts(), 1);
  EXPECT_EQ(job.infra_restarts(), 0);
  EXPECT_TRUE(absl::StrContains(job.message(), "(user restart 1 of 2)")) << job.message();
  EXPECT_FALSE(absl::StrContains(job.message(), "infra restart")) << job.message();
  // The newest streamed event carries the record as re-attributed.
  loom::v1::JobEvent e, last;
  while ((*sub)->Pop(&e)) last = e;
  scheduler_->Unwatch(*sub);
  EXPECT_EQ(last.job().user_restarts(), 1);
  EXPECT_TRUE(absl::StrContains(last.job().message(), "(user restart 1 of 2)"))
      << last.job().message();
  // The stored history entry of the RECOVERING change, as WatchJob replays it once the job ended.
  ASSERT_TRUE(scheduler_->KillJob(job.id()).ok());
  auto replay = scheduler_->WatchJob(job.id(), [] {});
  ASSERT_TRUE(replay.ok()) << replay.status();
  bool saw_recovering = false;
  while ((*replay)->Pop(&e)) {
    if (e.type() != "History" || e.job().phase() != loom::v1::JOB_PHASE_RECOVERING) continue;
    saw_recovering = true;
    EXPECT_TRUE(absl::StrContains(e.job().message(), "(user restart 1 of 2)")) << e.job().message();
    EXPECT_FALSE(absl::StrContains(e.job().message(), "infra restart")) << e.job().message();
  }
  scheduler_->Unwatch(*replay);
  EXPECT_TRUE(saw_recovering);
}

// Rank 1 fails on a CRC mismatch (data error); rank 0's "Connection reset by peer" arrives
// first. With no user restart allowed, the job still recovers: the peer symptom is charged to the
// infra budget provisionally, and rank 1's report confirms it there.
TEST_F(RestartTest, PeerSymptomReportedBeforeADataErrorSpendsNoUserRestart) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*max_infra_restarts=*/1);
  Beat("node-a", {Failed(job, 0, 1, "allgather: Read error: Connection reset by peer", 0, 2000)});
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
  Beat("node-b", {Failed(job, 1, kTrainerExitDataError,
                         "step_00000008/rank_1.shard (rank 1): CRC-32 0badf00d, manifest says "
                         "12345678", 0, 1000)});
  job = Get(job.id());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING) << job.message();
  EXPECT_EQ(job.user_restarts(), 0);
  EXPECT_EQ(job.infra_restarts(), 1);
  EXPECT_TRUE(absl::StrContains(job.message(), "attempt 1 failed: rank 1 on node node-b exited "
                                               "with code 65 (data error)"))
      << job.message();
}

// The same order with a real user error behind it: the restart moves to the user budget, and
// with none left there the job ends FAILED as it would have at once.
TEST_F(RestartTest, PeerSymptomThenAUserErrorWithNoUserRestartLeftFailsTheJob) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*max_infra_restarts=*/1);
  Beat("node-a", {Failed(job, 0, 1, "Connection closed by peer", 0, 2000)});
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
  Beat("node-b", {Failed(job, 1, 1, "ValueError in the data loader", 0, 1000)});
  job = Get(job.id());
  EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED) << job.message();
  EXPECT_EQ(job.user_restarts(), 0);
  EXPECT_EQ(job.infra_restarts(), 0);
  EXPECT_EQ(job.failure_class(), loom::v1::FAILURE_CLASS_USER);
  EXPECT_TRUE(absl::StrContains(job.message(), "ValueError in the data loader")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "all 0 user restarts used")) << job.message();
}

TEST_F(RestartTest, BetweenEqualReportsTheRankThatExitedFirstIsBlamed) {
  Job job = RunTwoRankJob(/*max_restarts=*/2);
  Beat("node-b", {Failed(job, 1, 1, "gloo: timed out", 0, /*exit_time_us=*/5000)});
  Beat("node-a", {Failed(job, 0, 1, "disk full writing the checkpoint", 0, /*exit_time_us=*/4000)});
  job = Get(job.id());
  EXPECT_TRUE(absl::StrContains(job.message(), "attempt 1 failed: rank 0 on node node-a exited "
                                               "with code 1: disk full writing the checkpoint "
                                               "(likely the cause: it exited first)"))
      << job.message();
}

// A corrupt newest committed checkpoint (one flipped byte in rank 1's shard) is skipped for the
// intact one before it, marked corrupt, and the new attempt's message says so.
TEST_F(RestartTest, CorruptNewestCheckpointIsSkippedForThePreviousIntactOne) {
  Job job = RunTwoRankJob(/*max_restarts=*/0, /*max_infra_restarts=*/1);
  for (int64_t step : {4, 8}) {
    for (int r = 0; r < 2; ++r) {
      storage::ShardManifest m;
      m.step = step;
      m.rank = r;
      m.world_size = 2;
      m.params.push_back({"w", {64}, 64, 0, 0});
      storage::AssignPartitionLayout(m);
      std::vector<float> data(m.section_numel, 0.25f * static_cast<float>(step));
      const float* sections[] = {data.data()};
      ASSERT_TRUE(storage::WriteShard(
                      absl::StrCat(job.checkpoint_dir(), "/", storage::StepDirName(step)), m,
                      sections)
                      .ok());
    }
  }
  {
    std::fstream f(job.checkpoint_dir() + "/step_00000008/rank_1.shard",
                   std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(17);
    f.put('\x7f');
  }
  // Node b is lost (infra): the job recovers onto a and c.
  clock_.Advance(options_.heartbeat_timeout + absl::Seconds(1));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING)});
  Beat("node-c");
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RECOVERING) << job.message();
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
  clock_.Advance(options_.restart_backoff_cap);
  Beat("node-a");
  Beat("node-c");
  Cycle();
  job = Get(job.id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "step_00000004; skipped step 8 (")) << job.message();
  EXPECT_TRUE(absl::StrContains(job.message(), "rank_1.shard")) << job.message();
  EXPECT_EQ(job.user_restarts(), 0);
  loom::v1::HeartbeatResponse a = Beat(job.rank_nodes(0));
  ASSERT_EQ(a.start_size(), 1);
  EXPECT_EQ(a.start(0).resume_from(), job.checkpoint_dir() + "/step_00000004");
  auto list = storage::ListCheckpoints(job.checkpoint_dir());
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_TRUE((*list)[1].corrupt);
  EXPECT_FALSE((*list)[1].committed);
}

// WatchJob of an ended job replays its phase changes (with the restart and its reason) before
// the snapshot, also after a scheduler restart (the history is stored with the job).
TEST_F(RestartTest, WatchOfAnEndedJobReplaysItsHistoryAcrossARestart) {
  options_.restart_backoff_base = absl::ZeroDuration();
  Start();
  Job job = RunTwoRankJob(/*max_restarts=*/1);
  job = FailRank(job, 1, 1, "first failure");
  Cycle();
  job = BringUp(job.id());
  job = FailRank(job, 1, 1, "second failure");
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED);

  auto replay = [&] {
    auto sub = scheduler_->WatchJob(job.id(), [] {});
    EXPECT_TRUE(sub.ok()) << sub.status();
    std::vector<loom::v1::JobEvent> events;
    loom::v1::JobEvent e;
    while ((*sub)->Pop(&e)) events.push_back(e);
    scheduler_->Unwatch(*sub);
    return events;
  };
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<loom::v1::JobEvent> events = replay();
    std::vector<std::string> phases;
    for (const auto& ev : events) {
      phases.push_back(absl::StrCat(ev.type(), ":", loom::v1::JobPhase_Name(ev.job().phase()),
                                    ":", ev.job().attempt()));
    }
    EXPECT_EQ(phases, (std::vector<std::string>{
                          "History:JOB_PHASE_PENDING:0", "History:JOB_PHASE_STARTING:1",
                          "History:JOB_PHASE_RUNNING:1", "History:JOB_PHASE_RECOVERING:1",
                          "History:JOB_PHASE_STARTING:2", "History:JOB_PHASE_RUNNING:2",
                          "History:JOB_PHASE_FAILED:2", "Snapshot:JOB_PHASE_FAILED:2"}))
        << "pass " << pass;
    ASSERT_EQ(events.size(), 8u);
    EXPECT_TRUE(absl::StrContains(events[3].job().message(), "first failure"))
        << events[3].job().message();
    EXPECT_EQ(events[3].job().reason(), "RankFailed");
    EXPECT_TRUE(absl::StrContains(events[6].job().message(), "second failure"));
    EXPECT_GT(events[3].time().seconds(), 0);
    Start();  // a scheduler restart over the same database
  }
}

}  // namespace
}  // namespace loom
