// SubGroupPlan: the greedy cut (checked against hand-computed groups) and the order of the
// "sub-group ready" events for in-order and out-of-order parameter events.
#include "worker/engine/optim/sub_groups.h"

#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::engine::optim {
namespace {

using ::loom::testing::StatusIs;

TEST(SubGroupPlanTest, CutsWholeParametersGreedily) {
  // sub_group_size 10: [4, 6] fill a group exactly, 11 is larger than a group (alone), [3, 3]
  // share one, 5 does not fit after them (3+3+5 > 10), 0 joins the last group.
  absl::StatusOr<SubGroupPlan> plan = SubGroupPlan::Create({4, 6, 11, 3, 3, 5, 0}, 10);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->num_sub_groups(), 4);
  const std::vector<std::vector<int64_t>> expected = {
      // first, last, offset, numel
      {0, 2, 0, 10}, {2, 3, 10, 11}, {3, 5, 21, 6}, {5, 7, 27, 5}};
  for (int64_t k = 0; k < 4; ++k) {
    const SubGroup& g = plan->sub_group(k);
    EXPECT_EQ(static_cast<int64_t>(g.first), expected[k][0]) << k;
    EXPECT_EQ(static_cast<int64_t>(g.last), expected[k][1]) << k;
    EXPECT_EQ(g.offset, expected[k][2]) << k;
    EXPECT_EQ(g.numel, expected[k][3]) << k;
    EXPECT_EQ(plan->group_end(k), expected[k][2] + expected[k][3]) << k;
  }
  EXPECT_EQ(plan->total_numel(), 32);
  EXPECT_EQ(plan->sub_group_of(1), 0);
  EXPECT_EQ(plan->sub_group_of(2), 1);
  EXPECT_EQ(plan->sub_group_of(6), 3);
  EXPECT_EQ(plan->partition_offset(5), 27);
}

TEST(SubGroupPlanTest, DefaultSizeIsOneGroupAndEmptyModelHasNone) {
  absl::StatusOr<SubGroupPlan> one = SubGroupPlan::Create({7, 8, 9}, 1000000000);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->num_sub_groups(), 1);
  absl::StatusOr<SubGroupPlan> none = SubGroupPlan::Create({}, 5);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->num_sub_groups(), 0);
  EXPECT_TRUE(none->all_ready());
}

TEST(SubGroupPlanTest, RejectsBadSizes) {
  EXPECT_THAT(SubGroupPlan::Create({1, 2}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "zero_optimization.sub_group_size"));
  EXPECT_THAT(SubGroupPlan::Create({1, -2}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, "parameter 1"));
}

TEST(SubGroupPlanTest, InOrderEventsRaiseEachGroupAtItsLastParameter) {
  absl::StatusOr<SubGroupPlan> plan = SubGroupPlan::Create({4, 6, 11, 3, 3, 5, 0}, 10);
  ASSERT_TRUE(plan.ok());
  std::vector<int64_t> raised;
  for (size_t i = 0; i < 7; ++i) {
    absl::StatusOr<int64_t> k = plan->MarkParamReady(i);
    ASSERT_TRUE(k.ok()) << k.status();
    raised.push_back(*k);
  }
  EXPECT_EQ(raised, (std::vector<int64_t>{-1, 0, 1, -1, 2, -1, 3}));
  EXPECT_TRUE(plan->all_ready());
}

TEST(SubGroupPlanTest, ReverseOrderEventsAsBackwardRaisesThem) {
  // Backward finishes the last layers first: groups become ready from the back.
  absl::StatusOr<SubGroupPlan> plan = SubGroupPlan::Create({4, 6, 11, 3, 3, 5, 0}, 10);
  ASSERT_TRUE(plan.ok());
  std::vector<int64_t> order;
  for (size_t i = 7; i-- > 0;) {
    absl::StatusOr<int64_t> k = plan->MarkParamReady(i);
    ASSERT_TRUE(k.ok());
    if (*k >= 0) order.push_back(*k);
    if (i > 0) {
      EXPECT_FALSE(plan->all_ready());
    }
  }
  EXPECT_EQ(order, (std::vector<int64_t>{3, 2, 1, 0}));
  EXPECT_TRUE(plan->all_ready());
}

TEST(SubGroupPlanTest, TwiceInAStepFailsAndResetStartsOver) {
  absl::StatusOr<SubGroupPlan> plan = SubGroupPlan::Create({2, 2}, 4);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(plan->MarkParamReady(0).ok());
  EXPECT_THAT(plan->MarkParamReady(0), StatusIs(absl::StatusCode::kFailedPrecondition, "twice"));
  EXPECT_THAT(plan->MarkParamReady(2), StatusIs(absl::StatusCode::kOutOfRange, "parameter 2"));
  EXPECT_FALSE(plan->all_ready());
  plan->ResetReadiness();
  ASSERT_EQ(*plan->MarkParamReady(0), -1);
  ASSERT_EQ(*plan->MarkParamReady(1), 0);
  EXPECT_TRUE(plan->all_ready());
}

TEST(SubGroupPlanTest, EventsFromAnotherThread) {
  // A provider listener may raise events on its communication thread.
  absl::StatusOr<SubGroupPlan> plan = SubGroupPlan::Create(std::vector<int64_t>(64, 1), 4);
  ASSERT_TRUE(plan.ok());
  std::vector<int64_t> raised_a, raised_b;
  std::thread a([&] {
    for (size_t i = 0; i < 64; i += 2) {
      absl::StatusOr<int64_t> k = plan->MarkParamReady(i);
      if (k.ok() && *k >= 0) raised_a.push_back(*k);
    }
  });
  for (size_t i = 1; i < 64; i += 2) {
    absl::StatusOr<int64_t> k = plan->MarkParamReady(i);
    if (k.ok() && *k >= 0) raised_b.push_back(*k);
  }
  a.join();
  EXPECT_EQ(raised_a.size() + raised_b.size(), 16u);  // each group raised exactly once
  EXPECT_TRUE(plan->all_ready());
}

}  // namespace
}  // namespace loom::engine::optim
