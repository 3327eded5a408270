// Percentile against values picked by hand from the sorted samples.
#include "common/percentile.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(PercentileTest, PicksTheSortedSampleAtFloorPN) {
  const std::vector<double> v = {9, 1, 7, 3, 5, 2, 8, 4, 6, 10};  // sorted: 1..10
  EXPECT_EQ(Percentile(v, 0.0), 1);
  EXPECT_EQ(Percentile(v, 0.5), 6);   // index 5: the upper median
  EXPECT_EQ(Percentile(v, 0.99), 10);  // index 9
  EXPECT_EQ(Percentile(v, 1.0), 10);   // clamped to the last
  EXPECT_EQ(Percentile(v, 0.25), 3);   // index 2
}

TEST(PercentileTest, TwoHundredSamplesP99IsThe199thSmallest) {
  std::vector<double> v;
  for (int i = 200; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 0.99), 199);
  EXPECT_EQ(Percentile(v, 0.5), 101);
}

TEST(PercentileTest, EmptyIsZeroAndOneSampleIsItself) {
  EXPECT_EQ(Percentile({}, 0.99), 0);
  EXPECT_EQ(Percentile({42.5}, 0.5), 42.5);
  EXPECT_EQ(Percentile({42.5}, 0.0), 42.5);
}

}  // namespace
}  // namespace loom
