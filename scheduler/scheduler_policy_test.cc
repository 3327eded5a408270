// Scheduling policy on the core with a fake clock (docs/scheduling.md): ordering by priority,
// fair share and age; queue quotas and borrowing; backfill; topology; preemption; gang-ready
// timeouts with backoff; separate restart budgets; cordon and drain; durability of all of it.
#include <map>
#include <set>
#include <thread>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_job_spec.h"
#include "storage/in_memory_job_store.h"
#include "storage/sqlite_job_store.h"

namespace loom {
namespace {

using loom::v1::HeartbeatResponse;
using loom::v1::Job;
using loom::v1::RankStatus;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

class PolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_root = TmpDir() + "/ckpt";
    // The tests count heartbeat intervals against a 10 s timeout (the default is 40 s).
    options_.heartbeat_timeout = absl::Seconds(10);
    // Restarts at once (restart_test covers the backoff before them).
    options_.restart_backoff_base = absl::ZeroDuration();
    options_.validation.fortunes_dir = TmpDir() + "/fortunes";
    ASSERT_TRUE(MakeDirs(options_.validation.fortunes_dir).ok());
    store_ = std::make_unique<InMemoryJobStore>();
    Start();
  }

  void Start() {
    absl::StatusOr<std::unique_ptr<Scheduler>> s =
        Scheduler::Create(options_, store_.get(), &clock_, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  void UseQueues(const std::string& yaml) {
    absl::StatusOr<QueuesConfig> c = ParseQueuesConfig(yaml);
    ASSERT_TRUE(c.ok()) << c.status();
    options_.queues = *c;
    scheduler_.reset();
    Start();
  }

  void Register(const std::string& node, int slots, const std::string& domain = "",
                std::map<std::string, std::string> labels = {}) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
    inv.set_slots(slots);
    inv.set_address(node);
    inv.set_topology_domain(domain);
    inv.set_cpu_arch("x86_64");
    for (const auto& [k, v] : labels) (*inv.mutable_labels())[k] = v;
    absl::StatusOr<absl::Duration> r = scheduler_->RegisterWorker(node, inv);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  static loom::v1::JobSpec Spec(int ranks, int priority = 0, const std::string& queue = "") {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(ranks);
    spec.set_priority(priority);
    spec.set_queue(queue);
    return spec;
  }

  std::string Submit(const loom::v1::JobSpec& spec, const std::string& tenant = "default") {
    absl::StatusOr<Job> job = scheduler_->SubmitJob(spec, "", nullptr, tenant);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = scheduler_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }
  loom::v1::JobPhase Phase(const std::string& id) { return Get(id).phase(); }

  void Cycle() { ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()); }

  // A fake worker per node: it runs what it is told to start (RUNNING at once, rank 0 with a
  // rendezvous port), reports every rank it runs in each heartbeat, and stops what it is told
  // to stop (reported STOPPED once, then forgotten).
  HeartbeatResponse WorkerBeat(const std::string& node) {
    std::map<std::pair<std::string, int>, RankStatus>& ranks = workers_[node];
    loom::v1::HeartbeatRequest req;
    req.set_node_id(node);
    for (const auto& [key, st] : ranks) *req.add_ranks() = st;
    absl::StatusOr<HeartbeatResponse> resp = scheduler_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << node << ": " << resp.status();
    for (auto it = ranks.begin(); it != ranks.end();) {
      it = it->second.state() == loom::v1::RANK_STATE_STOPPED ? ranks.erase(it) : std::next(it);
    }
    if (!resp.ok()) return HeartbeatResponse();
    for (const loom::v1::RankAssignment& stop : resp->stop()) {
      for (auto& [key, st] : ranks) {
        if (st.job_id() == stop.job_id() && st.attempt() == stop.attempt()) {
          st.set_state(loom::v1::RANK_STATE_STOPPED);
        }
      }
    }
    for (const loom::v1::RankAssignment& a : resp->start()) {
      RankStatus st;
      st.set_job_id(a.job_id());
      st.set_attempt(a.attempt());
      st.set_rank(a.rank());
      st.set_state(start_running_ ? loom::v1::RANK_STATE_RUNNING : loom::v1::RANK_STATE_STARTING);
      if (a.rank() == 0) st.set_rendezvous_port(29500);
      ranks[{a.job_id(), a.rank()}] = st;
    }
    return *resp;
  }

  // Heartbeats from every node, then a cycle; `rounds` times.
  void Settle(int rounds = 3) {
    for (int r = 0; r < rounds; ++r) {
      for (const auto& node : Nodes()) WorkerBeat(node);
      Cycle();
    }
  }

  std::vector<std::string> Nodes() {
    std::vector<std::string> out;
    absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
    EXPECT_TRUE(nodes.ok());
    for (const auto& n : *nodes) {
      if (n.live()) out.push_back(n.node_id());
    }
    return out;
  }

  // Sets rank 0's reported progress of `job_id` (on whichever node runs it).
  void SetProgress(const std::string& job_id, int64_t step, int64_t checkpoint_step) {
    for (auto& [node, ranks] : workers_) {
      auto it = ranks.find({job_id, 0});
      if (it == ranks.end()) continue;
      it->second.mutable_progress()->set_step(step);
      it->second.mutable_progress()->set_last_checkpoint_step(checkpoint_step);
    }
  }

  // Ends every rank of `job_id` successfully.
  void Finish(const std::string& job_id) {
    for (auto& [node, ranks] : workers_) {
      for (auto& [key, st] : ranks) {
        if (key.first == job_id) st.set_state(loom::v1::RANK_STATE_SUCCEEDED);
      }
    }
    for (const auto& node : Nodes()) WorkerBeat(node);
    for (auto& [node, ranks] : workers_) {
      for (auto it = ranks.begin(); it != ranks.end();) {
        it = it->first.first == job_id ? ranks.erase(it) : std::next(it);
      }
    }
  }

  SchedulerOptions options_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<std::string, std::map<std::pair<std::string, int>, RankStatus>> workers_;
  bool start_running_ = true;
};

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

TEST_F(PolicyTest, ReadyTimeoutTearsDownAndBacksOffExponentially) {
  options_.ready_timeout = absl::Minutes(1);
  options_.ready_backoff_base = absl::Seconds(10);
  options_.ready_backoff_cap = absl::Seconds(25);
  scheduler_.reset();
  Start();
  start_running_ = false;  // ranks stay STARTING forever
  Register("node-a", 1);
  loom::v1::JobSpec spec = Spec(1);
  spec.set_max_infra_restarts(3);
  const std::string j = Submit(spec);
  absl::Duration expected_backoff[] = {absl::Seconds(10), absl::Seconds(20), absl::Seconds(25)};
  for (int k = 0; k < 3; ++k) {
    Settle(1);
    ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_STARTING) << k;
    EXPECT_EQ(Get(j).attempt(), k + 1);
    clock_.Advance(absl::Seconds(61));
    Settle(1);  // timeout: ranks stopped, RECOVERING with a backoff
    Job torn = Get(j);
    EXPECT_EQ(torn.phase(), loom::v1::JOB_PHASE_RECOVERING) << k;
    EXPECT_EQ(torn.infra_restarts(), k + 1);
    EXPECT_EQ(torn.failure_class(), loom::v1::FAILURE_CLASS_INFRA);
    absl::StatusOr<JobRecord> stored = store_->GetJob(j);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->state.ready_timeouts(), k + 1);
    EXPECT_EQ(absl::FromUnixMicros(stored->state.not_before_us()),
              clock_.Now() + expected_backoff[k]);
    Settle(2);  // the slot is free, but the backoff holds the job
    EXPECT_EQ(Get(j).reason(), "Backoff");
    EXPECT_EQ(Get(j).phase(), loom::v1::JOB_PHASE_RECOVERING);
    clock_.Advance(expected_backoff[k]);
  }
  // The fourth timeout exceeds the infra budget of 3.
  Settle(1);
  clock_.Advance(absl::Seconds(61));
  Settle(1);
  Job failed = Get(j);
  EXPECT_EQ(failed.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(failed.reason(), "ReadyTimeout");
  EXPECT_NE(failed.message().find("all 3 infra restarts used"), std::string::npos)
      << failed.message();
}

