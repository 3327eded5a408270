#include "scheduler/rank_progress.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(RankProgressTest, AnyRanksNewStepAdvancesTheGang) {
  RankProgress p;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(p.LastAdvance("job").has_value());
  // First reports are baselines (a re-adopted rank's step proves nothing by itself).
  EXPECT_FALSE(p.Observe("job", 1, 0, 5, t0));
  EXPECT_FALSE(p.Observe("job", 1, 1, 5, t0));
  EXPECT_FALSE(p.LastAdvance("job").has_value());
  // Rank 1 steps while rank 0's reports stop: the gang advanced.
  EXPECT_TRUE(p.Observe("job", 1, 1, 6, t0 + absl::Seconds(1)));
  EXPECT_EQ(p.LastAdvance("job"), t0 + absl::Seconds(1));
  EXPECT_FALSE(p.Observe("job", 1, 1, 6, t0 + absl::Seconds(2)));  // the same step again
  EXPECT_EQ(p.LastAdvance("job"), t0 + absl::Seconds(1));
  EXPECT_EQ(p.LatestStep("job", 1), 6);
  EXPECT_EQ(p.LatestStep("job", 0), 5);
  EXPECT_EQ(p.LatestStep("job", 2), -1);
}

TEST(RankProgressTest, AttemptsAreSeparate) {
  RankProgress p;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  p.Observe("job", 1, 0, 10, t0);
  EXPECT_TRUE(p.Observe("job", 1, 0, 11, t0));
  // Attempt 2 resumed from step 4: a new baseline, not a step backwards.
  EXPECT_FALSE(p.Observe("job", 2, 0, 4, t0 + absl::Seconds(1)));
  EXPECT_FALSE(p.LastAdvance("job").has_value());
  // A late report of attempt 1 is ignored.
  EXPECT_FALSE(p.Observe("job", 1, 0, 12, t0 + absl::Seconds(2)));
  EXPECT_TRUE(p.Observe("job", 2, 0, 5, t0 + absl::Seconds(3)));
  EXPECT_EQ(p.LastAdvance("job"), t0 + absl::Seconds(3));
  p.Forget("job");
  EXPECT_FALSE(p.LastAdvance("job").has_value());
  EXPECT_EQ(p.LatestStep("job", 0), -1);
}

}  // namespace
}  // namespace loom
