// Scheduling policy on the core with a fake clock (docs/scheduling.md): ordering by priority,
// fair share and age; queue quotas and borrowing; backfill; topology; preemption
// (scheduler_policy_test_fixture.h).
#include "scheduler/scheduler_policy_test_fixture.h"

namespace loom {
namespace {

TEST_F(PolicyTest, HigherPriorityFirstThenAge) {
  Register("node-a", 1);
  const std::string low = Submit(Spec(1, 0));
  const std::string older_high = Submit(Spec(1, 5));
  const std::string newer_high = Submit(Spec(1, 5));
  Cycle();
  EXPECT_EQ(Phase(older_high), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(low), loom::v1::JOB_PHASE_PENDING);
  absl::StatusOr<loom::v1::ExplainPendingResponse> e = scheduler_->ExplainPending(low);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->queue_position(), 2);
  ASSERT_EQ(e->jobs_ahead_size(), 1);
  EXPECT_EQ(e->jobs_ahead(0), newer_high);
}

TEST_F(PolicyTest, FairShareInterleavesTenantsByDominantShare) {
  UseQueues("queues: [{name: qa, tenant: t1}, {name: qb, tenant: t2}]");
  Register("node-a", 3);
  const std::string a1 = Submit(Spec(1, 0, "qa"), "t1");
  const std::string a2 = Submit(Spec(1, 0, "qa"), "t1");
  const std::string a3 = Submit(Spec(1, 0, "qa"), "t1");
  const std::string b1 = Submit(Spec(1, 0, "qb"), "t2");
  Cycle();
  // a1 (both shares 0: oldest), then t2 (share 0 < 1/3): b1, then a2 (tie 1/3: oldest).
  EXPECT_EQ(Phase(a1), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(b1), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(a2), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(a3), loom::v1::JOB_PHASE_PENDING);
}

TEST_F(PolicyTest, FairShareWeightsFavourTheHeavierTenant) {
  UseQueues(
      "tenants: {t1: {weight: 3}}\n"
      "queues: [{name: qa, tenant: t1}, {name: qb, tenant: t2}]");
  Register("node-a", 4);
  const std::string a1 = Submit(Spec(1, 0, "qa"), "t1");
  const std::string a2 = Submit(Spec(1, 0, "qa"), "t1");
  const std::string a3 = Submit(Spec(1, 0, "qa"), "t1");
  const std::string b1 = Submit(Spec(1, 0, "qb"), "t2");
  const std::string b2 = Submit(Spec(1, 0, "qb"), "t2");
  Cycle();
  // t1's share per job is 1/4 / 3 = 1/12: a1, b1 (0 < 1/12), a2 (1/12 < 1/4), a3 (2/12 < 1/4).
  EXPECT_EQ(Phase(a3), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(b1), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(b2), loom::v1::JOB_PHASE_PENDING);
}

TEST_F(PolicyTest, SubmissionToUnknownOrForeignQueueIsRefused) {
  UseQueues("queues: [{name: qa, tenant: t1}, {name: shared}]");
  absl::StatusOr<Job> unknown = scheduler_->SubmitJob(Spec(1, 0, "qz"), "", nullptr, "t1");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("queue qz does not exist"), std::string::npos);
  absl::StatusOr<Job> foreign = scheduler_->SubmitJob(Spec(1, 0, "qa"), "", nullptr, "t2");
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(foreign.status().message().find("queue qa belongs to tenant t1"), std::string::npos);
  // No "default" queue in this config.
  EXPECT_EQ(scheduler_->SubmitJob(Spec(1), "", nullptr, "t1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(scheduler_->SubmitJob(Spec(1, 0, "shared"), "", nullptr, "t2").ok());
}

TEST_F(PolicyTest, QuotaAdmitsWithinNominalAndBorrowsOnlyIdleQuota) {
  UseQueues(
      "queues:\n"
      "  - {name: qa, tenant: t1, quota: {cpu: 2}, borrowing_limit: {cpu: 2}}\n"
      "  - {name: qb, tenant: t2, quota: {cpu: 2}}\n");
  Register("node-a", 8);
  const std::string a1 = Submit(Spec(2, 0, "qa"), "t1");
  const std::string a2 = Submit(Spec(1, 0, "qa"), "t1");  // borrows 1 of qb's idle 2
  Cycle();
  EXPECT_EQ(Phase(a1), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(Phase(a2), loom::v1::JOB_PHASE_STARTING);
  const std::string b1 = Submit(Spec(2, 0, "qb"), "t2");  // within its own nominal quota
  const std::string a3 = Submit(Spec(1, 0, "qa"), "t1");  // cohort would use 6 > 4
  const std::string b2 = Submit(Spec(1, 0, "qb"), "t2");  // qb has no borrowing limit
  Cycle();
  EXPECT_EQ(Phase(b1), loom::v1::JOB_PHASE_STARTING);
  Job a3_now = Get(a3);
  EXPECT_EQ(a3_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(a3_now.reason(), "WaitingForQuota");
  EXPECT_EQ(a3_now.message(),
            "queue qa quota for cpu is 2, 3 in use, job needs 1; no idle cpu quota to borrow "
            "(cohort uses 5 of 4)");
  Job b2_now = Get(b2);
  EXPECT_EQ(b2_now.reason(), "WaitingForQuota");
  EXPECT_EQ(b2_now.message(), "queue qb quota for cpu is 2, 2 in use, job needs 1");
  // ListQueues reports quota and usage.
  absl::StatusOr<std::vector<loom::v1::QueueInfo>> queues = scheduler_->ListQueues();
  ASSERT_TRUE(queues.ok());
  ASSERT_EQ(queues->size(), 2u);
  EXPECT_EQ((*queues)[0].name(), "qa");
  EXPECT_EQ((*queues)[0].nominal_quota().at("cpu"), 2);
  EXPECT_EQ((*queues)[0].borrowing_limit().at("cpu"), 2);
  EXPECT_EQ((*queues)[0].usage().at("cpu"), 3);
  EXPECT_EQ((*queues)[0].pending_jobs(), 1);
  EXPECT_EQ((*queues)[0].running_jobs(), 2);
  EXPECT_EQ((*queues)[1].usage().at("cpu"), 2);
  // When a1 ends, a3 fits the nominal quota again.
  Settle(2);
  Finish(a1);
  Cycle();
  EXPECT_EQ(Phase(a3), loom::v1::JOB_PHASE_STARTING);
}

// EASY backfill with an estimate: r runs 2 of node-a's 4 slots and will end in ~16 s (16 steps
// left at 1 s/step). The head h (4 ranks) is planned on node-a when r ends; the 2 free slots of
// node-a are reserved for it, so a 1-rank job may start on node-b but not on node-a.
TEST_F(PolicyTest, BackfillStartsOnlyJobsThatDoNotDelayTheHead) {
  Register("node-a", 4);
  Register("node-b", 1);
  const std::string r = Submit(Spec(2));
  Cycle();
  ASSERT_EQ(Get(r).rank_nodes(0), "node-a");
  Settle(3);
  ASSERT_EQ(Phase(r), loom::v1::JOB_PHASE_RUNNING);
  for (int step = 1; step <= 4; ++step) {  // 1 s per step: a median to estimate from
    clock_.Advance(absl::Seconds(1));
    SetProgress(r, step, 0);
    WorkerBeat("node-a");
  }
  const std::string h = Submit(Spec(4));
  const std::string small = Submit(Spec(1));
  const std::string two = Submit(Spec(2));
  Cycle();
  Job head = Get(h);
  EXPECT_EQ(head.reason(), "WaitingForSlots");
  EXPECT_NE(head.message().find("expected to start in about 16s"), std::string::npos)
      << head.message();
  // small backfills onto node-b (not part of h's plan).
  Job small_now = Get(small);
  ASSERT_EQ(small_now.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(small_now.rank_nodes(0), "node-b");
  // two would need node-a's reserved slots: refused.
  Job two_now = Get(two);
  EXPECT_EQ(two_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(two_now.reason(), "Queued");
  EXPECT_EQ(two_now.message(), "waiting behind job " + h +
                                   " (it holds a reservation; starting now would delay it)");
  // Without backfill, small would have waited too.
  options_.enable_backfill = false;
  scheduler_.reset();
  Start();
  const std::string small2 = Submit(Spec(1));
  Register("node-c", 1);
  Cycle();
  EXPECT_EQ(Phase(small2), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(Get(small2).message(), "waiting behind job " + h);
}

TEST_F(PolicyTest, TopologyPrefersOneDomainAndRequiresItWhenAsked) {
  Register("a1", 4, "rack-a");
  Register("a2", 4, "rack-a");
  Register("b1", 4, "rack-b");
  // 6 ranks fit only in rack-a as one domain: never split across racks.
  const std::string six = Submit(Spec(6));
  Cycle();
  Job six_now = Get(six);
  ASSERT_EQ(six_now.phase(), loom::v1::JOB_PHASE_STARTING);
  for (const std::string& n : six_now.rank_nodes()) EXPECT_NE(n, "b1");
  // 2 ranks: best fit is rack-a (2 left) rather than rack-b (4).
  const std::string two = Submit(Spec(2));
  Cycle();
  const Job two_now = Get(two);
  ASSERT_EQ(two_now.rank_nodes_size(), 2);
  for (const std::string& n : two_now.rank_nodes()) EXPECT_NE(n, "b1");
  // require_single_domain: 5 ranks would need rack-b (4 free) plus another domain.
  loom::v1::JobSpec strict = Spec(5);
  strict.mutable_resources()->set_require_single_domain(true);
  const std::string s = Submit(strict);
  Cycle();
  Job s_now = Get(s);
  EXPECT_EQ(s_now.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(s_now.reason(), "WaitingForSlots");
  EXPECT_EQ(s_now.message(), "needs 5 cpu rank slots in one topology domain; 4 of 12 are free");
  // Larger than any domain: never schedulable.
  loom::v1::JobSpec huge = Spec(9);
  huge.mutable_resources()->set_require_single_domain(true);
  const std::string hg = Submit(huge);
  Cycle();
  Job hg_now = Get(hg);
  EXPECT_EQ(hg_now.reason(), "Unschedulable");
  EXPECT_EQ(hg_now.message(),
            "needs 9 cpu rank slots in one topology domain (require_single_domain); the largest "
            "domain offers 8");
}

TEST_F(PolicyTest, SplitFreeDomainsAreExplained) {
  Register("a1", 4, "rack-a");
  Register("b1", 4, "rack-b");
  const std::string p1 = Submit(Spec(3));
  const std::string p2 = Submit(Spec(3));
  Cycle();
  ASSERT_EQ(Phase(p2), loom::v1::JOB_PHASE_STARTING);
  loom::v1::JobSpec strict = Spec(2);
  strict.mutable_resources()->set_require_single_domain(true);
  const std::string s = Submit(strict);
  Cycle();
  absl::StatusOr<loom::v1::ExplainPendingResponse> e = scheduler_->ExplainPending(s);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->reason(), "WaitingForSlots");
  EXPECT_EQ(e->message(),
            "needs 2 cpu rank slots in one topology domain; 2 of 8 are free (the largest free "
            "domain has 1)");
  EXPECT_EQ(e->queue_position(), 1);
}

TEST_F(PolicyTest, NodeSelectorAndCordonNarrowPlacement) {
  Register("n1", 2, "", {{"zone", "a"}});
  Register("n2", 2, "", {{"zone", "b"}});
  loom::v1::JobSpec zb = Spec(1);
  (*zb.mutable_resources()->mutable_node_selector())["zone"] = "b";
  const std::string j = Submit(zb);
  Cycle();
  EXPECT_EQ(Get(j).rank_nodes(0), "n2");
  loom::v1::JobSpec zc = Spec(1);
  (*zc.mutable_resources()->mutable_node_selector())["zone"] = "c";
  const std::string none = Submit(zc);
  Cycle();
  EXPECT_EQ(Get(none).reason(), "Unschedulable");
  EXPECT_NE(Get(none).message().find("node_selector zone=c matches no node"), std::string::npos)
      << Get(none).message();
  // Cordoned n2: a zone=b job cannot start.
  ASSERT_TRUE(scheduler_->CordonNode("n2", "bad fan").ok());
  const std::string j2 = Submit(zb);
  Cycle();
  EXPECT_EQ(Get(j2).reason(), "Unschedulable");
  EXPECT_NE(Get(j2).message().find("1 of 2 live cpu nodes are cordoned"), std::string::npos)
      << Get(j2).message();
  ASSERT_TRUE(scheduler_->UncordonNode("n2").ok());
  Cycle();
  EXPECT_EQ(Phase(j2), loom::v1::JOB_PHASE_STARTING);
}

TEST_F(PolicyTest, PreemptionPicksTheVictimThatLosesTheLeastWork) {
  Register("node-a", 2);
  Register("node-b", 2);
  const std::string l1 = Submit(Spec(2, 0));
  const std::string l2 = Submit(Spec(2, 0));
  Settle(4);
  ASSERT_EQ(Phase(l1), loom::v1::JOB_PHASE_RUNNING);
  ASSERT_EQ(Phase(l2), loom::v1::JOB_PHASE_RUNNING);
  SetProgress(l1, 30, 10);  // would lose 20 steps x 2 ranks
  SetProgress(l2, 12, 10);  // would lose 2 x 2
  Settle(1);
  // Equal priority never preempts.
  const std::string same = Submit(Spec(2, 0));
  Cycle();
  EXPECT_EQ(Phase(l1), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Phase(l2), loom::v1::JOB_PHASE_RUNNING);
  scheduler_->CancelJob(same).IgnoreError();

  const std::string high = Submit(Spec(2, 10));
  Cycle();
  Job victim = Get(l2);
  EXPECT_EQ(victim.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(victim.reason(), "Preempted");
  EXPECT_EQ(victim.failure_class(), loom::v1::FAILURE_CLASS_PREEMPTED);
  EXPECT_EQ(victim.preemptions(), 1);
  EXPECT_EQ(victim.user_restarts() + victim.infra_restarts(), 0);
  EXPECT_NE(victim.message().find("preempted by job " + high), std::string::npos);
  EXPECT_EQ(Phase(l1), loom::v1::JOB_PHASE_RUNNING);
  Job waiting = Get(high);
  EXPECT_EQ(waiting.reason(), "WaitingForPreemption");
  EXPECT_NE(waiting.message().find("preempted " + l2 + " (priority 0, loses 4 rank-steps)"),
            std::string::npos)
      << waiting.message();
  // Once l2's ranks have stopped, high starts on node-b and l2 waits (no second preemption).
  Settle(5);
  Job placed = Get(high);
  EXPECT_EQ(placed.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(placed.rank_nodes(0), "node-b");
  EXPECT_EQ(Phase(l1), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(Phase(l2), loom::v1::JOB_PHASE_PENDING);
  // When high ends, l2 gets attempt 2 (it resumes from its newest committed checkpoint).
  Finish(high);
  Cycle();
  Job resumed = Get(l2);
  EXPECT_EQ(resumed.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(resumed.attempt(), 2);
  EXPECT_EQ(resumed.preemptions(), 1);
  EXPECT_NE(resumed.message().find("no committed checkpoint: starting over"), std::string::npos)
      << resumed.message();
}

}  // namespace
}  // namespace loom