TEST_F(PolicyTest, UserAndInfraFailuresUseSeparateBudgets) {
  Register("node-a", 1);
  Register("node-b", 1);
  loom::v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(0);
  spec.set_max_infra_restarts(-1);  // the scheduler's default (3)
  const std::string j = Submit(spec);
  Settle(4);
  ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_RUNNING);
  const std::string first_node = Get(j).rank_nodes(0);
  const std::string other = first_node == "node-a" ? "node-b" : "node-a";
  // The node goes silent: lost, an infra failure with restarts left.
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(absl::Seconds(1));
    WorkerBeat(other);
    Cycle();
  }
  // Lost at 11 s; the same cycle placed attempt 2 on the other node.
  Job recovering = Get(j);
  EXPECT_EQ(recovering.attempt(), 2);
  EXPECT_EQ(recovering.infra_restarts(), 1);
  EXPECT_NE(recovering.message().find("lost: no heartbeat for 11s"), std::string::npos)
      << recovering.message();
  EXPECT_NE(recovering.message().find("infra restart 1 of 3"), std::string::npos)
      << recovering.message();
  workers_.erase(first_node);
  for (int i = 0; i < 4; ++i) {
    WorkerBeat(other);
    Cycle();
  }
  Job second = Get(j);
  ASSERT_EQ(second.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(second.rank_nodes(0), other);
  // A user failure finds max_restarts = 0: FAILED although infra restarts are left.
  workers_[other].begin()->second.set_state(loom::v1::RANK_STATE_FAILED);
  workers_[other].begin()->second.set_exit_code(1);
  WorkerBeat(other);
  Job failed = Get(j);
  EXPECT_EQ(failed.phase(), loom::v1::JOB_PHASE_FAILED);
  EXPECT_EQ(failed.failure_class(), loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(failed.user_restarts(), 0);
  EXPECT_EQ(failed.infra_restarts(), 1);
}

TEST_F(PolicyTest, DrainRequeuesJobsElsewhereWithoutUsingBudgets) {
  Register("node-a", 2);
  Register("node-b", 2);
  const std::string j = Submit(Spec(2));
  Settle(4);
  ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_RUNNING);
  const std::string node = Get(j).rank_nodes(0);
  const std::string other = node == "node-a" ? "node-b" : "node-a";
  absl::StatusOr<loom::v1::DrainNodeResponse> drained = scheduler_->DrainNode(node, "kernel update");
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_EQ(drained->requeued_job_ids_size(), 1);
  EXPECT_EQ(drained->requeued_job_ids(0), j);
  EXPECT_TRUE(drained->node().cordoned());
  EXPECT_TRUE(drained->node().draining());
  Job requeued = Get(j);
  EXPECT_EQ(requeued.phase(), loom::v1::JOB_PHASE_PENDING);
  EXPECT_EQ(requeued.reason(), "Drained");
  Settle(5);
  Job moved = Get(j);
  EXPECT_EQ(moved.phase(), loom::v1::JOB_PHASE_RUNNING);
  EXPECT_EQ(moved.attempt(), 2);
  for (const std::string& n : moved.rank_nodes()) EXPECT_EQ(n, other);
  EXPECT_EQ(moved.user_restarts() + moved.infra_restarts() + moved.preemptions(), 0);
  // Re-registration keeps the cordon; ListNodes shows it.
  Register(node, 2);
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  for (const auto& n : *nodes) {
    if (n.node_id() == node) {
      EXPECT_TRUE(n.cordoned());
      EXPECT_EQ(n.admin_reason(), "kernel update");
      EXPECT_EQ(n.used_slots(), 0);
    } else {
      EXPECT_EQ(n.used_slots(), 2);
      EXPECT_EQ(n.job_ids_size(), 1);
    }
  }
  EXPECT_EQ(scheduler_->DrainNode("ghost", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PolicyTest, CordonsBackoffBudgetsAndQueuesSurviveARestart) {
  const std::string db = TmpDir() + "/policy_restart.db";
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  store_ = std::move(*sqlite);
  options_.ready_timeout = absl::Minutes(1);
  UseQueues("queues: [{name: qa, tenant: t1, quota: {cpu: 4}}]");
  start_running_ = false;
  Register("node-a", 2);
  Register("node-b", 2);
  ASSERT_TRUE(scheduler_->CordonNode("node-b", "flaky NIC").ok());
  loom::v1::JobSpec spec = Spec(1, 3, "qa");
  spec.set_max_infra_restarts(2);
  const std::string j = Submit(spec, "t1");
  Settle(1);
  clock_.Advance(absl::Seconds(61));
  Settle(1);
  ASSERT_EQ(Get(j).reason(), "ReadyTimeout");

  scheduler_.reset();
  Start();
  Cycle();
  Job after = Get(j);
  EXPECT_EQ(after.reason(), "Backoff");
  EXPECT_EQ(after.infra_restarts(), 1);
  EXPECT_EQ(after.tenant(), "t1");
  EXPECT_EQ(after.spec().queue(), "qa");
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_FALSE((*nodes)[0].cordoned());
  EXPECT_TRUE((*nodes)[1].cordoned());
  EXPECT_EQ((*nodes)[1].admin_reason(), "flaky NIC");
  // After the backoff it is placed again, not on the cordoned node.
  clock_.Advance(absl::Seconds(11));
  Settle(1);
  Job placed = Get(j);
  EXPECT_EQ(placed.phase(), loom::v1::JOB_PHASE_STARTING);
  EXPECT_EQ(placed.attempt(), 2);
  EXPECT_EQ(placed.rank_nodes(0), "node-a");
  absl::StatusOr<std::vector<loom::v1::QueueInfo>> queues = scheduler_->ListQueues();
  ASSERT_TRUE(queues.ok());
  EXPECT_EQ((*queues)[0].usage().at("cpu"), 1);
}

// Group commit: concurrent submissions share transactions; every acknowledged job is stored
// with a unique id and sequence, and request ids stay idempotent.
TEST_F(PolicyTest, ConcurrentSubmissionsAreGroupCommitted) {
  const std::string db = TmpDir() + "/group_commit.db";
  absl::StatusOr<std::unique_ptr<SqliteJobStore>> sqlite = SqliteJobStore::Open(db);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status();
  store_ = std::move(*sqlite);
  scheduler_.reset();
  Start();
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // Threads 0 and 1 use the same request ids: one job each, whoever wins.
        const std::string request = t < 2 ? absl::StrCat("shared-", i) : "";
        absl::StatusOr<Job> job = scheduler_->SubmitJob(Spec(1), request);
        while (job.status().code() == absl::StatusCode::kUnavailable) {
          job = scheduler_->SubmitJob(Spec(1), request);  // the other one is committing it
        }
        ASSERT_TRUE(job.ok()) << job.status();
        ids[t].push_back(job->id());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> unique;
  for (const auto& v : ids) unique.insert(v.begin(), v.end());
  EXPECT_EQ(unique.size(), static_cast<size_t>((kThreads - 1) * kEach));
  EXPECT_EQ(ids[0], ids[1]);
  absl::StatusOr<std::vector<JobRecord>> stored = store_->ListJobs();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), unique.size());
  std::set<int64_t> sequences;
  for (const JobRecord& r : *stored) sequences.insert(r.sequence);
  EXPECT_EQ(sequences.size(), stored->size());
}

