// JobRepository on a real SqliteJobStore (a file under TEST_TMPDIR): batches, durability before
// the acknowledgement, failed batches, shutdown, and recovery of every acknowledged job after
// the repository and its store are gone. A GatedStore passes every call to the real store but
// can hold CreateJobs at a gate, so a test can queue submissions behind an in-flight batch
// without sleeping.
#include "scheduler/job_repository.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/sqlite_job_store.h"

namespace loom {
namespace {

std::string DbPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, ".db");
}

JobRecord Job(int64_t sequence, const std::string& request_id = "") {
  JobRecord job;
  job.id = absl::StrFormat("job-%08x", static_cast<uint32_t>(sequence));
  job.sequence = sequence;
  job.phase = v1::JOB_PHASE_PENDING;
  job.create_time = absl::FromUnixSeconds(1700000000 + sequence);
  job.request_id = request_id;
  job.spec.set_name(absl::StrCat("job ", sequence));
  return job;
}

// The real store, with CreateJobs optionally held until Release().
class GatedStore : public JobStore {
 public:
  explicit GatedStore(JobStore* real) : real_(real) {}
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    closed_ = false;
  }
  // Waits until a CreateJobs call is held at the closed gate (deadline 30 s).
  bool AwaitHeld() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&held_), absl::Seconds(30));
  }
  absl::Status CreateJobs(const std::vector<JobRecord>& jobs) override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        held_ = true;
        mu_.Await(absl::Condition(+[](bool* closed) { return !*closed; }, &closed_));
        held_ = false;
      }
    }
    return real_->CreateJobs(jobs);
  }
  absl::Status CreateJob(const JobRecord& job) override { return real_->CreateJob(job); }
  absl::Status UpdateJob(const JobRecord& job) override { return real_->UpdateJob(job); }
  absl::Status UpdateJobs(const std::vector<JobRecord>& jobs) override {
    return real_->UpdateJobs(jobs);
  }
  absl::StatusOr<JobRecord> GetJob(const std::string& id) override { return real_->GetJob(id); }
  absl::StatusOr<std::vector<JobRecord>> ListJobs(v1::JobPhase phase) override {
    return real_->ListJobs(phase);
  }
  absl::Status UpsertNode(const NodeRecord& node) override { return real_->UpsertNode(node); }
  absl::StatusOr<NodeRecord> GetNode(const std::string& id) override { return real_->GetNode(id); }
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() override { return real_->ListNodes(); }
  absl::Status WriteMetrics(const std::vector<MetricRow>& rows) override {
    return real_->WriteMetrics(rows);
  }
  absl::StatusOr<std::vector<MetricRow>> ListMetrics(const std::string& job_id, int64_t after,
                                                     int limit) override {
    return real_->ListMetrics(job_id, after, limit);
  }

 private:
  JobStore* const real_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(JobRepositoryTest, SubmissionsQueuedBehindABatchShareOneTransaction) {
  auto store = SqliteJobStore::Open(DbPath("share"));
  ASSERT_TRUE(store.ok()) << store.status();
  GatedStore gated(store->get());
  std::atomic<int> adopted{0};
  std::vector<size_t> batch_sizes;
  JobRepository repo(&gated, [&](const std::vector<JobRecord>& batch, const absl::Status& s) {
    EXPECT_TRUE(s.ok()) << s;
    batch_sizes.push_back(batch.size());  // only the commit thread touches it
    adopted += static_cast<int>(batch.size());
  });
  gated.Close();
  std::atomic<int> acked{0};
  repo.Submit(Job(1), [&](const JobRecord&, const absl::Status& s) {
    EXPECT_TRUE(s.ok()) << s;
    ++acked;
  });
  ASSERT_TRUE(gated.AwaitHeld());  // batch {1} is being written
  for (int i = 2; i <= 50; ++i) {
    repo.Submit(Job(i), [&](const JobRecord&, const absl::Status& s) {
      EXPECT_TRUE(s.ok()) << s;
      ++acked;
    });
  }
  EXPECT_EQ(acked.load(), 0);  // nothing acknowledged before its batch committed
  gated.Release();
  {
    JobRecord last = Job(51);
    EXPECT_TRUE(repo.SubmitAndWait(last).ok());
  }
  // {1}, then the 49 queued behind it in one transaction (51 may or may not have joined them).
  EXPECT_EQ(acked.load(), 50);
  EXPECT_EQ(adopted.load(), 51);
  ASSERT_GE(batch_sizes.size(), 2u);
  EXPECT_EQ(batch_sizes[0], 1u);
  EXPECT_GE(batch_sizes[1], 49u);
  const JobRepository::Stats stats = repo.stats();
  EXPECT_EQ(stats.jobs, 51);
  EXPECT_LE(stats.batches, 3);
  EXPECT_GE(stats.largest_batch, 49);
  EXPECT_EQ(stats.failed_batches, 0);
}

