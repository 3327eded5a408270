#include "worker/log_ring.h"

#include <string>

#include "gtest/gtest.h"

namespace loom::worker {
namespace {

TEST(LogRingTest, SequencesBoundsAndBatches) {
  LogRing ring(3);
  EXPECT_EQ(ring.last_sequence(), 0);
  EXPECT_TRUE(ring.After(0, 10, 1000).empty());
  for (int i = 1; i <= 5; ++i) ring.Add(i % 2 ? "stdout" : "stderr", "line " + std::to_string(i));
  EXPECT_EQ(ring.last_sequence(), 5);
  // Only the newest 3 are kept; a reader behind the ring gets what is left.
  std::vector<loom::v1::RankLogLine> all = ring.After(0, 10, 1000);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].sequence(), 3);
  EXPECT_EQ(all[0].text(), "line 3");
  EXPECT_EQ(all[0].stream(), "stdout");
  EXPECT_EQ(all[1].stream(), "stderr");
  // Batches by line count and bytes; always at least one line.
  EXPECT_EQ(ring.After(3, 1, 1000).size(), 1u);
  EXPECT_EQ(ring.After(3, 1, 1000)[0].sequence(), 4);
  EXPECT_EQ(ring.After(2, 10, 12).size(), 2u);  // "line 3" + "line 4" = 12 bytes
  EXPECT_EQ(ring.After(2, 10, 1).size(), 1u);
  EXPECT_TRUE(ring.After(5, 10, 1000).empty());
}

TEST(LogRingTest, LongLinesAreCut) {
  LogRing ring;
  ring.Add("stderr", std::string(10000, 'x'));
  std::vector<loom::v1::RankLogLine> lines = ring.After(0, 1, 1 << 20);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].text().size(), kMaxRankLogLineBytes);
  EXPECT_EQ(lines[0].text().substr(kMaxRankLogLineBytes - 14), "...[truncated]");
}

}  // namespace
}  // namespace loom::worker
