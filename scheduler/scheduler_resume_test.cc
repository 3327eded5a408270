// ResumeJob (issue 49): a FAILED or CANCELLED job continues in place from its newest committed
// checkpoint: PENDING with fresh restart budgets, then the next cycle places attempt + 1 with
// RankAssignment.resume_from = that checkpoint's step directory (scheduler_test_fixture.h).
#include "absl/strings/match.h"
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

// Rank 0 reports step `step` with its newest checkpoint at `checkpoint_step`.
RankStatus Progressing(const Job& job, int64_t step, int64_t checkpoint_step, int port) {
  RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING, port);
  st.mutable_progress()->set_step(step);
  st.mutable_progress()->set_last_checkpoint_step(checkpoint_step);
  return st;
}

RankStatus Crashed(const Job& job, int rank) {
  RankStatus st = Rank(job, rank, loom::v1::RANK_STATE_FAILED);
  st.set_exit_code(1);
  st.set_error("boom");
  return st;
}

class SchedulerResumeTest : public SchedulerTest {
 protected:
  // A 2-rank job (max_restarts 0) on node-a/node-b that FAILED after committing `checkpoint_step`
  // (none if 0); both ranks of its attempt have ended.
  Job FailedJob(int64_t checkpoint_step) {
    Job job = RunTwoRankJob();
    if (checkpoint_step > 0) {
      WriteCommittedCheckpoint(job, checkpoint_step, 2);
      Beat("node-a", {Progressing(job, checkpoint_step + 5, checkpoint_step, 29500)});
    }
    Beat("node-b", {Crashed(job, 1)});
    Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
    job = Get(job.id());
    EXPECT_EQ(job.phase(), loom::v1::JOB_PHASE_FAILED);
    return job;
  }
};

