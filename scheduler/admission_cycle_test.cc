// The admission cycle on hand-built snapshots: no store, no clock, no gRPC. Each test states the
// cluster and the decisions expected by hand (the policy of docs/scheduling.md).
#include "scheduler/admission_cycle.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "scheduler/cluster_snapshot.h"

namespace loom {
namespace {

using Kind = AdmissionDecision::Kind;

class AdmissionCycleTest : public ::testing::Test {
 protected:
  void Node(const std::string& id, int slots, const std::string& domain = "") {
    PoolNode p;
    p.id = id;
    p.inventory.set_accelerator(v1::ACCELERATOR_KIND_CPU);
    p.inventory.set_slots(slots);
    p.inventory.set_topology_domain(domain);
    nodes_.push_back(p);  // tests add nodes in id order
  }
  JobRecord& Job(const std::string& id, int ranks, int priority = 0,
                 const std::string& tenant = "default", const std::string& queue = "") {
    JobRecord& r = records_.emplace_back();
    r.id = id;
    r.sequence = static_cast<int64_t>(records_.size());
    r.tenant = tenant;
    r.phase = v1::JOB_PHASE_PENDING;
    r.spec.mutable_resources()->set_num_ranks(ranks);
    r.spec.set_priority(priority);
    r.spec.set_queue(queue);
    r.spec.mutable_training()->set_steps(100);
    return r;
  }
  // Adds `job` to the waiting jobs (call in job id order).
  void Wait(const JobRecord& job) { snapshot_.waiting.push_back(ClusterSnapshot::WaitingJob::Of(job)); }
  // `job` RUNNING with one rank per entry of `nodes`, at `step` with a checkpoint at
  // `checkpoint_step`, `median` seconds per step (call in job id order).
  void Run(JobRecord& job, const std::vector<std::string>& nodes, int64_t step = 0,
           int64_t checkpoint_step = 0, double median = 0, bool stopping = false) {
    job.phase = v1::JOB_PHASE_RUNNING;
    job.attempt = 1;
    job.rank_nodes = nodes;
    job.progress.set_step(step);
    job.progress.set_last_checkpoint_step(checkpoint_step);
    for (const std::string& n : nodes) snapshot_.ranks.push_back({job.id, n, false, stopping});
    snapshot_.placed[job.id] = {&job, median};
  }
  AdmissionResult Cycle() {
    snapshot_.pool = std::make_shared<const NodePool>(nodes_);
    AdmissionOptions options;
    options.queues = &queues_;
    options.enable_backfill = backfill_;
    options.enable_preemption = preemption_;
    options.max_jobs = max_jobs_;
    return RunAdmissionCycle(snapshot_, options);
  }
  static const AdmissionDecision* Find(const AdmissionResult& r, const std::string& job_id) {
    for (const AdmissionDecision& d : r.decisions) {
      if (d.job_id == job_id) return &d;
    }
    return nullptr;
  }

