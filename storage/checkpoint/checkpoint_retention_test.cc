// Checkpoint deletion and retention (checkpoint_retention.cc: DeleteCheckpoint, ApplyRetention)
// on real step directories written as the trainer writes them (checkpoint_test_util.h).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/checkpoint_test_util.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"

namespace loom::storage {
namespace {

using namespace checkpoint_test;  // NOLINT: test helpers

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

TEST(RetentionTest, DeleteIsIdempotentAndNeverRemovesNewestCommitted) {
  std::string dir = TmpDir("delete");
  for (int64_t step : {100, 200, 300}) WriteCheckpoint(dir, step, 2, TestModel(), AllRanks(2));
  WriteCheckpoint(dir, 400, 2, TestModel(), {0});  // partial, newer than the newest committed
  ASSERT_TRUE(Consolidate(dir, 100, "").ok());     // output inside the step dir goes with it

  auto d = DeleteCheckpoint(dir, 100);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->deleted);
  EXPECT_FALSE(Exists(dir + "/step_00000100"));
  auto again = DeleteCheckpoint(dir, 100);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->deleted);

  ExpectStatus(DeleteCheckpoint(dir, 300).status(), absl::StatusCode::kFailedPrecondition,
               "newest committed");
  EXPECT_TRUE(Exists(dir + "/step_00000300/rank_0.shard"));
  ExpectStatus(DeleteCheckpoint(dir, 200, {200}).status(), absl::StatusCode::kFailedPrecondition,
               "protected");
  EXPECT_TRUE(Exists(dir + "/step_00000200"));
  EXPECT_EQ(DeleteCheckpoint(dir, 0).status().code(), absl::StatusCode::kInvalidArgument);

  // A deletion interrupted by a crash (moved aside by a dead process) is cleaned up later.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int ws = 0;
  ASSERT_EQ(::waitpid(child, &ws, 0), child);
  const std::string leftover = absl::StrCat(dir, "/.deleting.step_00000050.", child);
  ASSERT_TRUE(MakeDirs(leftover + "/hf").ok());
  ASSERT_TRUE(DeleteCheckpoint(dir, 200).ok());
  EXPECT_FALSE(Exists(leftover));
  EXPECT_FALSE(Exists(dir + "/step_00000200"));
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 300);
  EXPECT_EQ((*list)[1].step, 400);
}

TEST(RetentionTest, KeepBestByMetricAlongsideTheLast) {
  std::string dir = TmpDir("retention_best");
  const std::vector<std::string> sections = {"fp32_params", "exp_avg", "exp_avg_sq"};
  // eval_loss per step: the best two are steps 20 (1.5) and 40 (1.7); step 30 has no eval.
  const std::map<int64_t, double> eval = {{10, 2.0}, {20, 1.5}, {40, 1.7}, {50, 1.9}, {60, 1.8}};
  for (int64_t step : {10, 20, 30, 40, 50, 60}) {
    std::map<std::string, double> metrics = {{"train_loss", 3.0 - step / 100.0}};
    if (eval.count(step)) metrics["eval_loss"] = eval.at(step);
    WriteCheckpoint(dir, step, 2, TestModel(), AllRanks(2), kConfig, sections, metrics);
  }
  auto listed = ListCheckpoints(dir);
  ASSERT_TRUE(listed.ok());
  EXPECT_DOUBLE_EQ((*listed)[1].metrics.at("eval_loss"), 1.5);
  EXPECT_EQ((*listed)[2].metrics.count("eval_loss"), 0u);
  RetentionPolicy policy;
  policy.keep_last = 1;
  policy.keep_best = 2;
  auto r = ApplyRetention(dir, policy);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kept_steps, (std::vector<int64_t>{20, 40, 60}));
  EXPECT_EQ(r->deleted_steps, (std::vector<int64_t>{10, 30, 50}));
  policy.keep_best = -1;
  EXPECT_EQ(ApplyRetention(dir, policy).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RetentionTest, KeepLastK) {
  std::string dir = TmpDir("retention");
  for (int64_t step : {10, 20, 30, 40, 50}) WriteCheckpoint(dir, step, 2, TestModel(), AllRanks(2));
  WriteCheckpoint(dir, 25, 2, TestModel(), {1});  // partial, older than the newest committed
  WriteCheckpoint(dir, 60, 2, TestModel(), {0});  // partial, maybe still being written
  auto r = ApplyRetention(dir, {2}, /*protected_steps=*/{20});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, (std::vector<int64_t>{10, 25, 30}));
  EXPECT_EQ(r->kept_steps, (std::vector<int64_t>{20, 40, 50, 60}));
  auto again = ApplyRetention(dir, {2}, {20});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->deleted_steps.empty());
  auto one = ApplyRetention(dir, {1});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->deleted_steps, (std::vector<int64_t>{20, 40}));
  EXPECT_EQ(one->kept_steps, (std::vector<int64_t>{50, 60}));
  EXPECT_TRUE(NewestCommittedCheckpoint(dir).ok());
  EXPECT_EQ(ApplyRetention(dir, {0}).status().code(), absl::StatusCode::kInvalidArgument);

  // Nothing committed: nothing is deleted.
  std::string dir2 = TmpDir("retention_none");
  WriteCheckpoint(dir2, 5, 2, TestModel(), {0});
  auto none = ApplyRetention(dir2, {1});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->deleted_steps.empty());
  EXPECT_EQ(none->kept_steps, (std::vector<int64_t>{5}));
}

// A backlog (the checkpoint service was stopped while a fast job kept checkpointing: hundreds of
// step directories) goes in one call, from one scan, and leaves exactly the kept step
// directories: no moved-aside leftovers, and an interrupted deletion's leftover is removed too.
// Regression for the per-step rescans that made one pass quadratic in the backlog
// (//tests/e2e:liveness_e2e_test, FrozenCheckpointServiceDelaysNoHeartbeatAndRetentionCatchesUp).
TEST(RetentionTest, ABacklogOfHundredsOfStepsGoesInOneCall) {
  std::string dir = TmpDir("retention_backlog");
  std::vector<int64_t> steps;
  for (int64_t step = 20; step <= 20 * 300; step += 20) {
    WriteCheckpoint(dir, step, 1, TestModel(), AllRanks(1));
    steps.push_back(step);
  }
  // An interrupted deletion's leftover: moved aside by a process that has since died.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  ASSERT_EQ(::mkdir(absl::StrCat(dir, "/.deleting.step_00000007.", dead).c_str(), 0755), 0);
  auto r = ApplyRetention(dir, {2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deleted_steps, std::vector<int64_t>(steps.begin(), steps.end() - 2));
  EXPECT_EQ(r->kept_steps, (std::vector<int64_t>{5980, 6000}));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    left.push_back(e.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{StepDirName(5980), StepDirName(6000)}));
  auto listed = ListCheckpoints(dir);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_TRUE((*listed)[0].committed && (*listed)[1].committed);
}

}  // namespace
}  // namespace loom::storage