TEST(JobRepositoryTest, AcknowledgedJobIsAlreadyOnDiskForASecondConnection) {
  const std::string path = DbPath("durable");
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto reader = SqliteJobStore::Open(path);  // another connection to the same file
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::atomic<bool> listener_saw_it{false};
  JobRepository repo(store->get(), [&](const std::vector<JobRecord>& batch, const absl::Status&) {
    for (const JobRecord& job : batch) {
      if ((*reader)->GetJob(job.id).ok()) listener_saw_it = true;
    }
  });
  std::vector<std::thread> clients;
  std::atomic<int> checked{0};
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const int64_t seq = t * 100 + i + 1;
        absl::Notification done;
        repo.Submit(Job(seq), [&](const JobRecord& job, const absl::Status& s) {
          EXPECT_TRUE(s.ok()) << s;
          absl::StatusOr<JobRecord> read = (*reader)->GetJob(job.id);
          EXPECT_TRUE(read.ok()) << job.id << ": " << read.status();
          if (read.ok()) {
            EXPECT_EQ(read->spec.name(), job.spec.name());
            ++checked;
          }
          done.Notify();
        });
        done.WaitForNotification();
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(checked.load(), 160);
  EXPECT_TRUE(listener_saw_it.load());
}

TEST(JobRepositoryTest, AFailedBatchFailsEverySubmissionInItAndStoresNone) {
  auto store = SqliteJobStore::Open(DbPath("failed"));
  ASSERT_TRUE(store.ok()) << store.status();
  GatedStore gated(store->get());
  absl::Status listener_status;
  JobRepository repo(&gated, [&](const std::vector<JobRecord>& batch, const absl::Status& s) {
    if (batch.size() > 1) listener_status = s;
  });
  ASSERT_TRUE(repo.SubmitAndWait(Job(1, "req-1")).ok());
  gated.Close();
  repo.Submit(Job(2), [](const JobRecord&, const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; });
  ASSERT_TRUE(gated.AwaitHeld());
  // Next batch: a fresh job and one reusing request id "req-1": the transaction fails.
  std::vector<absl::Status> answers(2);
  absl::Notification both;
  std::atomic<int> n{0};
  repo.Submit(Job(3), [&](const JobRecord&, const absl::Status& s) {
    answers[0] = s;
    if (++n == 2) both.Notify();
  });
  repo.Submit(Job(4, "req-1"), [&](const JobRecord&, const absl::Status& s) {
    answers[1] = s;
    if (++n == 2) both.Notify();
  });
  gated.Release();
  ASSERT_TRUE(both.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsAlreadyExists(answers[0])) << answers[0];
  EXPECT_TRUE(absl::IsAlreadyExists(answers[1])) << answers[1];
  EXPECT_TRUE(absl::IsAlreadyExists(listener_status)) << listener_status;
  EXPECT_TRUE(absl::IsNotFound((*store)->GetJob(Job(3).id).status()));  // all or none
  EXPECT_TRUE((*store)->GetJob(Job(2).id).ok());
  EXPECT_EQ(repo.stats().failed_batches, 1);
}

