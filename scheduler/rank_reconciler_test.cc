// RankReconciler on plain values (no gRPC, no store, no clock of its own): the incremental
// capacity counts against a recount written here, the suspect-node choice, failure
// classification, step timing and node liveness.
#include "scheduler/rank_reconciler.h"

#include <map>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using v1::AcceleratorKind;
using v1::RankState;

// The test's own model of the cluster and its own recount (shares no code with the reconciler).
struct Model {
  std::map<std::string, NodeCapacity> nodes;
  std::map<RankKey, std::pair<std::string, RankState>> ranks;  // -> (node, state)

  static bool Holds(RankState s) {
    return s != v1::RANK_STATE_SUCCEEDED && s != v1::RANK_STATE_FAILED &&
           s != v1::RANK_STATE_STOPPED;
  }
  void Check(const CapacityCounts& got, const std::string& where) const {
    int live = 0, lost = 0, free = 0, cordoned = 0, used = 0;
    std::map<std::pair<AcceleratorKind, std::string>, int> acc;
    for (const auto& [id, n] : nodes) {
      int u = 0;
      for (const auto& [key, r] : ranks) {
        if (r.first == id && Holds(r.second)) ++u;
      }
      if (n.lost) {
        ++lost;
        acc[{n.kind, "lost"}] += n.slots;
        continue;
      }
      ++live;
      used += u;
      (n.cordoned ? cordoned : free) += n.slots > u ? n.slots - u : 0;
      const int alloc = u < n.slots ? u : n.slots;
      acc[{n.kind, "allocated"}] += alloc;
      acc[{n.kind, n.cordoned ? "cordoned" : "free"}] += n.slots - alloc;
    }
    EXPECT_EQ(got.live_nodes, live) << where;
    EXPECT_EQ(got.lost_nodes, lost) << where;
    EXPECT_EQ(got.free_slots, free) << where;
    EXPECT_EQ(got.cordoned_slots, cordoned) << where;
    EXPECT_EQ(got.used_slots, used) << where;
    for (const auto& [key, n] : acc) {
      auto it = got.accelerators.find(key);
      EXPECT_EQ(it == got.accelerators.end() ? 0 : it->second, n)
          << where << ": accelerators " << key.first << "/" << key.second;
    }
    for (const auto& [key, n] : got.accelerators) {
      if (acc.count(key) == 0) {
        EXPECT_EQ(n, 0) << where << ": extra " << key.second;
      }
    }
    // The submission check's largest node per kind: every node not lost, cordoned ones too.
    std::map<AcceleratorKind, int> largest;
    for (const auto& [id, n] : nodes) {
      if (n.lost) continue;
      if (largest.count(n.kind) == 0 || largest[n.kind] < n.slots) largest[n.kind] = n.slots;
    }
    EXPECT_EQ(got.LargestNodeSlots(), largest) << where;
  }
};

TEST(RankReconcilerTest, IncrementalCountsEqualRecountAfterRandomOperations) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    RankReconciler r;
    Model m;
    const RankState states[] = {v1::RANK_STATE_UNSPECIFIED, v1::RANK_STATE_STARTING,
                                v1::RANK_STATE_RUNNING,     v1::RANK_STATE_SUCCEEDED,
                                v1::RANK_STATE_FAILED,      v1::RANK_STATE_STOPPED};
    const AcceleratorKind kinds[] = {v1::ACCELERATOR_KIND_CPU, v1::ACCELERATOR_KIND_H100,
                                     v1::ACCELERATOR_KIND_H200};
    for (int op = 0; op < 400; ++op) {
      const std::string node = absl::StrCat("n", pick(10));  // some ranks on unknown nodes
      const RankKey key{absl::StrCat("job-", pick(6)), pick(4)};
      std::string what;
      switch (pick(9)) {
        case 0:
        case 1: {  // a node registers or changes
          NodeCapacity n;
          n.kind = kinds[pick(3)];
          n.slots = 1 + pick(8);
          n.lost = pick(4) == 0;
          n.cordoned = pick(3) == 0;
          r.SetNode(node, n);
          m.nodes[node] = n;
          what = "SetNode " + node;
          break;
        }
        case 2:
          r.RemoveNode(node);
          m.nodes.erase(node);
          what = "RemoveNode " + node;
          break;
        case 3:
        case 4: {  // a rank placed (or re-placed on another node)
          RankRuntime rt;
          rt.node_id = node;
          rt.state = states[pick(6)];
          r.Put(key, rt);
          m.ranks[key] = {node, rt.state};
          what = "Put";
          break;
        }
        case 5:
        case 6: {
          const RankState s = states[pick(6)];
          r.SetState(key, s);
          if (m.ranks.count(key)) m.ranks[key].second = s;
          what = "SetState";
          break;
        }
        case 7:
          r.Erase(key);
          m.ranks.erase(key);
          what = "Erase";
          break;
        case 8: {
          r.StopLiveRanks(key.first, pick(2) == 0);
          for (auto it = m.ranks.begin(); it != m.ranks.end();) {
            if (it->first.first == key.first && !Model::Holds(it->second.second)) {
              it = m.ranks.erase(it);
            } else {
              ++it;
            }
          }
          what = "StopLiveRanks";
          break;
        }
      }
      if (pick(150) == 0) {
        r.Clear();
        m = Model();
        what = "Clear";
      }
      const std::string where = absl::StrCat("seed ", seed, " op ", op, " (", what, ")");
      m.Check(r.capacity(), where);
      ASSERT_EQ(r.capacity(), r.Recount()) << where << ": " << r.capacity().DebugString()
                                           << " vs " << r.Recount().DebugString();
      ASSERT_EQ(r.ranks().size(), m.ranks.size()) << where;
    }
  }
}

