#include "storage/checkpoint/resume_point.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/corrupt_mark.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::storage {
namespace {

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

// A committed 2-rank checkpoint of `step` whose values depend on the step.
void WriteStep(const std::string& dir, int64_t step) {
  const std::string step_dir = absl::StrCat(dir, "/", StepDirName(step));
  for (int32_t r = 0; r < 2; ++r) {
    ShardManifest m;
    m.step = step;
    m.rank = r;
    m.world_size = 2;
    m.params = {{"a", {4, 4}, 16}, {"b", {8}, 8}};
    AssignPartitionLayout(m);
    std::vector<float> data(m.section_numel, 0.5f * static_cast<float>(step + r));
    const float* p = data.data();
    ASSERT_TRUE(WriteShard(step_dir, m, absl::MakeConstSpan(&p, 1)).ok());
  }
}

// Flips one byte of rank 1's shard in place (as a disk fault would: same file, same size).
void FlipByte(const std::string& dir, int64_t step) {
  std::fstream f(absl::StrCat(dir, "/", StepDirName(step), "/rank_1.shard"),
                 std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  f.seekg(5);
  const char c = static_cast<char>(f.get());
  f.seekp(5);
  f.put(static_cast<char>(c ^ 0x01));
}

TEST(ResumePointTest, CorruptNewestStepIsMarkedSkippedAndListedAsCorrupt) {
  const std::string dir = TmpDir("corrupt_newest");
  WriteStep(dir, 4);
  WriteStep(dir, 8);
  FlipByte(dir, 8);
  // Listing alone reads no shard contents: step 8 still looks committed.
  auto before = ListCheckpoints(dir);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->size(), 2u);
  EXPECT_TRUE((*before)[1].committed);

  auto point = NewestIntactCheckpoint(dir);
  ASSERT_TRUE(point.ok()) << point.status();
  ASSERT_TRUE(point->checkpoint.has_value());
  EXPECT_EQ(point->checkpoint->step, 4);
  ASSERT_EQ(point->skipped.size(), 1u);
  EXPECT_EQ(point->skipped[0].step, 8);
  EXPECT_TRUE(absl::StrContains(point->skipped[0].reason, "rank_1.shard")) << point->skipped[0].reason;
  EXPECT_TRUE(absl::StrContains(point->skipped[0].reason, "CRC-32")) << point->skipped[0].reason;
  EXPECT_TRUE(absl::StartsWith(point->SkippedSummary(), "skipped step 8 (")) << point->SkippedSummary();

  // The mark is on disk: listings show step 8 corrupt (not committed), the newest committed one
  // is step 4, and consolidating "the newest" takes step 4.
  auto after = ListCheckpoints(dir);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), 2u);
  EXPECT_FALSE((*after)[1].committed);
  EXPECT_TRUE((*after)[1].corrupt);
  EXPECT_TRUE(absl::StrContains((*after)[1].corrupt_reason, "CRC-32"));
  EXPECT_EQ((*after)[1].commit_status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE((*after)[0].committed);
  auto newest = NewestCommittedCheckpoint(dir);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 4);

  // A second choice needs no new verification of step 8 and says it was marked.
  auto again = NewestIntactCheckpoint(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->checkpoint->step, 4);
  ASSERT_EQ(again->skipped.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(again->skipped[0].reason, "marked corrupt: ")) << again->skipped[0].reason;
}

// Regression (break-it pass, 2026-12-05): a step with a truncated manifest was passed over
// like a partial one, and the restart from the older step said nothing about why.
TEST(ResumePointTest, StepWithAnUnreadableManifestIsNamedAsSkipped) {
  const std::string dir = TmpDir("unreadable_manifest");
  WriteStep(dir, 4);
  WriteStep(dir, 8);
  std::ofstream(absl::StrCat(dir, "/", StepDirName(8), "/rank_1.manifest.json"),
                std::ios::trunc)
      << "{\"format\":";
  auto point = NewestIntactCheckpoint(dir);
  ASSERT_TRUE(point.ok()) << point.status();
  ASSERT_TRUE(point->checkpoint.has_value());
  EXPECT_EQ(point->checkpoint->step, 4);
  ASSERT_EQ(point->skipped.size(), 1u);
  EXPECT_EQ(point->skipped[0].step, 8);
  EXPECT_TRUE(absl::StrContains(point->skipped[0].reason, "unreadable manifest of rank 1"))
      << point->skipped[0].reason;
}

TEST(ResumePointTest, RewritingTheStepLiftsTheMark) {
  const std::string dir = TmpDir("rewritten");
  WriteStep(dir, 4);
  WriteStep(dir, 8);
  FlipByte(dir, 8);
  ASSERT_EQ(NewestIntactCheckpoint(dir)->checkpoint->step, 4);
  ASSERT_TRUE(CorruptMarkReason(absl::StrCat(dir, "/", StepDirName(8))).has_value());
  // An attempt resumed from step 4 writes step 8 again (files replaced by rename).
  WriteStep(dir, 8);
  EXPECT_FALSE(CorruptMarkReason(absl::StrCat(dir, "/", StepDirName(8))).has_value());
  auto point = NewestIntactCheckpoint(dir);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->checkpoint->step, 8);
  EXPECT_TRUE(point->skipped.empty());
}

TEST(ResumePointTest, EveryStepCorruptOrNoneMeansStartOver) {
  const std::string dir = TmpDir("all_corrupt");
  WriteStep(dir, 4);
  FlipByte(dir, 4);
  auto point = NewestIntactCheckpoint(dir);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_FALSE(point->checkpoint.has_value());
  ASSERT_EQ(point->skipped.size(), 1u);
  EXPECT_EQ(point->skipped[0].step, 4);

  auto none = NewestIntactCheckpoint(TmpDir("all_corrupt") + "/absent");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->checkpoint.has_value());
  EXPECT_TRUE(none->skipped.empty());
}

TEST(ResumePointTest, IntactStepsAreNotMarked) {
  const std::string dir = TmpDir("intact");
  WriteStep(dir, 4);
  auto verified = VerifyAndMarkCorrupt(absl::StrCat(dir, "/", StepDirName(4)));
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_FALSE(CorruptMarkReason(absl::StrCat(dir, "/", StepDirName(4))).has_value());
  EXPECT_EQ(NewestIntactCheckpoint(dir)->checkpoint->step, 4);
}

}  // namespace
}  // namespace loom::storage
