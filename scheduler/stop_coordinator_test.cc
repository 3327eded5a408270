// StopCoordinator on its own (no gRPC, no store): deadlines on a fake clock, rank ends, the
// final messages.
#include "scheduler/stop_coordinator.h"

#include "gtest/gtest.h"
#include "scheduler/fake_clock.h"

namespace loom {
namespace {

v1::RankStatus Ended(const std::string& job, int32_t rank, v1::RankState state, bool graceful,
                     int64_t checkpoint_step) {
  v1::RankStatus st;
  st.set_job_id(job);
  st.set_rank(rank);
  st.set_state(state);
  st.set_graceful_stop(graceful);
  st.mutable_progress()->set_last_checkpoint_step(checkpoint_step);
  return st;
}

TEST(StopCoordinatorTest, DeadlineOnFakeClock) {
  FakeClock clock;
  StopCoordinator stops;
  stops.Begin("job-a", clock.Now(), absl::Minutes(2));
  clock.Advance(absl::Seconds(30));
  stops.Begin("job-b", clock.Now(), absl::Minutes(2));
  EXPECT_EQ(stops.Jobs(), (std::vector<std::string>{"job-a", "job-b"}));
  clock.Advance(absl::Seconds(90));  // exactly job-a's deadline: not late yet
  EXPECT_TRUE(stops.Late(clock.Now()).empty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(stops.Late(clock.Now()), (std::vector<std::string>{"job-a"}));
  EXPECT_TRUE(stops.Escalate("job-a", "the ranks did not stop within 2m"));
  EXPECT_FALSE(stops.Escalate("job-a", "again"));  // once
  EXPECT_TRUE(stops.Late(clock.Now()).empty());    // escalated stops are not late again
  clock.Advance(absl::Seconds(30));
  EXPECT_EQ(stops.Late(clock.Now()), (std::vector<std::string>{"job-b"}));
  // Begin again resets the stop and its deadline.
  stops.Begin("job-a", clock.Now(), absl::Seconds(5));
  EXPECT_FALSE(stops.Find("job-a")->escalated);
  EXPECT_EQ(stops.Find("job-a")->deadline, clock.Now() + absl::Seconds(5));
  stops.Forget("job-b");
  EXPECT_FALSE(stops.Active("job-b"));
  EXPECT_EQ(stops.Find("job-b"), nullptr);
  EXPECT_FALSE(stops.Escalate("job-b", "gone"));
}

TEST(StopCoordinatorTest, RankEndsAndFinalMessages) {
  const absl::Time now = absl::FromUnixSeconds(100);
  StopCoordinator stops;
  // Graceful: rank 0 stopped after its final checkpoint at step 40.
  stops.Begin("job-g", now, absl::Minutes(1));
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-g", 1, v1::RANK_STATE_STOPPED, true, 0), "r1"),
            std::nullopt);
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-g", 0, v1::RANK_STATE_STOPPED, true, 40), "r0"),
            std::nullopt);
  EXPECT_EQ(stops.FinalMessage("job-g", 40),
            "cancelled by request; final checkpoint written at step 40");
  // Training finished before the stop took effect.
  stops.Begin("job-s", now, absl::Minutes(1));
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-s", 0, v1::RANK_STATE_SUCCEEDED, false, 50), "r0"),
            std::nullopt);
  EXPECT_EQ(stops.FinalMessage("job-s", 50),
            "cancelled by request, but training had finished first; final checkpoint at step 50");
  // A failed rank: the caller must escalate, with the rank's exit message as the reason.
  stops.Begin("job-f", now, absl::Minutes(1));
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-f", 1, v1::RANK_STATE_FAILED, false, 0),
                                "rank 1 on node n2 exited with code 1"),
            "rank 1 on node n2 exited with code 1");
  ASSERT_TRUE(stops.Escalate("job-f", "rank 1 on node n2 exited with code 1"));
  // Once escalated, further ends ask for nothing more.
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-f", 0, v1::RANK_STATE_STOPPED, false, 0), "r0"),
            std::nullopt);
  EXPECT_EQ(stops.FinalMessage("job-f", 30),
            "cancelled by request; the graceful stop was abandoned (rank 1 on node n2 exited "
            "with code 1) and the ranks were killed without a final checkpoint (newest "
            "checkpoint at step 30)");
  // Ranks gone without a word.
  stops.Begin("job-q", now, absl::Minutes(1));
  EXPECT_EQ(stops.FinalMessage("job-q", 0),
            "cancelled by request; the ranks ended without confirming a final checkpoint (no "
            "checkpoint written)");
  // A stopped rank that did not stop gracefully breaks the stop too.
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-q", 0, v1::RANK_STATE_STOPPED, false, 0), "why"),
            "why");
  EXPECT_EQ(stops.RecordRankEnd(Ended("job-none", 0, v1::RANK_STATE_FAILED, false, 0), "x"),
            std::nullopt);
  EXPECT_EQ(stops.FinalMessage("job-none", 0), "");
}

}  // namespace
}  // namespace loom
