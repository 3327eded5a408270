// JobWatchers: what a new subscription holds, which events reach whom, and when streams end.
#include "scheduler/job_watchers.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

JobRecord Job(const std::string& id, v1::JobPhase phase) {
  JobRecord job;
  job.id = id;
  job.sequence = 1;
  job.phase = phase;
  job.attempt = 1;
  job.spec.set_name("tiny");
  return job;
}

std::vector<v1::JobEvent> Drain(JobSubscription& sub) {
  std::vector<v1::JobEvent> out;
  v1::JobEvent e;
  while (sub.Pop(&e)) out.push_back(e);
  return out;
}

void AddHistory(JobRecord* job, v1::JobPhase phase, const std::string& reason, int64_t time_us) {
  internal::JobHistoryEntry* h = job->state.add_history();
  h->set_phase(phase);
  h->set_reason(reason);
  h->set_attempt(1);
  h->set_time_us(time_us);
}

TEST(JobWatchersTest, ARunningJobsSubscriptionStartsWithItsSnapshotThenGetsChangesWithoutSpec) {
  WakeDispatcher dispatcher;
  JobWatchers watchers(&dispatcher);
  JobRecord job = Job("job-a", v1::JOB_PHASE_RUNNING);
  auto sub = watchers.Subscribe(job, absl::FromUnixSeconds(100), [] {});
  auto other = watchers.Subscribe(Job("job-b", v1::JOB_PHASE_RUNNING), absl::FromUnixSeconds(100),
                                  [] {});

  std::vector<v1::JobEvent> events = Drain(*sub);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type(), "Snapshot");
  EXPECT_EQ(events[0].job().spec().name(), "tiny");  // the Snapshot carries the spec
  EXPECT_EQ(events[0].time().seconds(), 100);

  job.reason = "Moved";
  watchers.Publish(job, "ReasonChanged", absl::FromUnixSeconds(105));
  events = Drain(*sub);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type(), "ReasonChanged");
  EXPECT_EQ(events[0].job().reason(), "Moved");
  EXPECT_FALSE(events[0].job().has_spec());  // never changes: only in the Snapshot
  EXPECT_EQ(events[0].time().seconds(), 105);
  EXPECT_EQ(Drain(*other).size(), 1u);  // job-b's subscriber got its Snapshot, not job-a's event

  // A terminal phase ends the job's streams and forgets them: nothing after it.
  job.phase = v1::JOB_PHASE_SUCCEEDED;
  watchers.Publish(job, "PhaseChanged", absl::FromUnixSeconds(110));
  EXPECT_TRUE(sub->ended());
  EXPECT_EQ(Drain(*sub).size(), 1u);
  watchers.Publish(job, "Progress", absl::FromUnixSeconds(111));
  EXPECT_TRUE(Drain(*sub).empty());
  EXPECT_EQ(watchers.TakeAll().size(), 1u);  // job-b's only
}

TEST(JobWatchersTest, AnEndedJobReplaysItsHistoryBeforeTheSnapshotAndIsNotKept) {
  WakeDispatcher dispatcher;
  JobWatchers watchers(&dispatcher);
  JobRecord job = Job("job-a", v1::JOB_PHASE_FAILED);
  AddHistory(&job, v1::JOB_PHASE_PENDING, "Queued", 1'000'000);
  AddHistory(&job, v1::JOB_PHASE_RECOVERING, "RankFailed", 2'000'000);
  AddHistory(&job, v1::JOB_PHASE_FAILED, "RankFailed", 3'000'000);
  auto sub = watchers.Subscribe(job, absl::FromUnixSeconds(9), [] {});
  std::vector<v1::JobEvent> events = Drain(*sub);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].type(), "History");
  EXPECT_EQ(events[0].job().phase(), v1::JOB_PHASE_PENDING);
  EXPECT_EQ(events[0].time().seconds(), 1);
  EXPECT_EQ(events[1].job().phase(), v1::JOB_PHASE_RECOVERING);
  EXPECT_EQ(events[1].job().reason(), "RankFailed");
  EXPECT_FALSE(events[1].job().has_spec());
  EXPECT_EQ(events[2].time().seconds(), 3);
  EXPECT_EQ(events[3].type(), "Snapshot");
  EXPECT_EQ(events[3].time().seconds(), 9);
  EXPECT_TRUE(sub->ended());
  EXPECT_TRUE(watchers.TakeAll().empty());  // an ended job's subscription is not kept
}

TEST(JobWatchersTest, RemoveForgetsOnlyThatSubscription) {
  WakeDispatcher dispatcher;
  JobWatchers watchers(&dispatcher);
  JobRecord job = Job("job-a", v1::JOB_PHASE_RUNNING);
  auto first = watchers.Subscribe(job, absl::FromUnixSeconds(1), [] {});
  auto second = watchers.Subscribe(job, absl::FromUnixSeconds(1), [] {});
  Drain(*first);
  Drain(*second);
  watchers.Remove(first);
  watchers.Publish(job, "Progress", absl::FromUnixSeconds(2));
  EXPECT_TRUE(Drain(*first).empty());
  EXPECT_EQ(Drain(*second).size(), 1u);
  std::vector<std::shared_ptr<JobSubscription>> left = watchers.TakeAll();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0], second);
}

}  // namespace
}  // namespace loom