  ClusterSnapshot snapshot_;
  std::vector<PoolNode> nodes_;  // the snapshot's pool, built by Cycle()
  std::deque<JobRecord> records_;  // stable addresses
  QueuesConfig queues_ = QueuesConfig::Default();
  bool backfill_ = true;
  bool preemption_ = true;
  int max_jobs_ = 0;
};

TEST_F(AdmissionCycleTest, HigherPriorityFirstThenAgeAndStartedJobsLeaveTheQueue) {
  Node("a", 1);
  JobRecord& old_low = Job("job-1", 1, 0);
  JobRecord& new_high = Job("job-2", 1, 5);
  Wait(old_low);
  Wait(new_high);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 2u);
  EXPECT_EQ(r.decisions[0].kind, Kind::kStart);
  EXPECT_EQ(r.decisions[0].job_id, "job-2");
  EXPECT_EQ(r.decisions[0].nodes, std::vector<std::string>({"a"}));
  EXPECT_EQ(r.decisions[0].outcome, "admitted");
  EXPECT_EQ(r.decisions[1].kind, Kind::kWait);
  EXPECT_EQ(r.decisions[1].job_id, "job-1");
  EXPECT_EQ(r.decisions[1].reason, "WaitingForSlots");
  EXPECT_EQ(r.decisions[1].message, "needs 1 cpu rank slots; 0 of 1 are free");
  EXPECT_EQ(r.decisions[1].outcome, "no_capacity");
  EXPECT_EQ(r.queue_order.at(v1::ACCELERATOR_KIND_CPU), std::vector<std::string>({"job-1"}));
}

TEST_F(AdmissionCycleTest, FairShareGoesToTheTenantWithTheLowerDominantShare) {
  // 4 slots; tenant "a" runs 2 of them (share 0.5), "b" nothing: b's newer job goes first.
  Node("n1", 2);
  Node("n2", 1);
  Node("n3", 1);
  JobRecord& running = Job("job-0", 2, 0, "a");
  JobRecord& a_job = Job("job-1", 1, 0, "a");
  JobRecord& b_job = Job("job-2", 1, 0, "b");
  Run(running, {"n1", "n1"});
  Wait(a_job);
  Wait(b_job);
  AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 2u);
  EXPECT_EQ(r.decisions[0].job_id, "job-2");
  EXPECT_EQ(r.decisions[1].job_id, "job-1");
  // Weight 4 for "a": 0.5 / 4 = 0.125 < 0 + nothing? b still has share 0 and goes first; give b
  // a running job of 1 slot (0.25) and a's weighted share (0.125) is lower: a goes first.
  queues_.tenant_weights["a"] = 4;
  JobRecord& b_running = Job("job-3", 1, 0, "b");
  Run(b_running, {"n2"});
  r = Cycle();
  ASSERT_GE(r.decisions.size(), 1u);
  EXPECT_EQ(r.decisions[0].job_id, "job-1");
  EXPECT_EQ(r.decisions[0].kind, Kind::kStart);
  EXPECT_EQ(r.decisions[0].nodes, std::vector<std::string>({"n3"}));
}

TEST_F(AdmissionCycleTest, QuotaIsCheckedAgainstRunningAndJustAdmittedJobs) {
  Node("a", 8);
  QueueConfig q;
  q.name = "small";
  q.has_quota = true;
  q.nominal[v1::ACCELERATOR_KIND_CPU] = 3;
  queues_.queues.push_back(q);
  JobRecord& running = Job("job-0", 2, 0, "default", "small");
  JobRecord& fits = Job("job-1", 1, 0, "default", "small");
  JobRecord& over = Job("job-2", 1, 0, "default", "small");
  JobRecord& other_queue = Job("job-3", 1);
  JobRecord& unknown = Job("job-4", 1, 0, "default", "nope");
  Run(running, {"a", "a"});
  Wait(fits);
  Wait(over);
  Wait(other_queue);
  Wait(unknown);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 4u);
  EXPECT_EQ(r.decisions[0].kind, Kind::kStart);
  EXPECT_EQ(r.decisions[0].job_id, "job-1");
  EXPECT_EQ(r.decisions[1].job_id, "job-2");
  EXPECT_EQ(r.decisions[1].reason, "WaitingForQuota");
  EXPECT_EQ(r.decisions[1].outcome, "quota");
  EXPECT_TRUE(absl::StrContains(r.decisions[1].message, "small")) << r.decisions[1].message;
  EXPECT_EQ(r.decisions[2].kind, Kind::kStart);
  EXPECT_EQ(r.decisions[2].job_id, "job-3");
  EXPECT_EQ(r.decisions[3].job_id, "job-4");
  EXPECT_EQ(r.decisions[3].reason, "UnknownQueue");
  EXPECT_EQ(r.decisions[3].message, "queue nope is not configured (--queues_config)");
}

