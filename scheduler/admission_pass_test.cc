// The admission-pass rules (docs/scheduling.md "Admission passes"; scheduler_admission_pass.cc)
// through the Scheduler's public API: a cycle in which nothing the pass reads changed runs no
// placement, and each kind of change (a node, a submission, a kill, a rank's end, a backoff
// expiring) makes the next cycle place again; a pass limited to admission_queue_depth jobs
// leaves deeper jobs for the next full pass.
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

using PassKind = Scheduler::AdmissionPassStats::Kind;

class AdmissionPassTest : public SchedulerTest {
 protected:
  PassKind CycleKind() {
    EXPECT_TRUE(scheduler_->RunSchedulingCycle().ok());
    return scheduler_->LastAdmissionPass().kind;
  }
  // Cycles until one skips (at most 3: the cycle after a pass that changed something looks
  // once more); false if none did.
  bool SettlesToSkipping() {
    for (int i = 0; i < 3; ++i) {
      if (CycleKind() == PassKind::kSkipped) return true;
    }
    return false;
  }
};

TEST_F(AdmissionPassTest, ACycleWithNothingChangedDoesNoPlacement) {
  Register("n0", 1);
  Job big = Submit(4);  // needs 4 slots, the cluster has 1: Unschedulable
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "a new job is a change";
  EXPECT_EQ(Get(big.id()).reason(), "Unschedulable");
  const double infeasible =
      MetricValue(*registry_, "loom_admission_attempts_total", "result", "infeasible");
  EXPECT_EQ(CycleKind(), PassKind::kSkipped);
  Beat("n0");  // a heartbeat that changes no rank is no change
  EXPECT_EQ(CycleKind(), PassKind::kSkipped);
  EXPECT_EQ(CycleKind(), PassKind::kSkipped);
  EXPECT_EQ(scheduler_->LastAdmissionPass().waiting, 1);
  // Skipped passes decide nothing: no further admission attempt was counted.
  EXPECT_EQ(MetricValue(*registry_, "loom_admission_attempts_total", "result", "infeasible"),
            infeasible);
  EXPECT_EQ(Get(big.id()).reason(), "Unschedulable");
}

TEST_F(AdmissionPassTest, EachChangeMakesTheNextCyclePlaceAgain) {
  Register("n0", 1);
  Job big = Submit(4);
  ASSERT_TRUE(SettlesToSkipping());
  // A node: now 4 slots, and the job is placed.
  Register("n1", 3);
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "a registered node";
  EXPECT_EQ(Get(big.id()).phase(), v1::JOB_PHASE_STARTING);
  ASSERT_TRUE(SettlesToSkipping());
  // A submission.
  Job small = Submit(1);
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "a submission";
  EXPECT_EQ(Get(small.id()).phase(), v1::JOB_PHASE_PENDING);  // every slot is taken
  ASSERT_TRUE(SettlesToSkipping());
  // A kill frees the slots (its ranks are asked to stop, then end when n0/n1 stop reporting).
  ASSERT_TRUE(scheduler_->KillJob(big.id()).ok());
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "a kill";
  ASSERT_TRUE(SettlesToSkipping());
  Beat("n0");  // the killed job's rank 0 is gone: its slot is free
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "a rank that ended";
  EXPECT_EQ(Get(small.id()).phase(), v1::JOB_PHASE_STARTING);
  ASSERT_TRUE(SettlesToSkipping());
  // A cordon.
  ASSERT_TRUE(scheduler_->CordonNode("n1", "maintenance").ok());
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "a cordoned node";
}

// The cycle's phase times (Scheduler::CyclePhases, the daemon's cycle trace): a pass that
// places has a snapshot, decide and apply time, all within the cycle's own wall time as the
// caller measures it; a skipped pass builds no snapshot and decides nothing.
TEST_F(AdmissionPassTest, CyclePhasesAccountForTheCycleAndASkippedPassHasNoSnapshot) {
  Register("n0", 1);
  for (int i = 0; i < 50; ++i) Submit(1);
  const absl::Time before = absl::Now();
  ASSERT_NE(CycleKind(), PassKind::kSkipped);
  const absl::Duration wall = absl::Now() - before;
  const Scheduler::CyclePhases placed = scheduler_->LastCyclePhases();
  EXPECT_GT(placed.snapshot, absl::ZeroDuration());
  EXPECT_GT(placed.decide, absl::ZeroDuration());
  EXPECT_GT(placed.apply, absl::ZeroDuration());
  EXPECT_GT(placed.store, absl::ZeroDuration()) << "the placed job is stored";
  for (absl::Duration d : {placed.checks, placed.resume_wait, placed.snapshot, placed.decide,
                           placed.apply, placed.store}) {
    EXPECT_GE(d, absl::ZeroDuration());
  }
  EXPECT_LE(placed.checks + placed.resume_wait + placed.snapshot + placed.decide + placed.apply +
                placed.store,
            wall);
  ASSERT_TRUE(SettlesToSkipping());
  const Scheduler::CyclePhases skipped = scheduler_->LastCyclePhases();
  EXPECT_EQ(skipped.snapshot, absl::ZeroDuration());
  EXPECT_EQ(skipped.decide, absl::ZeroDuration());
}