// A drained job whose node dies while its ranks are being stopped stays PENDING (no attempt is
// running that could fail), and the cycle goes on for the other jobs.
TEST_F(PolicyTest, NodeLostWhileARequeuedJobStopsIsHarmless) {
  Register("node-a", 1);
  Register("node-b", 1);
  Register("node-c", 1);
  const std::string j = Submit(Spec(1));
  const std::string k = Submit(Spec(1));
  Settle(4);
  ASSERT_EQ(Phase(j), loom::v1::JOB_PHASE_RUNNING);
  ASSERT_EQ(Phase(k), loom::v1::JOB_PHASE_RUNNING);
  const std::string node = Get(j).rank_nodes(0);
  ASSERT_TRUE(scheduler_->DrainNode(node, "").ok());
  workers_.erase(node);
  for (int i = 0; i < 12; ++i) {  // node goes silent; the others keep heartbeating
    clock_.Advance(absl::Seconds(1));
    for (const std::string& n : Nodes()) {
      if (n != node) WorkerBeat(n);
    }
    ASSERT_TRUE(scheduler_->RunSchedulingCycle().ok()) << i;
  }
  Job moved = Get(j);
  EXPECT_EQ(moved.attempt(), 2);
  EXPECT_EQ(moved.user_restarts() + moved.infra_restarts(), 0);
  EXPECT_NE(moved.rank_nodes(0), node);
  EXPECT_EQ(Phase(k), loom::v1::JOB_PHASE_RUNNING);
}

}  // namespace
}  // namespace loom
