// JobTable: the indexes and counts follow every Add and Replace, and Clear keeps what was handed
// to submissions still being committed. Expected values are written out by hand.
#include "scheduler/job_table.h"

#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

using v1::JobPhase;

JobRecord Job(const std::string& id, int64_t sequence, JobPhase phase, int32_t attempt,
              const std::string& tenant = "default", const std::string& queue = "") {
  JobRecord job;
  job.id = id;
  job.sequence = sequence;
  job.phase = phase;
  job.attempt = attempt;
  job.tenant = tenant;
  job.spec.set_queue(queue);
  return job;
}

std::vector<std::string> Keys(const std::map<std::string, JobRecord*>& m) {
  std::vector<std::string> out;
  for (const auto& [id, unused] : m) out.push_back(id);
  return out;
}

std::vector<std::string> Keys(const std::map<std::string, JobTable::WaitingEntry>& m) {
  std::vector<std::string> out;
  for (const auto& [id, unused] : m) out.push_back(id);
  return out;
}

TEST(JobTableTest, AddIndexesOrderRequestsAndCounts) {
  JobTable table;
  JobRecord b = Job("job-b", 7, v1::JOB_PHASE_RUNNING, 1, "alice", "research");
  b.request_id = "req-1";
  table.Add(b);
  table.Add(Job("job-a", 3, v1::JOB_PHASE_PENDING, 0, "alice"));
  table.Add(Job("job-c", 9, v1::JOB_PHASE_SUCCEEDED, 1, "bob"));

  EXPECT_EQ(table.size(), 3u);
  std::vector<std::string> order;
  for (const auto& [seq, id] : table.order()) order.push_back(id);
  EXPECT_EQ(order, (std::vector<std::string>{"job-a", "job-b", "job-c"}));  // by sequence
  ASSERT_NE(table.FindByRequest("req-1"), nullptr);
  EXPECT_EQ(table.FindByRequest("req-1")->id, "job-b");
  EXPECT_EQ(table.FindByRequest("req-2"), nullptr);
  EXPECT_EQ(table.FindByRequest(""), nullptr);

  // Active: placed and not ended. Waiting: PENDING or RECOVERING.
  EXPECT_EQ(Keys(table.active()), (std::vector<std::string>{"job-b"}));
  EXPECT_EQ(Keys(table.waiting()), (std::vector<std::string>{"job-a"}));
  EXPECT_EQ(table.waiting().at("job-a").record, &table.at("job-a"));

  EXPECT_EQ(table.phase_counts().at(v1::JOB_PHASE_PENDING), 1);
  EXPECT_EQ(table.phase_counts().at(v1::JOB_PHASE_RUNNING), 1);
  EXPECT_EQ(table.phase_counts().at(v1::JOB_PHASE_SUCCEEDED), 1);
  const JobTable::TenantCounts want = {
      {{"alice", "default", v1::JOB_PHASE_PENDING}, 1},
      {{"alice", "research", v1::JOB_PHASE_RUNNING}, 1},
      {{"bob", "default", v1::JOB_PHASE_SUCCEEDED}, 1},
  };
  EXPECT_EQ(table.tenant_counts(), want);
  EXPECT_EQ(table.UnfinishedJobs("alice"), 2);
  EXPECT_EQ(table.UnfinishedJobs("bob"), 0);
  EXPECT_EQ(table.UnfinishedJobs("carol"), 0);
}

