// RankProcess's account of how a trainer ended (the rest is covered through the worker daemon,
// worker_daemon_test.cc).
#include "worker/rank_process.h"

#include <signal.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/oom_kill.h"

namespace loom::worker {
namespace {

// Issue 53: a trainer SIGKILLed by somebody (an operator's `kill -9`) is told apart from one the
// kernel's OOM killer ended, where the cgroup's count can be read (then OOM_KILL_NO; the
// scheduler counted every exit 137 as cause "oom"); where it cannot, UNKNOWN as before.
TEST(RankProcessTest, SigkillFromAnotherProcessIsNotAnOomKill) {
  loom::v1::RankAssignment a;
  a.set_job_id("job-kill");
  a.set_attempt(1);
  a.set_world_size(1);
  a.set_master_addr("127.0.0.1");
  a.mutable_spec()->set_name("hang");
  a.set_checkpoint_dir(absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt"));
  RankProcessOptions o;
  o.trainer_path = absl::StrCat(std::getenv("TEST_SRCDIR"), "/loom/worker/testdata/fake_trainer.sh");
  o.run_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/run");
  absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Start(a, o);
  ASSERT_TRUE(p.ok()) << p.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*p)->Status().state() != loom::v1::RANK_STATE_RUNNING && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ((*p)->Status().state(), loom::v1::RANK_STATE_RUNNING);
  ASSERT_EQ(::kill((*p)->pid(), SIGKILL), 0);
  while (!(*p)->Finished() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE((*p)->Finished());
  const loom::v1::RankStatus st = (*p)->Status();
  EXPECT_EQ(st.state(), loom::v1::RANK_STATE_FAILED);
  EXPECT_EQ(st.term_signal(), SIGKILL);
  EXPECT_EQ(st.exit_code(), 137);
  EXPECT_EQ(st.oom_kill(), ReadOomKillCount().has_value() ? loom::v1::OOM_KILL_NO
                                                          : loom::v1::OOM_KILL_UNKNOWN)
      << "cgroup OOM kill count readable here: " << ReadOomKillCount().has_value();
}

}  // namespace
}  // namespace loom::worker
