#include "scheduler/job_events.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

loom::v1::JobEvent Event(const std::string& type, loom::v1::JobPhase phase, int64_t step) {
  loom::v1::JobEvent e;
  e.set_type(type);
  e.mutable_job()->set_id("job-1");
  e.mutable_job()->set_phase(phase);
  e.mutable_job()->mutable_progress()->set_step(step);
  return e;
}

google::protobuf::RepeatedPtrField<loom::v1::RankLogLine> Lines(int64_t first, int64_t last,
                                                                const std::string& prefix = "l") {
  google::protobuf::RepeatedPtrField<loom::v1::RankLogLine> out;
  for (int64_t s = first; s <= last; ++s) {
    loom::v1::RankLogLine* l = out.Add();
    l->set_sequence(s);
    l->set_text(prefix + std::to_string(s));
    l->set_stream("stderr");
  }
  return out;
}

std::vector<std::string> Texts(const std::vector<loom::v1::LogLine>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) out.push_back(l.text());
  return out;
}

TEST(WakeDispatcherTest, RunsCallbacksAndNeverAfterClose) {
  WakeDispatcher dispatcher;
  std::atomic<int> runs{0};
  absl::Notification ran;
  auto waker = std::make_shared<Waker>([&] {
    ++runs;
    ran.Notify();
  });
  dispatcher.Wake(waker);
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waker->Close();
  const int before = runs.load();
  dispatcher.Wake(waker);
  // The dispatcher runs its queue in order on one thread: once a fence queued after the closed
  // waker has run, the closed waker's turn has passed.
  absl::Notification fenced;
  dispatcher.Wake(std::make_shared<Waker>([&] { fenced.Notify(); }));
  ASSERT_TRUE(fenced.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(runs.load(), before);
  EXPECT_TRUE(waker->closed());
}

TEST(JobSubscriptionTest, ProgressCoalescesAndPhaseChangesAreKept) {
  WakeDispatcher dispatcher;
  std::atomic<int> wakes{0};
  auto waker = std::make_shared<Waker>([&] { ++wakes; });
  JobSubscription sub("job-1", waker, &dispatcher);
  sub.Push(Event("Snapshot", loom::v1::JOB_PHASE_RUNNING, 1));
  sub.Push(Event("Progress", loom::v1::JOB_PHASE_RUNNING, 2));
  sub.Push(Event("Progress", loom::v1::JOB_PHASE_RUNNING, 3));
  sub.Push(Event("Progress", loom::v1::JOB_PHASE_RUNNING, 4));
  sub.Push(Event("PhaseChanged", loom::v1::JOB_PHASE_STOPPING, 4));
  sub.Push(Event("Progress", loom::v1::JOB_PHASE_STOPPING, 5));
  sub.Push(Event("PhaseChanged", loom::v1::JOB_PHASE_CANCELLED, 5));
  EXPECT_TRUE(sub.ended());
  sub.Push(Event("Progress", loom::v1::JOB_PHASE_CANCELLED, 6));  // after the end: ignored

  std::vector<std::pair<std::string, int64_t>> got;
  loom::v1::JobEvent e;
  while (sub.Pop(&e)) got.emplace_back(e.type(), e.job().progress().step());
  // The three progress events collapse into the newest, which the phase change then supersedes.
  std::vector<std::pair<std::string, int64_t>> want = {
      {"Snapshot", 1}, {"PhaseChanged", 4}, {"PhaseChanged", 5}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(sub.dropped(), 0);
  sub.Cancel();
}

TEST(JobSubscriptionTest, QueueIsBoundedDroppingTheOldest) {
  WakeDispatcher dispatcher;
  auto waker = std::make_shared<Waker>([] {});
  JobSubscription sub("job-1", waker, &dispatcher);
  const int n = static_cast<int>(kMaxQueuedJobEvents) + 10;
  for (int i = 0; i < n; ++i) {
    // Alternate phases so that nothing coalesces.
    sub.Push(Event("PhaseChanged",
                   i % 2 ? loom::v1::JOB_PHASE_RUNNING : loom::v1::JOB_PHASE_RECOVERING, i));
  }
  EXPECT_EQ(sub.dropped(), 10);
  loom::v1::JobEvent e;
  ASSERT_TRUE(sub.Pop(&e));
  EXPECT_EQ(e.job().progress().step(), 10);  // the 10 oldest went
  int rest = 1;
  while (sub.Pop(&e)) ++rest;
  EXPECT_EQ(rest, static_cast<int>(kMaxQueuedJobEvents));
  EXPECT_EQ(e.job().progress().step(), n - 1);
  sub.Cancel();
}

TEST(JobLogBufferTest, DeduplicatesBySequencePerAttemptAndRank) {
  WakeDispatcher dispatcher;
  JobLogBuffer logs(&dispatcher);
  EXPECT_EQ(logs.Append("job-1", 1, 0, Lines(1, 3)), 3);
  EXPECT_EQ(logs.Append("job-1", 1, 0, Lines(2, 5)), 2);  // a retried heartbeat: 2, 3 again
  EXPECT_EQ(logs.Append("job-1", 1, 1, Lines(1, 2)), 2);  // another rank numbers from 1
  EXPECT_EQ(logs.Append("job-1", 2, 0, Lines(1, 1)), 1);  // a new attempt too
  EXPECT_EQ(logs.LineCount("job-1"), 8u);
  LogCursor cursor;
  auto all = logs.Read("job-1", {}, 0, 100, &cursor);
  ASSERT_EQ(all.size(), 8u);
  EXPECT_EQ(all[3].text(), "l4");
  EXPECT_EQ(all[3].sequence(), 4);
  EXPECT_EQ(all[3].attempt(), 1);
  EXPECT_EQ(all[7].attempt(), 2);
  EXPECT_EQ(all[7].stream(), "stderr");
}

TEST(JobLogBufferTest, TailRankFilterAndFollowCursor) {
  WakeDispatcher dispatcher;
  JobLogBuffer logs(&dispatcher);
  logs.Append("job-1", 1, 0, Lines(1, 4, "a"));
  logs.Append("job-1", 1, 1, Lines(1, 4, "b"));
  LogCursor cursor;
  bool more = true;
  EXPECT_EQ(Texts(logs.Read("job-1", {1}, 2, 100, &cursor, &more)),
            (std::vector<std::string>{"b3", "b4"}));
  EXPECT_FALSE(more);
  // Nothing new for the follower, then only new lines of its rank.
  EXPECT_TRUE(logs.Read("job-1", {1}, 0, 100, &cursor).empty());
  logs.Append("job-1", 1, 0, Lines(5, 5, "a"));
  logs.Append("job-1", 1, 1, Lines(5, 6, "b"));
  EXPECT_EQ(Texts(logs.Read("job-1", {1}, 0, 100, &cursor)),
            (std::vector<std::string>{"b5", "b6"}));
  // Batches: max_lines at a time, `more` says so.
  LogCursor from_start;
  EXPECT_EQ(logs.Read("job-1", {}, 0, 4, &from_start, &more).size(), 4u);
  EXPECT_TRUE(more);
  EXPECT_EQ(Texts(logs.Read("job-1", {}, 0, 100, &from_start)),
            (std::vector<std::string>{"b1", "b2", "b3", "b4", "a5", "b5", "b6"}));
  EXPECT_TRUE(logs.Read("job-unknown", {}, 0, 100, &from_start).empty());
}

TEST(JobLogBufferTest, LinesPerJobAreBoundedAndFollowersAreWoken) {
  WakeDispatcher dispatcher;
  JobLogBuffer logs(&dispatcher);
  std::atomic<int> wakes{0};
  auto waker = std::make_shared<Waker>([&] { ++wakes; });
  logs.Follow("job-1", waker);
  logs.Append("job-1", 1, 0, Lines(1, kMaxLogLinesPerJob + 5));
  EXPECT_EQ(logs.LineCount("job-1"), kMaxLogLinesPerJob);
  LogCursor cursor;
  auto first = logs.Read("job-1", {}, 0, 1, &cursor);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].sequence(), 6);  // the 5 oldest were dropped
  EXPECT_FALSE(logs.Ended("job-1"));
  logs.MarkEnded("job-1");
  EXPECT_TRUE(logs.Ended("job-1"));
  for (int i = 0; i < 200 && wakes.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(wakes.load(), 1);
  logs.Unfollow("job-1", waker);
  waker->Close();
}

TEST(JobLogBufferTest, TotalTextIsBounded) {
  WakeDispatcher dispatcher;
  JobLogBuffer logs(&dispatcher);
  // Lines of kMaxLogLineBytes: each job holds at most kMaxLogBytesPerJob of them.
  google::protobuf::RepeatedPtrField<loom::v1::RankLogLine> big;
  const size_t per_job = kMaxLogBytesPerJob / kMaxLogLineBytes;
  for (size_t s = 1; s <= per_job; ++s) {
    loom::v1::RankLogLine* l = big.Add();
    l->set_sequence(static_cast<int64_t>(s));
    l->set_text(std::string(kMaxLogLineBytes, 'x'));
  }
  const size_t jobs_that_fit = kMaxLogBytesTotal / kMaxLogBytesPerJob;
  ASSERT_LT(jobs_that_fit, kMaxJobsWithLogs);  // the byte total, not the job count, bounds here
  for (size_t j = 0; j <= jobs_that_fit; ++j) logs.Append("job-" + std::to_string(j), 1, 0, big);
  EXPECT_EQ(logs.LineCount("job-0"), 0u);  // evicted to stay within kMaxLogBytesTotal
  EXPECT_EQ(logs.LineCount("job-1"), per_job);
  EXPECT_EQ(logs.LineCount("job-" + std::to_string(jobs_that_fit)), per_job);
}

TEST(JobLogBufferTest, NumberOfJobsIsBounded) {
  WakeDispatcher dispatcher;
  JobLogBuffer logs(&dispatcher);
  for (size_t j = 0; j <= kMaxJobsWithLogs; ++j) {
    logs.Append("job-" + std::to_string(j), 1, 0, Lines(1, 1));
  }
  EXPECT_EQ(logs.LineCount("job-0"), 0u);  // least recently used: evicted
  EXPECT_EQ(logs.LineCount("job-1"), 1u);
  EXPECT_EQ(logs.LineCount("job-" + std::to_string(kMaxJobsWithLogs)), 1u);
}

// A followed job's logs are never evicted: its follower's cursor keeps its meaning and its end
// mark stays, so a follow stream cannot skip lines or miss the end (regression: eviction used
// to drop a followed job, whose stream then waited forever).
TEST(JobLogBufferTest, FollowedJobsAreNotEvicted) {
  WakeDispatcher dispatcher;
  JobLogBuffer logs(&dispatcher);
  auto waker = std::make_shared<Waker>([] {});
  logs.Append("job-0", 1, 0, Lines(1, 3));
  logs.Follow("job-0", waker);
  logs.MarkEnded("job-0");
  for (size_t j = 1; j <= kMaxJobsWithLogs; ++j) {
    logs.Append("job-" + std::to_string(j), 1, 0, Lines(1, 1));
  }
  EXPECT_EQ(logs.LineCount("job-0"), 3u);  // least recently used, but followed: kept
  EXPECT_TRUE(logs.Ended("job-0"));
  EXPECT_EQ(logs.LineCount("job-1"), 0u);  // the next least recently used went instead
  EXPECT_EQ(logs.LineCount("job-2"), 1u);
  logs.Unfollow("job-0", waker);
  waker->Close();
}

}  // namespace
}  // namespace loom
