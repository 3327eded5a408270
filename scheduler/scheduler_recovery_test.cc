// Recovery: a scheduler restart over SQLite, restarts resuming from the newest committed
// checkpoint, retention, and the infra restart budget (scheduler_test_fixture.h).
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

// Restart: a new Scheduler over the same SQLite file keeps every acknowledged job and re-adopts
// the ranks the workers still run.
TEST_F(SchedulerTest, RestartRecoversJobsFromSqlite) {
  const std::string db = TmpDir() + "/restart.db";
  RestartOnSqlite(db);
  Job running = RunTwoRankJob();
  Job pending = Submit(2);
  Cycle();
  ASSERT_EQ(Get(pending.id()).reason(), "WaitingForSlots");

  // "Crash": drop the scheduler and the store, reopen the file.
  clock_.Advance(absl::Minutes(5));  // longer than the heartbeat timeout
  RestartOnSqlite(db);

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
  {
    RankStatus stepping = Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500);
    stepping.mutable_progress()->set_step(14);
    stepping.mutable_progress()->set_last_checkpoint_step(10);
    Beat("node-a", {stepping});
  }
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
  // Back at step 10 until attempt 2 reports: steps 11-14 are lost (issue 53: it kept showing the
  // failed attempt's last step, and a job whose resumed attempt had nothing left to do ended
  // SUCCEEDED at that stale step).
  EXPECT_EQ(second.progress().step(), 10);
  EXPECT_EQ(second.progress().last_checkpoint_step(), 10);
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
