// Rendezvous hand-out, rank failures and their classification, kills, node liveness (silent
// and lost nodes) and hang detection through the scheduler API (scheduler_test_fixture.h).
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

// Break-it H3: the worker re-checks a job's paths at start by the tenant's own roots, which the
// scheduler sends with each assignment when it confines paths (and not otherwise).
TEST_F(SchedulerTest, AssignmentsCarryTheTenantsRootsWhenPathsAreConfined) {
  options_.confine_paths = true;
  options_.queues.data_roots = std::vector<std::string>{"/data/shared"};
  options_.queues.tenant_data_roots["team-a"] = {"/data/a"};
  options_.queues.tenant_scratch_roots["team-a"] = {"/nvme/a"};
  Start();
  Register("node-a", 1);
  absl::StatusOr<Job> job = scheduler_->SubmitJob(TestJobSpecWithRanks(1), "", nullptr, "team-a");
  ASSERT_TRUE(job.ok()) << job.status();
  Cycle();
  HeartbeatResponse a = Beat("node-a");
  ASSERT_EQ(a.start_size(), 1);
  EXPECT_TRUE(a.start(0).tenant_roots_set());
  EXPECT_EQ(std::vector<std::string>(a.start(0).tenant_data_roots().begin(),
                                     a.start(0).tenant_data_roots().end()),
            std::vector<std::string>{"/data/a"});
  EXPECT_EQ(std::vector<std::string>(a.start(0).tenant_scratch_roots().begin(),
                                     a.start(0).tenant_scratch_roots().end()),
            std::vector<std::string>{"/nvme/a"});
}

TEST_F(SchedulerTest, AssignmentsCarryNoRootsWithoutConfinement) {
  Register("node-a", 1);
  Job job = Submit(1);
  Cycle();
  HeartbeatResponse a = Beat("node-a");
  ASSERT_EQ(a.start_size(), 1);
  EXPECT_FALSE(a.start(0).tenant_roots_set());
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

// Issue 53's operator pass: after the scheduler itself was stopped for 3 min, it declared every
// live worker lost (their heartbeats could not be served) and restarted a job. A pause the
// daemon excuses does not count against the workers; silence after it still does.
TEST_F(SchedulerTest, AnExcusedPauseOfTheSchedulerLosesNoNode) {
  Job job = RunTwoRankJob();
  clock_.Advance(absl::Minutes(3));  // the scheduler did not run: no heartbeat was served
  scheduler_->ExcusePause(absl::Minutes(3));
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 0);
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  // The workers answer again: nothing happened.
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
  Cycle();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_RUNNING);
  // Real silence after the pause is still silence: node-b is lost after the timeout (10 s).
  clock_.Advance(absl::Seconds(6));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  clock_.Advance(absl::Seconds(5));
  Beat("node-a", {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)});
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 1);
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_FAILED);
}

// The same pause is no hang: a RUNNING job whose steps stopped only while the scheduler was
// stopped is not ended as hung (the limit is 50 s; the pause 3 min). Without the excuse it is.
TEST_F(SchedulerTest, AnExcusedPauseIsNoHang) {
  options_.hang_step_time_factor = 10;
  options_.hang_min_timeout = absl::Seconds(30);
  for (const bool excused : {true, false}) {
    SCOPED_TRACE(excused ? "excused" : "not excused");
    scheduler_.reset();
    store_ = std::make_unique<InMemoryJobStore>();
    Start();
    Job job = RunTwoRankJob();
    for (int step = 1; step <= 6; ++step) {  // a step every 5 s
      clock_.Advance(absl::Seconds(5));
      RankStatus st = Rank(job, 0, loom::v1::RANK_STATE_RUNNING);
      st.mutable_progress()->set_step(step);
      Beat("node-a", {st});
      Beat("node-b", {Rank(job, 1, loom::v1::RANK_STATE_RUNNING)});
      Cycle();
    }
    clock_.Advance(absl::Minutes(3));
    if (excused) scheduler_->ExcusePause(absl::Minutes(3));
    Cycle();
    const Job after = Get(job.id());
    EXPECT_EQ(after.phase(), excused ? loom::v1::JOB_PHASE_RUNNING : loom::v1::JOB_PHASE_FAILED);
    if (!excused) {
      EXPECT_EQ(after.reason(), "NodeLost") << after.message();
    }
  }
}

// Nor does it count against a gang's ready timeout (1 min here): a job placed just before the
// scheduler stopped for 3 min is still STARTING, waiting for its ranks, when it wakes.
TEST_F(SchedulerTest, AnExcusedPauseDoesNotCountAgainstTheReadyTimeout) {
  options_.ready_timeout = absl::Minutes(1);
  scheduler_.reset();
  Start();
  Register("node-a", 1);
  Register("node-b", 1);
  Job job = Submit(2);
  Cycle();
  ASSERT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  clock_.Advance(absl::Minutes(3));
  scheduler_->ExcusePause(absl::Minutes(3));
  Cycle();
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_STARTING);
  // Awake time after the pause counts: 61 s more and the gang is late.
  clock_.Advance(absl::Seconds(30));
  Beat("node-a");
  Beat("node-b");
  clock_.Advance(absl::Seconds(31));
  Beat("node-a");
  Beat("node-b");
  Cycle();
  EXPECT_NE(Get(job.id()).phase(), loom::v1::JOB_PHASE_STARTING);
}

// Without the excuse the same 3 minutes lose both nodes (what the test above guards against).
TEST_F(SchedulerTest, AnUnexcusedSilenceLosesTheNodes) {
  Job job = RunTwoRankJob();
  clock_.Advance(absl::Minutes(3));
  Cycle();
  EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), 2);
  EXPECT_EQ(Get(job.id()).phase(), loom::v1::JOB_PHASE_FAILED);
}

}  // namespace
}  // namespace loom