TEST(JobTableTest, ReplaceMovesCountsAndIndexesThroughALife) {
  JobTable table;
  table.Add(Job("job-a", 1, v1::JOB_PHASE_PENDING, 0));
  const uint64_t changes = table.phase_changes();

  // Placed: active, no longer waiting.
  table.Replace(Job("job-a", 1, v1::JOB_PHASE_STARTING, 1));
  EXPECT_EQ(Keys(table.active()), (std::vector<std::string>{"job-a"}));
  EXPECT_TRUE(table.waiting().empty());
  EXPECT_EQ(table.phase_counts().at(v1::JOB_PHASE_PENDING), 0);
  EXPECT_EQ(table.phase_counts().at(v1::JOB_PHASE_STARTING), 1);
  EXPECT_GT(table.phase_changes(), changes);

  // A failed attempt with restarts left: active (its old ranks are tracked) and waiting.
  table.Replace(Job("job-a", 1, v1::JOB_PHASE_RECOVERING, 1));
  EXPECT_EQ(Keys(table.active()), (std::vector<std::string>{"job-a"}));
  EXPECT_EQ(Keys(table.waiting()), (std::vector<std::string>{"job-a"}));
  EXPECT_EQ(table.waiting().at("job-a").keys.attempt, 1);

  // Requeued (preempted) after a placement: PENDING with attempt 1 stays active.
  table.Replace(Job("job-a", 1, v1::JOB_PHASE_PENDING, 1));
  EXPECT_EQ(Keys(table.active()), (std::vector<std::string>{"job-a"}));
  EXPECT_EQ(Keys(table.waiting()), (std::vector<std::string>{"job-a"}));

  // A change that keeps the phase moves no count.
  const uint64_t before_progress = table.phase_changes();
  JobRecord same = Job("job-a", 1, v1::JOB_PHASE_PENDING, 1);
  same.message = "still waiting";
  table.Replace(same);
  EXPECT_EQ(table.phase_changes(), before_progress);
  EXPECT_EQ(table.at("job-a").message, "still waiting");

  table.Replace(Job("job-a", 1, v1::JOB_PHASE_FAILED, 1));
  EXPECT_TRUE(table.active().empty());
  EXPECT_TRUE(table.waiting().empty());
  EXPECT_EQ(table.phase_counts().at(v1::JOB_PHASE_FAILED), 1);
  int total = 0;
  for (const auto& [phase, n] : table.phase_counts()) total += n;
  EXPECT_EQ(total, 1);  // one job, counted once
  EXPECT_EQ(table.UnfinishedJobs("default"), 0);
}

TEST(JobTableTest, SubmissionsInFlightReserveIdsRequestsSequencesAndTenantCounts) {
  JobTable table;
  table.Add(Job("job-a", 41, v1::JOB_PHASE_RUNNING, 1, "alice"));
  // The next sequence follows the highest loaded one.
  EXPECT_EQ(table.BeginSubmission("job-new", "req-9", "alice"), 42);
  EXPECT_TRUE(table.IdTaken("job-new"));
  EXPECT_TRUE(table.IdTaken("job-a"));
  EXPECT_FALSE(table.IdTaken("job-other"));
  EXPECT_TRUE(table.RequestInFlight("req-9"));
  EXPECT_EQ(table.UnfinishedJobs("alice"), 2);  // one running, one being committed

  // A reload after a failed write keeps what submissions in flight were handed.
  table.Clear();
  EXPECT_EQ(table.size(), 0u);
  EXPECT_TRUE(table.active().empty());
  EXPECT_TRUE(table.phase_counts().empty());
  EXPECT_TRUE(table.IdTaken("job-new"));
  EXPECT_TRUE(table.RequestInFlight("req-9"));
  EXPECT_EQ(table.UnfinishedJobs("alice"), 1);
  EXPECT_EQ(table.BeginSubmission("job-next", "", "bob"), 43);

  // Committed: in the table, no longer in flight; the id stays taken.
  JobRecord committed = Job("job-new", 42, v1::JOB_PHASE_PENDING, 0, "alice");
  committed.request_id = "req-9";
  table.Add(committed);
  table.EndSubmission(committed);
  EXPECT_TRUE(table.IdTaken("job-new"));
  EXPECT_FALSE(table.RequestInFlight("req-9"));
  EXPECT_EQ(table.FindByRequest("req-9")->id, "job-new");
  EXPECT_EQ(table.UnfinishedJobs("alice"), 1);

  // A failed commit: released, nothing added.
  table.EndSubmission(Job("job-next", 43, v1::JOB_PHASE_PENDING, 0, "bob"));
  EXPECT_FALSE(table.IdTaken("job-next"));
  EXPECT_EQ(table.UnfinishedJobs("bob"), 0);
}

}  // namespace
}  // namespace loom
