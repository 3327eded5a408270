// ZenFlow column selection: the count rule (DeepSpeed's ZF-U1 table), top-k of the column L1
// sums against plain LibTorch ops on the whole gradient, identical on 2 Gloo ranks (thread
// gang) whose partitions cut rows, empty selections that neither hang nor fail, the boundary
// tables of the select/update schedule, and the Zen-auto rule against a hand-computed sequence.
#include "worker/engine/optim/column_selection.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/partition.h"
#include "worker/engine/testing/thread_gang.h"

namespace loom::engine::optim {
namespace {

TEST(NumSelectedColumnsTest, CountRule) {
  struct Case {
    int64_t n;
    double ratio;
    int64_t want;
  };
  // ZF-U1's table, then Loom's ratio-0 and ratio-1 ends.
  for (const Case& c : std::vector<Case>{{0, 0.01, 0},
                                         {50, 0.01, 1},
                                         {200, 0.01, 2},
                                         {10, 0.0, 0},
                                         {10, 1.0, 10},
                                         {7, 0.5, 3},
                                         {64, 0.1, 6}}) {
    EXPECT_EQ(NumSelectedColumns(c.n, c.ratio), c.want) << c.n << " x " << c.ratio;
  }
  // Regression: a NaN ratio cast floor(NaN * n) to int64 (undefined; it selected 1 column).
  EXPECT_EQ(NumSelectedColumns(10, std::nan("")), 0);
  EXPECT_EQ(NumSelectedColumns(10, 1e300), 10);
}

// Reference: the full [rows, cols] gradient, |g| summed over rows, torch.topk, sorted.
std::vector<int64_t> Reference(const at::Tensor& g, int64_t k) {
  at::Tensor sums = g.abs().sum(0);
  at::Tensor idx = std::get<0>(std::get<1>(at::topk(sums, k)).sort());
  std::vector<int64_t> out(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + k);
  return out;
}

// Against a walk over every flat element: partitions that start and end mid-row, one inside a
// single row, an empty one, and no columns.
TEST(ForEachElementOfColumnsTest, VisitsExactlyTheColumnsElementsInAscendingOrder) {
  const int64_t cols = 7;
  const std::vector<int64_t> columns = {0, 3, 6};
  for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 35}, {18, 35}, {0, 18}, {9, 12}, {10, 10}, {5, 7}}) {
    std::vector<std::pair<int64_t, int64_t>> want, got;
    for (int64_t f = begin; f < end; ++f) {
      const int64_t j = f % cols;
      if (j == 0 || j == 3 || j == 6) want.emplace_back(f - begin, j);
    }
    ForEachElementOfColumns(begin, end, cols, columns,
                            [&got](int64_t e, int64_t j) { got.emplace_back(e, j); });
    EXPECT_EQ(got, want) << "[" << begin << ", " << end << ")";
    int64_t none = 0;
    ForEachElementOfColumns(begin, end, cols, {}, [&none](int64_t, int64_t) { ++none; });
    EXPECT_EQ(none, 0);
  }
}