// A node that misses its heartbeats while its job still steps elsewhere is kept but takes no new
// ranks (unreachable); its heartbeat makes it take ranks again. Neither changes a job record or
// the rank table, so only the node-change count makes the next cycle place again.
TEST_F(AdmissionPassTest, ANodeBecomingUnreachableOrReachableAgainMakesTheNextCyclePlace) {
  Job job = RunTwoRankJob();
  ASSERT_TRUE(SettlesToSkipping());
  int step = 0;
  auto rank1_steps = [&]() {  // one second later, rank 1 (node-b) reports its next step
    clock_.Advance(absl::Seconds(1));
    RankStatus st = Rank(job, 1, v1::RANK_STATE_RUNNING);
    st.mutable_progress()->set_step(++step);
    Beat("node-b", {st});
  };
  // node-a is silent from now on; until heartbeat_timeout has passed nothing the pass reads
  // changes.
  const absl::Time silent_since = clock_.Now();
  rank1_steps();
  ASSERT_TRUE(SettlesToSkipping());
  while (clock_.Now() + absl::Seconds(1) - silent_since <= options_.heartbeat_timeout) {
    rank1_steps();
    ASSERT_EQ(CycleKind(), PassKind::kSkipped) << "node-a silent for " << step << " s";
  }
  rank1_steps();
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "node-a became unreachable";
  ASSERT_TRUE(SettlesToSkipping());
  // node-a heartbeats again (without a rank change): reachable.
  Beat("node-a", {Rank(job, 0, v1::RANK_STATE_RUNNING, 29500)});
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "node-a is reachable again";
  ASSERT_TRUE(SettlesToSkipping());
  Beat("node-a", {Rank(job, 0, v1::RANK_STATE_RUNNING, 29500)});
  EXPECT_EQ(CycleKind(), PassKind::kSkipped) << "already reachable: no change";
}

TEST_F(AdmissionPassTest, AnExpiringBackoffWakesThePass) {
  options_.restart_backoff_base = absl::Seconds(5);
  Start();
  Job job = RunTwoRankJob(/*max_restarts=*/1);
  RankStatus failed = Rank(job, 1, v1::RANK_STATE_FAILED);
  failed.set_exit_code(1);
  Beat("node-b", {failed});  // the job's own failure: RECOVERING, backoff 5 s
  ASSERT_EQ(Get(job.id()).phase(), v1::JOB_PHASE_RECOVERING);
  Beat("node-a");  // rank 0 was told to stop and is no longer reported: ended
  Beat("node-b");
  Cycle();
  EXPECT_EQ(Get(job.id()).reason(), "Backoff");
  ASSERT_TRUE(SettlesToSkipping());
  clock_.Advance(absl::Seconds(3));
  Beat("node-a");
  Beat("node-b");
  EXPECT_EQ(CycleKind(), PassKind::kSkipped) << "the backoff has 2 s left";
  clock_.Advance(absl::Seconds(3));
  Beat("node-a");
  Beat("node-b");
  EXPECT_NE(CycleKind(), PassKind::kSkipped) << "the backoff expired: nothing else changed";
  EXPECT_EQ(Get(job.id()).phase(), v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Get(job.id()).attempt(), 2);
}

TEST_F(AdmissionPassTest, APartialPassLeavesDeeperJobsForTheNextFullPass) {
  options_.admission_queue_depth = 1;
  options_.admission_full_interval = absl::Seconds(10);
  Start();
  Register("n0", 1);
  Job big = Submit(4);  // first in queue order (oldest), never fits
  EXPECT_EQ(CycleKind(), PassKind::kFull) << "the first pass is a full one";
  Job small = Submit(1);  // fits, but is second in queue order
  EXPECT_EQ(CycleKind(), PassKind::kPartial);
  EXPECT_EQ(scheduler_->LastAdmissionPass().considered, 1);
  EXPECT_EQ(scheduler_->LastAdmissionPass().waiting, 2);
  EXPECT_EQ(Get(small.id()).phase(), v1::JOB_PHASE_PENDING);
  EXPECT_EQ(CycleKind(), PassKind::kSkipped) << "nothing changed and no full pass is due";
  clock_.Advance(absl::Seconds(11));
  Beat("n0");
  EXPECT_EQ(CycleKind(), PassKind::kFull) << "jobs were left unconsidered and a full pass is due";
  EXPECT_EQ(Get(small.id()).phase(), v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Get(big.id()).reason(), "Unschedulable");
}

TEST(AdmissionPassOptionsTest, NegativeDepthOrIntervalIsRejectedNamingTheField) {
  SchedulerOptions options;
  options.checkpoint_root = "/tmp";
  options.admission_queue_depth = -1;
  absl::Status s = options.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("admission_queue_depth"), absl::string_view::npos) << s;
  options.admission_queue_depth = 0;
  options.admission_full_interval = absl::Seconds(-1);
  s = options.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("admission_full_interval"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace loom
