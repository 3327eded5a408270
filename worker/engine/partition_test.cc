#include "worker/engine/partition.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine {
namespace {

// docs/design/TECHNIQUES.md §1.11 worked vector: n = 10, N = 4 -> p = 3, padding 2.
TEST(PartitionTest, WorkedVectorTenOverFour) {
  EXPECT_EQ(PartitionNumel(10, 4), 3);
  EXPECT_EQ(TotalPadding(10, 4), 2);
  PartitionSlice r0 = ComputePartition(10, 4, 0), r1 = ComputePartition(10, 4, 1);
  PartitionSlice r2 = ComputePartition(10, 4, 2), r3 = ComputePartition(10, 4, 3);
  EXPECT_EQ(r0.begin, 0);
  EXPECT_EQ(r0.end, 3);
  EXPECT_EQ(r1.begin, 3);
  EXPECT_EQ(r1.end, 6);
  EXPECT_EQ(r2.begin, 6);
  EXPECT_EQ(r2.end, 9);
  EXPECT_EQ(r3.begin, 9);
  EXPECT_EQ(r3.end, 10);
  EXPECT_EQ(r3.valid(), 1);
  EXPECT_EQ(r3.padding(), 2);
  EXPECT_EQ(r0.padding(), 0);
}

// n = 4096*4096, N = 3 -> p = 5,592,406, padding 2.
TEST(PartitionTest, WorkedVectorLargeOverThree) {
  const int64_t n = 4096LL * 4096LL;
  EXPECT_EQ(PartitionNumel(n, 3), 5592406);
  EXPECT_EQ(TotalPadding(n, 3), 2);
  PartitionSlice last = ComputePartition(n, 3, 2);
  EXPECT_EQ(last.begin, 2 * 5592406);
  EXPECT_EQ(last.end, n);
  EXPECT_EQ(last.padding(), 2);
}

TEST(PartitionTest, EmptyTrailingRanksWhenNExceedsNumel) {
  // n = 2, N = 4 -> p = 1; ranks 2, 3 own nothing and are all padding.
  PartitionSlice r3 = ComputePartition(2, 4, 3);
  EXPECT_EQ(r3.partition_numel, 1);
  EXPECT_EQ(r3.valid(), 0);
  EXPECT_EQ(r3.padding(), 1);
}

// Concatenation of all zero-padded partitions, truncated to n, reproduces the tensor bit-exactly.
TEST(PartitionTest, ConcatTruncateReproducesBitExactly) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  for (int64_t n : {1, 2, 3, 7, 10, 64, 97, 1000, 4097}) {
    std::vector<float> flat(n);
    for (float& v : flat) v = dist(rng);
    for (int64_t N = 1; N <= 9; ++N) {
      std::vector<float> concat;
      int64_t owned = 0;
      for (int64_t r = 0; r < N; ++r) {
        PartitionSlice s = ComputePartition(n, N, r);
        std::vector<float> part(s.partition_numel, 0.f);
        std::copy(flat.begin() + s.begin, flat.begin() + s.end, part.begin());
        for (int64_t i = s.valid(); i < s.partition_numel; ++i) ASSERT_EQ(part[i], 0.f);
        owned += s.valid();
        concat.insert(concat.end(), part.begin(), part.end());
      }
      ASSERT_EQ(owned, n) << "n=" << n << " N=" << N;
      ASSERT_EQ(static_cast<int64_t>(concat.size()), N * PartitionNumel(n, N));
      concat.resize(n);
      ASSERT_EQ(std::memcmp(concat.data(), flat.data(), n * sizeof(float)), 0)
          << "n=" << n << " N=" << N;
    }
  }
}

}  // namespace
}  // namespace loom::engine