TEST(RankReconcilerTest, GenerationMovesWithEveryChangeTheAdmissionPassSees) {
  RankReconciler r;
  uint64_t g = r.generation();
  auto moved = [&](const char* what) {
    EXPECT_NE(r.generation(), g) << what << " must count as a change";
    g = r.generation();
  };
  NodeCapacity n;
  n.slots = 4;
  r.SetNode("n1", n);
  moved("SetNode");
  RankRuntime rt;
  rt.node_id = "n1";
  rt.state = v1::RANK_STATE_STARTING;
  r.Put({"job-1", 0}, rt);
  moved("Put");
  r.SetState({"job-1", 0}, v1::RANK_STATE_RUNNING);
  EXPECT_EQ(r.generation(), g) << "a live rank staying live holds the same slot";
  r.SetState({"job-1", 0}, v1::RANK_STATE_SUCCEEDED);
  moved("SetState to an ended state");
  r.Put({"job-1", 1}, rt);
  moved("Put");
  r.StopLiveRanks("job-1", /*graceful=*/false);
  moved("StopLiveRanks");
  r.StopLiveRanks("job-1", /*graceful=*/false);
  EXPECT_EQ(r.generation(), g) << "asking again to stop changes nothing";
  r.Erase({"job-1", 1});
  moved("Erase");
  for (int step = 1; step <= 3; ++step) {
    r.RecordStepAdvance("job-2", step, step + 1, absl::FromUnixSeconds(step));
    EXPECT_EQ(r.generation(), g) << "fewer than 3 step intervals: no end estimate yet";
  }
  r.RecordStepAdvance("job-2", 4, 5, absl::FromUnixSeconds(4));
  moved("the third step interval (an end estimate for backfill)");
  r.RecordStepAdvance("job-2", 5, 6, absl::FromUnixSeconds(5));
  EXPECT_EQ(r.generation(), g);
  r.RemoveNode("n1");
  moved("RemoveNode");
  r.Clear();
  moved("Clear");
}

TEST(RankReconcilerTest, RanksOnNodeFollowsPutAndErase) {
  RankReconciler r;
  RankRuntime rt;
  rt.node_id = "a";
  r.Put({"job-1", 0}, rt);
  r.Put({"job-1", 1}, rt);
  rt.node_id = "b";
  r.Put({"job-1", 1}, rt);  // moved to b
  EXPECT_EQ(r.RanksOnNode("a"), (std::vector<RankKey>{{"job-1", 0}}));
  EXPECT_EQ(r.RanksOnNode("b"), (std::vector<RankKey>{{"job-1", 1}}));
  r.Erase({"job-1", 0});
  EXPECT_TRUE(r.RanksOnNode("a").empty());
  EXPECT_TRUE(r.HasRanks("job-1"));
  EXPECT_FALSE(r.HasRanks("job-2"));
  EXPECT_EQ(r.UsedSlots("b"), 1);
}

TEST(RankReconcilerTest, SuspectIsTheFirstSilentPeer) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  std::map<std::string, absl::Time> heard = {
      {"a", now}, {"b", now - absl::Milliseconds(1500)}, {"c", now - absl::Seconds(7)}};
  auto last = [&heard](const std::string& n) -> std::optional<absl::Time> {
    auto it = heard.find(n);
    if (it == heard.end()) return std::nullopt;
    return it->second;
  };
  // Interval 1 s: b (1.5 s) is within 2 x interval, c (7 s) is not; "x" is unknown.
  SuspectChoice s = RankReconciler::ChooseSuspect("a", {"a", "x", "b", "c"}, last, now,
                                                  absl::Seconds(1));
  EXPECT_EQ(s.node_id, "c");
  EXPECT_EQ(s.explanation,
            " (node c, with another rank of this job, has not heartbeated for 7s: likely the "
            "cause)");
  s = RankReconciler::ChooseSuspect("a", {"a", "b"}, last, now, absl::Seconds(1));
  EXPECT_EQ(s.node_id, "a");
  EXPECT_EQ(s.explanation, "");
  // The reporting node itself is never the "silent peer", however long ago it was heard from.
  s = RankReconciler::ChooseSuspect("c", {"c", "a"}, last, now, absl::Seconds(1));
  EXPECT_EQ(s.node_id, "c");
}