TEST(SelectColumnsTest, TopKOfColumnSumsIdenticalOnTwoRanks) {
  // Shapes whose partitions cut rows (5x7: rank 0 owns [0, 18), rank 1 [18, 35)), a wide one,
  // a one-row one and a one-element one (rank 1 owns nothing of it).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{5, 7}, {3, 50}, {1, 9}, {1, 1}};
  const double ratio = 0.3;
  at::manual_seed(11);
  std::vector<at::Tensor> grads;
  for (auto [r, c] : shapes) grads.push_back(at::randn({r, c}, at::kFloat));
  std::mutex mu;
  std::vector<ColumnSelection> got(2);
  auto statuses = testing::RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    std::vector<at::Tensor> parts;
    std::vector<ColumnParam> params;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int64_t n = shapes[i].first * shapes[i].second;
      PartitionSlice s = ComputePartition(n, 2, rank);
      parts.push_back(grads[i].reshape({-1}).narrow(0, s.begin, s.valid()).contiguous());
      params.push_back({shapes[i].first, shapes[i].second, s.begin, s.end,
                        parts.back().data_ptr<float>()});
    }
    absl::StatusOr<ColumnSelection> sel = SelectColumns(coll, params, ratio);
    if (!sel.ok()) return sel.status();
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = *sel;
    return absl::OkStatus();
  });
  ASSERT_TRUE(testing::FirstFailure(statuses).ok()) << testing::FirstFailure(statuses);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t k = NumSelectedColumns(shapes[i].second, ratio);
    EXPECT_EQ(got[0].selected[i], Reference(grads[i], k)) << "param " << i;
    EXPECT_EQ(got[0].selected[i], got[1].selected[i]) << "param " << i;
    EXPECT_EQ(got[0].sums[i], got[1].sums[i]) << "param " << i;  // bit-identical on both ranks
    at::Tensor ref = grads[i].abs().sum(0).to(at::kDouble);
    for (int64_t j = 0; j < shapes[i].second; ++j) {
      EXPECT_NEAR(got[0].sums[i][j], ref[j].item<double>(), 1e-5) << i << "," << j;
    }
  }
}

TEST(SelectColumnsTest, EmptySelectionsNeitherHangNorFail) {
  auto statuses = testing::RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    // No 2-D parameters at all: no collective.
    absl::StatusOr<ColumnSelection> none = SelectColumns(coll, {}, 0.5);
    if (!none.ok()) return none.status();
    if (!none->selected.empty()) return absl::InternalError("expected no parameters");
    // ratio 0: the sums are still reduced (same sequence on both ranks), nothing is selected.
    std::vector<float> g = {1, -2, 3, 4};
    ColumnParam p{2, 2, rank * 2, rank * 2 + 2, g.data()};
    absl::StatusOr<ColumnSelection> zero = SelectColumns(coll, {p}, 0.0);
    if (!zero.ok()) return zero.status();
    if (!zero->selected[0].empty()) return absl::InternalError("ratio 0 selected columns");
    // No gradient on this rank (null): a zero contribution.
    ColumnParam q{2, 2, rank * 2, rank * 2 + 2, rank == 0 ? nullptr : g.data()};
    absl::StatusOr<ColumnSelection> half = SelectColumns(coll, {q}, 0.5);
    if (!half.ok()) return half.status();
    // Rank 1 holds row 1 = {1, -2} of g: column 1 has the larger sum.
    if (half->selected[0] != std::vector<int64_t>{1}) return absl::InternalError("wrong column");
    return absl::OkStatus();
  });
  EXPECT_TRUE(testing::FirstFailure(statuses).ok()) << testing::FirstFailure(statuses);
}

TEST(SelectColumnsTest, BadPartitionIsInvalidArgument) {
  testing::RunGang(1, [&](int, Collectives& coll) -> absl::Status {
    std::vector<float> g(10, 1.0f);
    EXPECT_THAT(SelectColumns(coll, {{2, 3, 0, 10, g.data()}}, 0.5).status(),
                ::loom::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          "partition [0, 10) is outside the weight"));
    return absl::OkStatus();
  });
}