TEST_F(AdmissionCycleTest, HeadReservesItsSlotsAndSmallerJobsBackfillAroundIt) {
  // a: 2 slots held by a job ending in 100 steps x 1 s; b: 2 free; c: 1 free. The head (4
  // ranks) will start on a + b, so b is reserved; a 1-rank job backfills onto c, the next one
  // would delay the head.
  Node("a", 2);
  Node("b", 2);
  Node("c", 1);
  JobRecord& running = Job("job-0", 2);
  JobRecord& head = Job("job-1", 4);
  JobRecord& small = Job("job-2", 1);
  JobRecord& small2 = Job("job-3", 1);
  Run(running, {"a", "a"}, /*step=*/0, 0, /*median=*/1.0);
  Wait(head);
  Wait(small);
  Wait(small2);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 3u);
  EXPECT_EQ(r.decisions[0].job_id, "job-1");
  EXPECT_EQ(r.decisions[0].reason, "WaitingForSlots");
  EXPECT_EQ(r.decisions[0].message,
            "needs 4 cpu rank slots; 3 of 5 are free; expected to start in about 1m40s when "
            "running jobs finish (slots reserved; smaller jobs may backfill around it)");
  EXPECT_EQ(r.decisions[1].kind, Kind::kStart);
  EXPECT_EQ(r.decisions[1].job_id, "job-2");
  EXPECT_EQ(r.decisions[1].nodes, std::vector<std::string>({"c"}));
  EXPECT_EQ(r.decisions[2].job_id, "job-3");
  EXPECT_EQ(r.decisions[2].reason, "Queued");
  EXPECT_EQ(r.decisions[2].message,
            "waiting behind job job-1 (it holds a reservation; starting now would delay it)");
  EXPECT_EQ(r.decisions[2].outcome, "blocked");
}

TEST_F(AdmissionCycleTest, HeadWithoutAnEstimateReservesEveryFreeSlotAndNoBackfillWaitsBehind) {
  Node("a", 2);
  Node("b", 1);
  JobRecord& running = Job("job-0", 2);
  JobRecord& head = Job("job-1", 3);
  JobRecord& small = Job("job-2", 1);
  Run(running, {"a", "a"});  // no median: never ends for backfill
  Wait(head);
  Wait(small);
  AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 2u);
  EXPECT_EQ(r.decisions[0].message, "needs 3 cpu rank slots; 1 of 3 are free");
  EXPECT_EQ(r.decisions[1].reason, "Queued");
  // Without backfill a job behind a head waits even before trying to fit.
  backfill_ = false;
  r = Cycle();
  ASSERT_EQ(r.decisions.size(), 2u);
  EXPECT_EQ(r.decisions[1].message, "waiting behind job job-1");
}

TEST_F(AdmissionCycleTest, PreemptionRequeuesTheVictimLosingTheLeastWorkBeforeTheHeadsReason) {
  Node("a", 2);
  Node("b", 2);
  JobRecord& much = Job("job-0", 2, 0);
  JobRecord& little = Job("job-1", 2, 0);
  JobRecord& same_prio = Job("job-2", 1, 9);
  JobRecord& high = Job("job-3", 2, 9);
  Run(much, {"a", "a"}, /*step=*/50, /*checkpoint_step=*/10);   // loses 80 rank-steps
  Run(little, {"b", "b"}, /*step=*/50, /*checkpoint_step=*/45);  // loses 10
  (void)same_prio;
  Wait(high);
  AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 2u);
  EXPECT_EQ(r.decisions[0].kind, Kind::kPreempt);
  EXPECT_EQ(r.decisions[0].job_id, "job-1");
  EXPECT_EQ(r.decisions[0].reason, "Preempted");
  EXPECT_EQ(r.decisions[0].message,
            "preempted by job job-3 (priority 9 > 0); resumes from its newest committed "
            "checkpoint (10 rank-steps since it are lost)");
  EXPECT_EQ(r.decisions[1].job_id, "job-3");
  EXPECT_EQ(r.decisions[1].reason, "WaitingForPreemption");
  EXPECT_EQ(r.decisions[1].outcome, "preempting");
  EXPECT_TRUE(absl::StrContains(r.decisions[1].message,
                                "preempted job-1 (priority 0, loses 10 rank-steps)"))
      << r.decisions[1].message;
  preemption_ = false;
  r = Cycle();
  ASSERT_EQ(r.decisions.size(), 1u);
  EXPECT_EQ(r.decisions[0].reason, "WaitingForSlots");
}

TEST_F(AdmissionCycleTest, StoppingRanksReleaseTheirSlotsWithoutPreemption) {
  Node("a", 2);
  JobRecord& stopping = Job("job-0", 2);
  JobRecord& high = Job("job-1", 2, 9);
  Run(stopping, {"a", "a"}, 0, 0, 0, /*stopping=*/true);
  Wait(high);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 1u);
  EXPECT_EQ(r.decisions[0].reason, "WaitingForSlots");
  EXPECT_EQ(r.decisions[0].message,
            "needs 2 cpu rank slots; 0 of 2 are free; the rest are being released by stopping "
            "ranks");
}

