// The node, slot and accelerator gauges are kept incrementally (rank_reconciler.h) at the
// places ranks and nodes change. After every operation of a random sequence through the public
// API (registrations, submissions, cycles, heartbeats with rank reports, cancels, kills, cordons,
// drains, node losses), the kept counts must equal a full recount (CheckCapacityCounts), and the
// loom_nodes / loom_rank_slots gauges must equal totals computed here from ListNodes.
#include <random>
#include <set>

#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

class SchedulerGaugesTest : public SchedulerTest {
 protected:
  // The ranks each simulated worker runs: (job id, attempt, rank) -> state it reports.
  std::map<std::string, std::map<std::tuple<std::string, int32_t, int32_t>, RankState>> runs_;

  void BeatNode(const std::string& node, std::mt19937& rng) {
    HeartbeatRequest req;
    req.set_node_id(node);
    for (auto& [key, state] : runs_[node]) {
      // Running ranks sometimes finish or fail; ended ranks are reported once more, then gone.
      if (state == v1::RANK_STATE_RUNNING) {
        const int r = static_cast<int>(rng() % 10);
        if (r == 0) state = v1::RANK_STATE_SUCCEEDED;
        if (r == 1) state = v1::RANK_STATE_FAILED;
      }
      RankStatus* st = req.add_ranks();
      st->set_job_id(std::get<0>(key));
      st->set_attempt(std::get<1>(key));
      st->set_rank(std::get<2>(key));
      st->set_state(state);
      if (std::get<2>(key) == 0) st->set_rendezvous_port(29500);
      st->mutable_progress()->set_step(static_cast<int64_t>(rng() % 100));
    }
    absl::StatusOr<HeartbeatResponse> resp = scheduler_->Heartbeat(req);
    if (!resp.ok()) {  // lost: the worker registers again with nothing running
      ASSERT_TRUE(absl::IsNotFound(resp.status())) << resp.status();
      runs_[node].clear();
      Register(node, 1 + static_cast<int>(rng() % 4));
      return;
    }
    for (auto it = runs_[node].begin(); it != runs_[node].end();) {
      const bool ended = it->second != v1::RANK_STATE_RUNNING;
      it = ended ? runs_[node].erase(it) : std::next(it);
    }
    for (const auto& stop : resp->stop()) {
      for (auto it = runs_[node].begin(); it != runs_[node].end();) {
        const bool match = std::get<0>(it->first) == stop.job_id();
        it = match ? runs_[node].erase(it) : std::next(it);
      }
    }
    for (const auto& start : resp->start()) {
      runs_[node][{start.job_id(), start.attempt(), start.rank()}] = v1::RANK_STATE_RUNNING;
    }
  }

  // The gauges against totals from ListNodes (NodeInfo's own per-node count).
  void ExpectGaugesMatchListNodes(const std::string& where) {
    absl::StatusOr<std::vector<v1::NodeInfo>> nodes = scheduler_->ListNodes();
    ASSERT_TRUE(nodes.ok());
    int live = 0, lost = 0, free = 0, cordoned = 0, used = 0;
    for (const v1::NodeInfo& n : *nodes) {
      if (!n.live()) {
        ++lost;
        continue;
      }
      ++live;
      used += n.used_slots();
      (n.cordoned() || n.draining() ? cordoned : free) += n.free_slots();
    }
    EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "live"), live) << where;
    EXPECT_EQ(MetricValue(*registry_, "loom_nodes", "state", "lost"), lost) << where;
    EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "used"), used) << where;
    EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "free"), free) << where;
    EXPECT_EQ(MetricValue(*registry_, "loom_rank_slots", "state", "cordoned"), cordoned) << where;
  }
};

TEST_F(SchedulerGaugesTest, IncrementalCountsEqualRecountAfterRandomOperations) {
  std::mt19937 rng(20261201);
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  std::vector<std::string> jobs;
  const std::vector<std::string> nodes = {"n0", "n1", "n2", "n3", "n4"};
  for (const std::string& n : nodes) Register(n, 1 + pick(3));
  Register("gpu-0", 8, v1::ACCELERATOR_KIND_H100);
  for (int op = 0; op < 600; ++op) {
    const std::string node = nodes[pick(static_cast<int>(nodes.size()))];
    std::string what;
    bool gauges_fresh = false;
    switch (pick(12)) {
      case 0:
        jobs.push_back(Submit(1 + pick(3), /*max_restarts=*/1, /*max_infra_restarts=*/1).id());
        what = "submit";
        break;
      case 1:
      case 2:
        Cycle();
        what = "cycle";
        gauges_fresh = true;
        break;
      case 3:
      case 4:
      case 5:
        BeatNode(node, rng);
        what = "heartbeat " + node;
        gauges_fresh = true;
        break;
      case 6:
        if (!jobs.empty()) (void)scheduler_->CancelJob(jobs[pick(static_cast<int>(jobs.size()))]);
        what = "cancel";
        break;
      case 7:
        if (!jobs.empty()) (void)scheduler_->KillJob(jobs[pick(static_cast<int>(jobs.size()))]);
        what = "kill";
        break;
      case 8:
        (void)scheduler_->CordonNode(node, "test");
        what = "cordon " + node;
        break;
      case 9:
        (void)scheduler_->UncordonNode(node);
        what = "uncordon " + node;
        break;
      case 10:
        (void)scheduler_->DrainNode(node, "test");
        what = "drain " + node;
        break;
      case 11:
        // Time passes; nodes that do not heartbeat in it are lost (timeout 10 s) unless stepping.
        clock_.Advance(absl::Seconds(pick(2) == 0 ? 1 : 11));
        for (const std::string& n : nodes) {
          if (pick(2) == 0) BeatNode(n, rng);
        }
        Cycle();
        what = "time and liveness";
        gauges_fresh = true;
        break;
    }
    const std::string where = absl::StrCat("op ", op, " (", what, ")");
    absl::Status counts = scheduler_->CheckCapacityCounts();
    ASSERT_TRUE(counts.ok()) << where << ": " << counts;
    if (gauges_fresh) ExpectGaugesMatchListNodes(where);
    if (::testing::Test::HasFailure()) return;
  }
  // The sequence did exercise the cases (some ranks ran, some node was lost or cordoned).
  const double submitted = MetricValue(*registry_, "loom_jobs_submitted_total");
  EXPECT_GT(submitted, 10);
  // Every accepted submission was stored by exactly one group commit.
  double committed_jobs = -1;
  for (const prometheus::MetricFamily& family : registry_->Collect()) {
    if (family.name == "loom_submission_commit_jobs") {
      committed_jobs = family.metric.at(0).histogram.sample_sum;
    }
  }
  EXPECT_EQ(committed_jobs, submitted);
}

}  // namespace
}  // namespace loom