TEST(TopKColumnsTest, TiesGoToTheLowerIndex) {
  const std::vector<double> s = {1, 3, 3, 0, 3};
  EXPECT_EQ(TopKColumns(s.data(), 5, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(TopKColumns(s.data(), 5, 0), std::vector<int64_t>{});
  EXPECT_EQ(TopKColumns(s.data(), 5, 5), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// The boundary sequences over steps 1..12 for given schedules, written out by hand.
TEST(ZenFlowScheduleTest, BoundaryTables) {
  struct Case {
    ZenFlowSchedule s;
    std::vector<int64_t> select, update;
  };
  const std::vector<Case> cases = {
      // step strategy, select 4, update 2, no warm-up
      {{0, 4, 2}, {1, 5, 9}, {2, 4, 6, 8, 10, 12}},
      // warm-up 3: steps 1-3 are full-offload updates; intervals count from step 4
      {{3, 4, 4}, {4, 8, 12}, {1, 2, 3, 7, 11}},
      // select once (interval 0, e.g. epoch strategy with no epoch length), update 3
      {{0, 0, 3}, {1}, {3, 6, 9, 12}},
      // DeepSpeed's smoke grid entry (step, 10, 3) with full_warm_up_rounds 3
      {{3, 10, 3}, {4}, {1, 2, 3, 6, 9, 12}},
      // update every step
      {{0, 1, 1}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<int64_t> sel, upd;
    for (int64_t t = 1; t <= 12; ++t) {
      if (cases[c].s.IsSelectBoundary(t)) sel.push_back(t);
      if (cases[c].s.IsUpdateBoundary(t)) upd.push_back(t);
    }
    EXPECT_EQ(sel, cases[c].select) << "case " << c;
    EXPECT_EQ(upd, cases[c].update) << "case " << c;
  }
}

TEST(ZenFlowScheduleTest, SelectIntervalInSteps) {
  EXPECT_EQ(SelectIntervalSteps("step", 10, 0), 10);
  EXPECT_EQ(SelectIntervalSteps("epoch", 2, 10), 20);
  EXPECT_EQ(SelectIntervalSteps("auto", 0, 10), 10);  // ZF-U7: interval 10 with a 10-step loader
  EXPECT_EQ(SelectIntervalSteps("epoch", 1, 0), 0);   // no epoch length: select once
  // Regression: the product wrapped (to INT64_MIN here, to 0 with 4096 steps an epoch).
  EXPECT_EQ(SelectIntervalSteps("epoch", int64_t{1} << 52, 2048),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(SelectIntervalSteps("epoch", int64_t{1} << 52, 4096),
            std::numeric_limits<int64_t>::max());
}

TEST(ZenFlowAutoIntervalTest, FollowsTheRule) {
  // topk 0.5: avg_critic /= 5 each step, non_critic += (total - critic) / 5.
  // One param, critic 10, total 12 each step:
  //   u=1: avg = 10/5 = 2;            non = 2/5 = 0.4   -> 0.4 < 2  no
  //   u=2: avg = (2 + 10)/2/5 = 1.2;  non = 0.8         -> no
  //   u=3: avg = (2.4 + 10)/3/5 = 0.82666; non = 1.2    -> yes: boundary, reset
  //   u=1: avg = (0 + 10)/1/5 = 2 (u restarts at 1, so the old average gets weight 0)
  ZenFlowAutoInterval a(1, 0.5, 0.99);
  std::vector<bool> got;
  for (int s = 0; s < 6; ++s) got.push_back(a.Observe({12.0}, {10.0}));
  EXPECT_EQ(got, (std::vector<bool>{false, false, true, false, false, true}));
  // Two params with auto_ratio 0.5: floor(0.5 * 2) = 1 param suffices.
  ZenFlowAutoInterval b(2, 0.5, 0.5);
  EXPECT_TRUE(b.Observe({100.0, 1.0}, {1.0, 1.0}));  // param 0: non 19.8 >= avg 0.2
  // State round trip.
  ZenFlowAutoInterval c(1, 0.5, 0.99);
  c.Observe({12.0}, {10.0});
  ZenFlowAutoInterval d(1, 0.5, 0.99);
  ASSERT_TRUE(d.SetState(c.State()).ok());
  EXPECT_EQ(c.Observe({12.0}, {10.0}), d.Observe({12.0}, {10.0}));
  EXPECT_EQ(c.State(), d.State());
  EXPECT_FALSE(d.SetState({1.0}).ok());
}

}  // namespace
}  // namespace loom::engine::optim