TEST_F(AdmissionCycleTest, UnschedulableBackoffAndUnreachableNodesDoNotBlockOthers) {
  Node("a", 2);
  Node("b", 2);
  nodes_[1].schedulable = false;  // unreachable: keeps its ranks, gets no new ones
  snapshot_.now = absl::FromUnixSeconds(1000);
  JobRecord& huge = Job("job-0", 5);
  JobRecord& backing_off = Job("job-1", 1);
  backing_off.state.set_not_before_us(absl::ToUnixMicros(absl::FromUnixSeconds(1060)));
  backing_off.state.set_infra_restarts(2);
  JobRecord& fits = Job("job-2", 2);
  Wait(huge);
  Wait(backing_off);
  Wait(fits);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 3u);
  EXPECT_EQ(r.decisions[0].reason, "Unschedulable");
  EXPECT_EQ(r.decisions[0].outcome, "infeasible");
  // The unreachable node's slots are not offered (it is live and not cordoned, so the message
  // names no narrowing).
  EXPECT_EQ(r.decisions[0].message,
            "needs 5 cpu rank slots; the 2 live cpu nodes offer 2 in total (register more "
            "workers)");
  EXPECT_EQ(r.decisions[1].reason, "Backoff");
  EXPECT_TRUE(absl::StartsWith(r.decisions[1].message,
                               "backoff until 1970-01-01T00:17:40Z after restart 2; "))
      << r.decisions[1].message;
  EXPECT_EQ(r.decisions[2].kind, Kind::kStart);
  EXPECT_EQ(r.decisions[2].nodes, std::vector<std::string>({"a", "a"}));
}

TEST_F(AdmissionCycleTest, SuspectsAreAvoidedAndUnknownResumeKeepsTheSlotsFree) {
  Node("a", 1);
  Node("b", 1);
  JobRecord& restarted = Job("job-0", 1);
  restarted.attempt = 1;
  restarted.phase = v1::JOB_PHASE_RECOVERING;
  JobRecord& suspicious = Job("job-1", 1);
  suspicious.attempt = 1;
  suspicious.state.add_suspect_nodes("a");
  JobRecord& fresh = Job("job-2", 1);
  snapshot_.waiting.push_back(ClusterSnapshot::WaitingJob::Of(restarted));
  snapshot_.waiting.back().resume_unavailable = "lookup in progress";
  Wait(suspicious);
  Wait(fresh);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 3u);
  EXPECT_EQ(r.decisions[0].job_id, "job-0");
  EXPECT_EQ(r.decisions[0].reason, "CheckpointsUnavailable");
  EXPECT_EQ(r.decisions[0].message,
            "cannot find the newest committed checkpoint to resume from: lookup in progress");
  EXPECT_EQ(r.decisions[0].outcome, "");
  EXPECT_EQ(r.decisions[1].job_id, "job-1");
  EXPECT_EQ(r.decisions[1].nodes, std::vector<std::string>({"b"}));
  EXPECT_EQ(r.decisions[2].job_id, "job-2");
  EXPECT_EQ(r.decisions[2].nodes, std::vector<std::string>({"a"}));
}

TEST_F(AdmissionCycleTest, AnEarlierAttemptsRanksMustEndFirst) {
  Node("a", 4);
  JobRecord& recovering = Job("job-0", 1);
  recovering.attempt = 1;
  recovering.phase = v1::JOB_PHASE_RECOVERING;
  snapshot_.ranks.push_back({"job-0", "a", /*ended=*/false, /*stop_requested=*/true});
  snapshot_.placed["job-0"] = {&recovering, 0};
  Wait(recovering);
  AdmissionResult r = Cycle();
  EXPECT_EQ(Find(r, "job-0"), nullptr);  // no decision: it keeps its reason
  EXPECT_EQ(r.queue_order.at(v1::ACCELERATOR_KIND_CPU), std::vector<std::string>({"job-0"}));
  snapshot_.ranks[0].ended = true;  // an ended rank still blocks until the scheduler forgets it
  r = Cycle();
  EXPECT_EQ(Find(r, "job-0"), nullptr);
  snapshot_.ranks.clear();
  snapshot_.placed.clear();
  r = Cycle();
  ASSERT_NE(Find(r, "job-0"), nullptr);
  EXPECT_EQ(Find(r, "job-0")->kind, Kind::kStart);
}