TEST(JobRepositoryTest, EveryAcknowledgedJobSurvivesTheRepositoryAndItsStore) {
  const std::string path = DbPath("restart");
  std::set<std::string> acknowledged;
  absl::Mutex ack_mu;
  {
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobRepository repo(store->get(), nullptr);
    std::vector<std::thread> clients;
    for (int t = 0; t < 8; ++t) {
      clients.emplace_back([&, t] {
        for (int i = 0; i < 25; ++i) {
          JobRecord job = Job(t * 1000 + i + 1);
          const std::string id = job.id;
          if (repo.SubmitAndWait(std::move(job)).ok()) {
            absl::MutexLock lock(&ack_mu);
            acknowledged.insert(id);
          }
        }
      });
    }
    for (auto& c : clients) c.join();
    // Queued but not waited for: the destructor still commits it.
    repo.Submit(Job(99999), nullptr);
  }
  auto reopened = SqliteJobStore::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<std::vector<JobRecord>> all = (*reopened)->ListJobs(v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(all.ok()) << all.status();
  std::set<std::string> stored;
  for (const JobRecord& job : *all) stored.insert(job.id);
  EXPECT_EQ(acknowledged.size(), 200u);
  for (const std::string& id : acknowledged) EXPECT_EQ(stored.count(id), 1u) << id;
  EXPECT_EQ(stored.count(Job(99999).id), 1u);
}

TEST(JobRepositoryTest, MaxBatchBoundsATransaction) {
  auto store = SqliteJobStore::Open(DbPath("max_batch"));
  ASSERT_TRUE(store.ok()) << store.status();
  GatedStore gated(store->get());
  JobRepository repo(&gated, nullptr, /*max_batch=*/4);
  gated.Close();
  repo.Submit(Job(1), nullptr);
  ASSERT_TRUE(gated.AwaitHeld());
  for (int i = 2; i <= 10; ++i) repo.Submit(Job(i), nullptr);
  gated.Release();
  EXPECT_TRUE(repo.SubmitAndWait(Job(11)).ok());
  EXPECT_EQ(repo.stats().largest_batch, 4);
  EXPECT_EQ(repo.stats().jobs, 11);
}

// "Joining a batch": a submission announced before the batch's commit starts (as the scheduler
// announces one before validating its spec) shares that batch's transaction. Job 1 is queued
// from batch 0's acknowledgement, on the commit thread itself, while job 2's submitter has
// announced it but is still preparing it: the commit thread's next decision sees job 1 alone and
// an announcement outstanding, and waits for job 2 instead of writing job 1 alone (which it
// does, without the join wait, before the test thread even wakes up).
TEST(JobRepositoryTest, AnAnnouncedSubmissionJoinsTheBatchBeingCommitted) {
  auto store = SqliteJobStore::Open(DbPath("join"));
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<size_t> batch_sizes;
  JobRepository repo(
      store->get(),
      [&](const std::vector<JobRecord>& batch, const absl::Status&) {
        batch_sizes.push_back(batch.size());  // only the commit thread touches it
      },
      4096, /*join_wait=*/absl::Seconds(30));
  absl::Notification announced, joined;
  repo.Submit(Job(0), [&](const JobRecord&, const absl::Status& s) {
    EXPECT_TRUE(s.ok()) << s;
    repo.StartPreparing();  // job 2's submitter begins validating
    repo.Submit(Job(1), [&](const JobRecord&, const absl::Status& s1) {
      EXPECT_TRUE(s1.ok()) << s1;
      joined.Notify();
    });
    announced.Notify();
  });
  announced.WaitForNotification();
  repo.Submit(Job(2), nullptr);
  repo.FinishPreparing();
  joined.WaitForNotification();
  ASSERT_EQ(batch_sizes.size(), 2u);
  EXPECT_EQ(batch_sizes[0], 1u);
  EXPECT_EQ(batch_sizes[1], 2u);  // {1, 2}
  EXPECT_EQ(repo.stats().join_timeouts, 0);
  // Nothing announced: the next submission is written at once, without a join wait.
  const int64_t waits = repo.stats().join_waits;
  EXPECT_TRUE(repo.SubmitAndWait(Job(3)).ok());
  EXPECT_EQ(repo.stats().join_waits, waits);
  EXPECT_EQ(repo.stats().batches, 3);
}

// An announcement that is never finished (a submitter stuck in validation) delays a batch by at
// most join_wait; the batch is written and acknowledged, and the timeout is counted.
TEST(JobRepositoryTest, AStuckAnnouncementDelaysABatchOnlyByTheJoinWait) {
  auto store = SqliteJobStore::Open(DbPath("join_timeout"));
  ASSERT_TRUE(store.ok()) << store.status();
  JobRepository repo(store->get(), nullptr, 4096, /*join_wait=*/absl::Milliseconds(20));
  repo.StartPreparing();
  EXPECT_TRUE(repo.SubmitAndWait(Job(1)).ok());
  EXPECT_EQ(repo.stats().join_waits, 1);
  EXPECT_EQ(repo.stats().join_timeouts, 1);
  EXPECT_TRUE((*store)->GetJob(Job(1).id).ok());
  repo.FinishPreparing();
  // A zero join_wait never waits, announced or not.
  JobRepository eager(store->get(), nullptr, 4096, absl::ZeroDuration());
  eager.StartPreparing();
  EXPECT_TRUE(eager.SubmitAndWait(Job(2)).ok());
  EXPECT_EQ(eager.stats().join_waits, 0);
  eager.FinishPreparing();
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// A cycle or heartbeat stores its changes after releasing the scheduler's lock, so an older copy
// of a job may reach the store after a newer one: the newer must stay.
TEST(JobRepositoryTest, VersionedUpdateNeverReplacesANewerStateWithAnOlderOne) {
  auto store = SqliteJobStore::Open(DbPath("versioned"));
  ASSERT_TRUE(store.ok()) << store.status();
  JobRepository repo(store->get(), nullptr);
  ASSERT_TRUE(repo.SubmitAndWait(Job(1)).ok());
  JobRecord older = Job(1);
  older.phase = v1::JOB_PHASE_RUNNING;
  older.progress.set_step(10);
  JobRecord newer = older;
  newer.phase = v1::JOB_PHASE_SUCCEEDED;
  newer.progress.set_step(20);
  // The newer state (version 2) lands first, the older copy (version 1) late.
  ASSERT_TRUE(repo.UpdateJobsVersioned({newer}, {2}).ok());
  ASSERT_TRUE(repo.UpdateJobsVersioned({older}, {1}).ok());
  absl::StatusOr<JobRecord> read = (*store)->GetJob(older.id);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->phase, v1::JOB_PHASE_SUCCEEDED);
  EXPECT_EQ(read->progress.step(), 20);
  // A later version is written, also in a batch with a job seen for the first time.
  ASSERT_TRUE(repo.SubmitAndWait(Job(2)).ok());
  JobRecord later = newer;
  later.progress.set_step(21);
  JobRecord second = Job(2);
  second.phase = v1::JOB_PHASE_CANCELLED;
  ASSERT_TRUE(repo.UpdateJobsVersioned({later, second}, {3, 1}).ok());
  read = (*store)->GetJob(later.id);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->progress.step(), 21);
  read = (*store)->GetJob(second.id);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->phase, v1::JOB_PHASE_CANCELLED);
  EXPECT_TRUE(absl::IsInvalidArgument(repo.UpdateJobsVersioned({later}, {})));
}

}  // namespace
}  // namespace loom