TEST(RankReconcilerTest, ClassifyFailure) {
  v1::RankStatus st;
  st.set_state(v1::RANK_STATE_FAILED);
  st.set_exit_code(1);
  st.set_error("RuntimeError: boom");
  FailureVerdict v = RankReconciler::ClassifyFailure(st, /*had_run=*/true, /*own=*/true, true);
  EXPECT_EQ(v.failure_class, v1::FAILURE_CLASS_USER);
  EXPECT_EQ(v.reason, "RankFailed");
  EXPECT_FALSE(v.no_restart);
  // Blamed on a silent peer: infrastructure, whatever the exit said.
  v = RankReconciler::ClassifyFailure(st, true, /*own=*/false, true);
  EXPECT_EQ(v.failure_class, v1::FAILURE_CLASS_INFRA);
  EXPECT_EQ(v.reason, "RankFailed");
  // Only saw a peer go away: provisionally infra while infra restarts are left, else user.
  st.set_error("Connection reset by peer");
  v = RankReconciler::ClassifyFailure(st, true, true, /*infra_restarts_left=*/true);
  EXPECT_EQ(v.failure_class, v1::FAILURE_CLASS_INFRA);
  v = RankReconciler::ClassifyFailure(st, true, true, /*infra_restarts_left=*/false);
  EXPECT_EQ(v.failure_class, v1::FAILURE_CLASS_USER);
  // A configuration error (exit 78, EX_CONFIG) fails the same way every time: no restart.
  st.set_exit_code(78);
  st.set_error("bad config");
  v = RankReconciler::ClassifyFailure(st, true, true, true);
  EXPECT_EQ(v.reason, "ConfigError");
  EXPECT_TRUE(v.no_restart);
  EXPECT_FALSE(RankReconciler::ClassifyFailure(st, true, /*own=*/false, true).no_restart);
  EXPECT_TRUE(RankReconciler::ValidRendezvousPort(0));
  EXPECT_TRUE(RankReconciler::ValidRendezvousPort(65535));
  EXPECT_FALSE(RankReconciler::ValidRendezvousPort(65536));
  EXPECT_FALSE(RankReconciler::ValidRendezvousPort(-1));
}

TEST(RankReconcilerTest, StepTimingAndNodeLiveness) {
  RankReconciler r;
  const absl::Time t0 = absl::FromUnixSeconds(5000);
  RankRuntime rt;
  rt.node_id = "silent";
  r.Put({"job-1", 1}, rt);
  rt.node_id = "busy";
  r.Put({"job-1", 0}, rt);
  // Steps 10 -> 12 -> 14 -> 20 at 2 s intervals: 1, 1 and 1/3 s per step after the first report.
  r.RecordStepAdvance("job-1", 0, 10, t0);
  EXPECT_EQ(r.MedianStepSeconds("job-1"), 0);
  r.RecordStepAdvance("job-1", 10, 12, t0 + absl::Seconds(2));
  r.RecordStepAdvance("job-1", 12, 14, t0 + absl::Seconds(4));
  EXPECT_EQ(r.MedianStepSeconds("job-1"), 0);  // two samples
  r.RecordStepAdvance("job-1", 14, 20, t0 + absl::Seconds(6));
  EXPECT_DOUBLE_EQ(r.MedianStepSeconds("job-1"), 1.0);
  // The silent node's rank belongs to a job that stepped 6 s ago: alive within 10 s, not 5 s.
  const absl::Time now = t0 + absl::Seconds(12);
  EXPECT_EQ(r.SteppingJobOnNode("silent", now, absl::Seconds(10)), "job-1");
  EXPECT_EQ(r.SteppingJobOnNode("silent", now, absl::Seconds(5)), std::nullopt);
  // Rank 1's own reports count too: baseline, then a newer step at `now`.
  EXPECT_FALSE(r.ObserveRankStep("job-1", 1, 1, 20, now - absl::Seconds(1)));
  EXPECT_TRUE(r.ObserveRankStep("job-1", 1, 1, 21, now));
  EXPECT_EQ(r.SteppingJobOnNode("silent", now, absl::Seconds(5)), "job-1");
  EXPECT_EQ(r.SteppingJobOnNode("other", now, absl::Seconds(5)), std::nullopt);
  r.ForgetAttemptSteps("job-1");
  EXPECT_EQ(r.SteppingJobOnNode("silent", now, absl::Seconds(10)), std::nullopt);
  EXPECT_DOUBLE_EQ(r.MedianStepSeconds("job-1"), 1.0);  // kept across attempts
  r.ForgetJob("job-1");
  EXPECT_EQ(r.MedianStepSeconds("job-1"), 0);
}

}  // namespace
}  // namespace loom