TEST_F(AdmissionCycleTest, TopologyPrefersTheBestFittingDomain) {
  Node("a1", 2, "rack-a");
  Node("a2", 2, "rack-a");
  Node("b1", 2, "rack-b");
  JobRecord& job = Job("job-0", 2);
  Wait(job);
  const AdmissionResult r = Cycle();
  ASSERT_EQ(r.decisions.size(), 1u);
  EXPECT_EQ(r.decisions[0].nodes, std::vector<std::string>({"b1", "b1"}));
}

TEST_F(AdmissionCycleTest, MaxJobsDecidesOnlyAboutTheFirstJobsInQueueOrder) {
  Node("a", 2);
  // In queue order: job-3 (priority 1), then job-1, job-2, job-4 (priority 0, by age). job-3
  // needs 3 slots (never fits: Unschedulable); the others fit one slot each.
  JobRecord& j1 = Job("job-1", 1);
  JobRecord& j2 = Job("job-2", 1);
  JobRecord& j3 = Job("job-3", 3, 1);
  JobRecord& j4 = Job("job-4", 1);
  for (const JobRecord* j : {&j1, &j2, &j3, &j4}) Wait(*j);
  max_jobs_ = 2;
  AdmissionResult r = Cycle();
  EXPECT_EQ(r.considered, 2);
  ASSERT_NE(Find(r, "job-3"), nullptr);
  EXPECT_EQ(Find(r, "job-3")->reason, "Unschedulable");
  ASSERT_NE(Find(r, "job-1"), nullptr);
  EXPECT_EQ(Find(r, "job-1")->kind, Kind::kStart);
  // Past the depth: no decision although job-2 would fit; every waiting job keeps its position.
  EXPECT_EQ(Find(r, "job-2"), nullptr);
  EXPECT_EQ(Find(r, "job-4"), nullptr);
  EXPECT_EQ(r.queue_order[v1::ACCELERATOR_KIND_CPU],
            (std::vector<std::string>{"job-3", "job-2", "job-4"}));
  // Without the limit the same snapshot starts job-2 too.
  max_jobs_ = 0;
  r = Cycle();
  EXPECT_EQ(r.considered, 4);
  ASSERT_NE(Find(r, "job-2"), nullptr);
  EXPECT_EQ(Find(r, "job-2")->kind, Kind::kStart);
}

TEST_F(AdmissionCycleTest, AJobQueuedBehindTheSameHeadAsBeforeIsLeftUnchanged) {
  Node("a", 1);
  JobRecord& running = Job("job-1", 1);
  JobRecord& head = Job("job-2", 1);
  JobRecord& same = Job("job-3", 1);
  JobRecord& fresh = Job("job-4", 1);
  Run(running, {"a"});
  same.reason = "Queued";
  same.message = "waiting behind job job-2 (it holds a reservation; starting now would delay it)";
  fresh.reason = "Queued";
  fresh.message = "waiting for the next scheduling cycle";
  for (const JobRecord* j : {&head, &same, &fresh}) Wait(*j);
  AdmissionResult r = Cycle();
  ASSERT_NE(Find(r, "job-2"), nullptr);
  EXPECT_EQ(Find(r, "job-2")->reason, "WaitingForSlots");
  const AdmissionDecision* unchanged = Find(r, "job-3");
  ASSERT_NE(unchanged, nullptr);
  EXPECT_TRUE(unchanged->unchanged);
  EXPECT_EQ(unchanged->reason, "");
  EXPECT_EQ(unchanged->outcome, "blocked");  // still counted as an attempt
  const AdmissionDecision* changed = Find(r, "job-4");
  ASSERT_NE(changed, nullptr);
  EXPECT_FALSE(changed->unchanged);
  EXPECT_EQ(changed->reason, "Queued");
  EXPECT_EQ(changed->message, same.message);
}

}  // namespace
}  // namespace loom