TEST_F(SchedulerResumeTest, FailedJobResumesFromNewestCommittedCheckpointWithFreshBudgets) {
  Register("node-a", 1);
  Register("node-b", 1);
  Register("node-c", 1);
  Job job = Submit(2, /*max_restarts=*/1);
  Cycle();
  job = Get(job.id());
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  // Attempt 1 fails: its one restart is used; attempt 2 runs on node-a and node-c.
  Beat("node-b", {Crashed(job, 1)});
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
  Cycle();
  Job second = Get(job.id());
  ASSERT_EQ(second.attempt(), 2);
  ASSERT_EQ(second.rank_nodes(1), "node-c");
  Beat("node-a", {Rank(second, 0, loom::v1::RANK_STATE_RUNNING, 29600)});
  Beat("node-c", {Rank(second, 1, loom::v1::RANK_STATE_RUNNING)});
  WriteCommittedCheckpoint(second, 10, 2);
  WriteCommittedCheckpoint(second, 30, 2);
  Beat("node-a", {Progressing(second, 34, 30, 29600)});
  // Attempt 2 fails too: no restart left, FAILED, and the message says how to continue.
  Beat("node-c", {Crashed(second, 1)});
  Job failed = Get(job.id());
  ASSERT_EQ(failed.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(failed.user_restarts(), 1);
  EXPECT_TRUE(absl::StrContains(failed.message(), "all 1 user restarts used")) << failed.message();
  EXPECT_TRUE(absl::StrContains(failed.message(), "; `loomctl resume " + job.id() +
                                                      "` continues it from step 30"))
      << failed.message();
  EXPECT_TRUE(failed.has_end_time());
  Beat("node-a", {Rank(second, 0, loom::v1::RANK_STATE_STOPPED)});

  for (int i = 0; i < 20; ++i) {  // the job is 100 s older when it is resumed; nodes stay live
    clock_.Advance(absl::Seconds(5));
    for (const char* node : {"node-a", "node-b", "node-c"}) Beat(node);
  }
  absl::StatusOr<Job> resumed = scheduler_->ResumeJob(job.id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const std::string step30 = job.checkpoint_dir() + "/step_00000030";
  EXPECT_EQ(resumed->id(), job.id());
  EXPECT_EQ(resumed->phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(resumed->reason(), "Resumed");
  EXPECT_EQ(resumed->failure_class(), loom::v1::FAILURE_CLASS_UNSPECIFIED);
  EXPECT_FALSE(resumed->has_end_time());
  EXPECT_EQ(resumed->user_restarts(), 0);
  EXPECT_EQ(resumed->infra_restarts(), 0);
  EXPECT_EQ(resumed->attempt(), 2);
  EXPECT_EQ(resumed->progress().step(), 30);  // back at the checkpoint (it had reported 34)
  EXPECT_EQ(resumed->progress().last_checkpoint_step(), 30);
  EXPECT_TRUE(absl::StrContains(resumed->message(), "from step 30 (" + step30 + ")"))
      << resumed->message();
  EXPECT_TRUE(absl::StrContains(resumed->message(), "next attempt (3)")) << resumed->message();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_PENDING);
  // Counted as one FAILED -> PENDING change; the gauges moved the job back to PENDING.
  EXPECT_EQ(MetricSum(*registry_, "loom_job_phase_transitions_total", "from", "FAILED"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "FAILED"), 0);

  // The next cycle places attempt 3; every rank resumes from step 30. Its queue wait counts
  // from the resume (7 s), not from its submission (107 s).
  auto queue_wait_sum = [this] {
    for (const prometheus::MetricFamily& f : registry_->Collect()) {
      if (f.name == "loom_job_queue_wait_seconds") return f.metric[0].histogram.sample_sum;
    }
    return -1.0;
  };
  const double waited_before = queue_wait_sum();
  clock_.Advance(absl::Seconds(7));
  Cycle();
  EXPECT_DOUBLE_EQ(queue_wait_sum() - waited_before, 7);
  Job third = Get(job.id());
  ASSERT_EQ(third.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(third.attempt(), 3);
  EXPECT_TRUE(absl::StrContains(third.message(), "resuming from " + step30)) << third.message();
  EXPECT_EQ(third.progress().step(), 30);  // back at the checkpoint until attempt 3 reports
  ASSERT_EQ(third.rank_nodes_size(), 2);
  HeartbeatResponse start0 = Beat(third.rank_nodes(0));
  ASSERT_EQ(start0.start_size(), 1);
  EXPECT_EQ(start0.start(0).attempt(), 3);
  EXPECT_EQ(start0.start(0).rank(), 0);
  EXPECT_EQ(start0.start(0).resume_from(), step30);
  Beat(third.rank_nodes(0), {Rank(third, 0, loom::v1::RANK_STATE_RUNNING, 29700)});
  HeartbeatResponse start1 = Beat(third.rank_nodes(1));
  ASSERT_EQ(start1.start_size(), 1);
  EXPECT_EQ(start1.start(0).resume_from(), step30);

  // The budget is fresh: a failure of attempt 3 restarts it instead of failing it.
  Beat(third.rank_nodes(1), {Rank(third, 1, loom::v1::RANK_STATE_RUNNING)});
  Beat(third.rank_nodes(1), {Crashed(third, 1)});
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RECOVERING);
}

TEST_F(SchedulerResumeTest, CancelledJobResumesAndARestartedSchedulerReadsItBackPending) {
  const std::string db = TmpDir() + "/resume.db";
  RestartOnSqlite(db);
  Job job = RunTwoRankJob();
  WriteCommittedCheckpoint(job, 40, 2);
  ASSERT_TRUE(scheduler_->KillJob(job.id()).ok());
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_CANCELLED);
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_STOPPED)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_STOPPED)});

  absl::StatusOr<Job> resumed = scheduler_->ResumeJob(job.id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_TRUE(absl::StrContains(resumed->message(), "was CANCELLED")) << resumed->message();
  EXPECT_EQ(MetricSum(*registry_, "loom_job_phase_transitions_total", "from", "CANCELLED"), 1);

  // "Crash" and reopen the file: the resumed job is read back PENDING with its fresh budget.
  RestartOnSqlite(db);
  Job back = Get(job.id());
  EXPECT_EQ(back.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(back.reason(), "Resumed");
  EXPECT_FALSE(back.has_end_time());
  EXPECT_EQ(back.attempt(), 1);
  EXPECT_EQ(MetricValue(*registry_, "loom_jobs", "phase", "PENDING"), 1);
  Beat("node-a");
  Beat("node-b");
  Cycle();
  Job second = Get(job.id());
  ASSERT_EQ(second.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(second.attempt(), 2);
  HeartbeatResponse start0 = Beat(second.rank_nodes(0));
  ASSERT_EQ(start0.start_size(), 1);
  EXPECT_EQ(start0.start(0).resume_from(), job.checkpoint_dir() + "/step_00000040");
}

TEST_F(SchedulerResumeTest, RefusesUnknownUnendedSucceededAndCheckpointlessJobs) {
  absl::StatusOr<Job> unknown = scheduler_->ResumeJob("job-00000000");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();

  Job running = RunTwoRankJob();
  absl::StatusOr<Job> r = scheduler_->ResumeJob(running.id());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "is RUNNING")) << r.status();
  EXPECT_EQ(Get(running.id()).phase(), loom::v1::JOB_PHASE_RUNNING);

  Beat("node-a", {Rank(running, 0, loom::v1::RANK_STATE_SUCCEEDED, 29500)});
  Beat("node-b", {Rank(running, 1, loom::v1::RANK_STATE_SUCCEEDED)});
  ASSERT_EQ(Get(running.id()).phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  r = scheduler_->ResumeJob(running.id());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "SUCCEEDED")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "nothing to resume")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "submit a new job")) << r.status();

  Cycle();  // frees the slots of the finished job
  Job bare = FailedJob(/*checkpoint_step=*/0);
  r = scheduler_->ResumeJob(bare.id());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), bare.checkpoint_dir())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "start over")) << r.status();
  EXPECT_FALSE(absl::StrContains(bare.message(), "loomctl resume")) << bare.message();
  Job still = Get(bare.id());
  EXPECT_EQ(still.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(MetricSum(*registry_, "loom_job_phase_transitions_total", "from", "FAILED"), 0);

  std::string overlong(300, 'x');
  EXPECT_EQ(scheduler_->ResumeJob(overlong).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Job> empty = scheduler_->ResumeJob("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument) << empty.status();
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "job_id")) << empty.status();
}

// wait_for_capacity as SubmitJob's: a gang no set of registered nodes could hold is refused
// unless the caller asks to wait for capacity.
TEST_F(SchedulerResumeTest, GangTooBigForTheRegisteredNodesNeedsWaitForCapacity) {
  Job job = FailedJob(/*checkpoint_step=*/20);
  // node-b goes away: one 1-slot node is left for a 2-rank gang.
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat("node-a");
  }
  Cycle();
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  int live = 0;
  for (const loom::v1::NodeInfo& n : *nodes) live += n.live() ? 1 : 0;
  ASSERT_EQ(live, 1);

  absl::StatusOr<Job> refused = scheduler_->ResumeJob(job.id(), /*wait_for_capacity=*/false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_FAILED);
  absl::StatusOr<Job> waiting = scheduler_->ResumeJob(job.id(), /*wait_for_capacity=*/true);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->phase(), loom::v1::JOB_PHASE_PENDING);
}

}  // namespace
}  // namespace loom
