#include "scheduler/restart_policy.h"

#include <gtest/gtest.h>

#include "worker/trainer/exit_codes.h"

namespace loom {
namespace {

loom::v1::RankStatus Exit(int code, const std::string& error, int signal = 0, int64_t at = 0) {
  loom::v1::RankStatus st;
  st.set_state(loom::v1::RANK_STATE_FAILED);
  st.set_exit_code(code);
  st.set_error(error);
  st.set_term_signal(signal);
  st.set_exit_time_us(at);
  return st;
}

TEST(RestartPolicyTest, ClassifiesTrainerExitCodes) {
  RankExitClass config = ClassifyRankExit(Exit(kTrainerExitConfigError, "model.init_from: ..."), true);
  EXPECT_TRUE(config.final);
  EXPECT_EQ(config.reason, "ConfigError");
  EXPECT_EQ(config.failure_class, loom::v1::FAILURE_CLASS_USER);
  RankExitClass data = ClassifyRankExit(Exit(kTrainerExitDataError, "rank_1.shard: CRC-32"), true);
  EXPECT_FALSE(data.final);
  EXPECT_EQ(data.reason, "DataError");
  EXPECT_EQ(data.failure_class, loom::v1::FAILURE_CLASS_INFRA);
  // Issue 42 defect 5: a dataset that changed under the job (or cannot hold its windows) is
  // final, never retried on either budget.
  RankExitClass dataset = ClassifyRankExit(
      Exit(kTrainerExitDatasetError, "dataset.path: /data/x.txt changed since the job first "
                                     "started: size 542789 -> 414383 bytes"),
      true);
  EXPECT_EQ(kTrainerExitDatasetError, 66);
  EXPECT_TRUE(dataset.final);
  EXPECT_EQ(dataset.reason, "DatasetError");
  EXPECT_EQ(dataset.failure_class, loom::v1::FAILURE_CLASS_USER);
  EXPECT_FALSE(ClassifyRankExit(Exit(kTrainerExitDatasetError, "", 1), true).final);
  EXPECT_EQ(ClassifyRankExit(Exit(1, "boom"), true).failure_class, loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(ClassifyRankExit(Exit(137, "", 9), true).failure_class, loom::v1::FAILURE_CLASS_OOM);
  EXPECT_EQ(ClassifyRankExit(Exit(127, "not found"), false).failure_class,
            loom::v1::FAILURE_CLASS_SETUP);
  // 78 from a signal-killed process is not the trainer's verdict.
  EXPECT_FALSE(ClassifyRankExit(Exit(kTrainerExitConfigError, "", 1), true).final);
}

// Issue 53: SIGKILL is the OOM killer's only when the worker saw its cgroup's OOM kill count
// rise, or could not tell (then as before); an operator's `kill -9` was counted as "oom".
TEST(RestartPolicyTest, SigkillIsOomOnlyWhenTheWorkerSawTheOomKiller) {
  loom::v1::RankStatus oom = Exit(137, "", 9), other = Exit(137, "", 9);
  oom.set_oom_kill(loom::v1::OOM_KILL_YES);
  other.set_oom_kill(loom::v1::OOM_KILL_NO);
  EXPECT_EQ(ClassifyRankExit(oom, true).failure_class, loom::v1::FAILURE_CLASS_OOM);
  EXPECT_EQ(ClassifyRankExit(other, true).failure_class, loom::v1::FAILURE_CLASS_USER);
  EXPECT_EQ(ClassifyRankExit(Exit(137, "", 9), true).failure_class, loom::v1::FAILURE_CLASS_OOM);
  // The trainer's own out-of-memory error stays OOM whatever the cgroup says.
  loom::v1::RankStatus said = Exit(1, "CUDA out of memory. Tried to allocate 2.00 GiB");
  said.set_oom_kill(loom::v1::OOM_KILL_NO);
  EXPECT_EQ(ClassifyRankExit(said, true).failure_class, loom::v1::FAILURE_CLASS_OOM);
  EXPECT_EQ(RankExitMessage(0, "a", oom),
            "rank 0 on node a exited with code 137 (killed by signal 9, SIGKILL, by the kernel's "
            "OOM killer)");
  EXPECT_EQ(RankExitMessage(0, "a", other),
            "rank 0 on node a exited with code 137 (killed by signal 9, SIGKILL, not by the OOM "
            "killer)");
}

TEST(RestartPolicyTest, ExitMessagesNameTheSignalAndTheMeaning) {
  EXPECT_EQ(RankExitMessage(0, "a", Exit(137, "", 9)),
            "rank 0 on node a exited with code 137 (killed by signal 9, SIGKILL)");
  EXPECT_EQ(RankExitMessage(1, "b", Exit(kTrainerExitConfigError, "bad")),
            "rank 1 on node b exited with code 78 (configuration error): bad");
  EXPECT_EQ(RankExitMessage(0, "a", Exit(kTrainerExitDatasetError, "dataset.path: /d changed")),
            "rank 0 on node a exited with code 66 (dataset error): dataset.path: /d changed");
}

TEST(RestartPolicyTest, PrefersSignalledThenOwnErrorThenPeerSymptomThenFirstToExit) {
  const auto killed = Exit(137, "", 9, 2000);
  const auto own = Exit(1, "out of disk", 0, 1500);
  const auto peer = Exit(1, "Connection closed by peer [127.0.0.1]:4242", 0, 1000);
  EXPECT_TRUE(SawPeerGoAway(peer));
  EXPECT_FALSE(SawPeerGoAway(own));
  EXPECT_TRUE(IsLikelierCause(killed, peer));
  EXPECT_TRUE(IsLikelierCause(killed, own));
  EXPECT_TRUE(IsLikelierCause(own, peer));
  EXPECT_FALSE(IsLikelierCause(peer, killed));
  EXPECT_FALSE(IsLikelierCause(peer, own));
  // Equal evidence: the one whose process ended first.
  EXPECT_TRUE(IsLikelierCause(Exit(1, "x", 0, 10), Exit(1, "y", 0, 20)));
  EXPECT_FALSE(IsLikelierCause(Exit(1, "x", 0, 20), Exit(1, "y", 0, 10)));
  EXPECT_FALSE(IsLikelierCause(Exit(1, "x", 0, 0), Exit(1, "y", 0, 10)));  // unknown time
}

TEST(RestartPolicyTest, BackoffDoublesUpToTheCap) {
  const absl::Duration base = absl::Seconds(1), cap = absl::Seconds(10);
  EXPECT_EQ(ExponentialBackoff(1, base, cap), absl::Seconds(1));
  EXPECT_EQ(ExponentialBackoff(2, base, cap), absl::Seconds(2));
  EXPECT_EQ(ExponentialBackoff(4, base, cap), absl::Seconds(8));
  EXPECT_EQ(ExponentialBackoff(5, base, cap), absl::Seconds(10));
  EXPECT_EQ(ExponentialBackoff(1000, base, cap), absl::Seconds(10));
  EXPECT_EQ(ExponentialBackoff(3, absl::ZeroDuration(), cap), absl::ZeroDuration());
}

TEST(RestartPolicyTest, HistoryIsBoundedAndCutsLongMessages) {
  loom::internal::JobSchedulingState state;
  for (int i = 0; i < kMaxJobHistory + 5; ++i) {
    AppendHistory(&state, absl::FromUnixSeconds(i), loom::v1::JOB_PHASE_RECOVERING, "RankFailed",
                  std::string(i == kMaxJobHistory + 4 ? 5000 : 10, 'm'), i);
  }
  ASSERT_EQ(state.history_size(), kMaxJobHistory);
  EXPECT_EQ(state.history(0).attempt(), 5);  // the oldest five were dropped
  EXPECT_EQ(state.history(0).time_us(), 5000000);
  EXPECT_EQ(state.history(kMaxJobHistory - 1).message().size(), kMaxHistoryMessageBytes + 3);
}

}  // namespace
}  // namespace loom
