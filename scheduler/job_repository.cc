#include "scheduler/job_repository.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace loom {

JobRepository::JobRepository(JobStore* store, BatchListener on_batch, int max_batch,
                             absl::Duration join_wait)
    : store_(store),
      on_batch_(std::move(on_batch)),
      max_batch_(static_cast<size_t>(std::max(1, max_batch))),
      join_wait_(std::max(join_wait, absl::ZeroDuration())) {
  commit_thread_ = std::thread([this] { CommitLoop(); });
}

JobRepository::~JobRepository() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  commit_thread_.join();
}

void JobRepository::Submit(JobRecord job, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      queue_.push_back(Pending{std::move(job), std::move(done)});
      return;
    }
  }
  if (done) done(job, absl::FailedPreconditionError("the job repository is shutting down"));
}

void JobRepository::StartPreparing() {
  absl::MutexLock lock(&mu_);
  ++preparing_started_;
}

void JobRepository::FinishPreparing() {
  absl::MutexLock lock(&mu_);
  ++preparing_finished_;
}

bool JobRepository::JoinedOrFull() const {
  return preparing_finished_ >= join_target_ || stop_ || queue_.size() >= max_batch_;
}

absl::Status JobRepository::SubmitAndWait(JobRecord job) {
  absl::Notification acknowledged;
  absl::Status result;
  Submit(std::move(job), [&](const JobRecord&, const absl::Status& status) {
    result = status;
    acknowledged.Notify();
  });
  acknowledged.WaitForNotification();
  return result;
}

void JobRepository::CommitLoop() {
  while (true) {
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](JobRepository* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return r->stop_ || !r->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, nothing left to commit
      // Let the submissions announced by now join this batch ("Joining a batch").
      join_target_ = preparing_started_;
      if (join_wait_ > absl::ZeroDuration() && !JoinedOrFull()) {
        ++stats_.join_waits;
        if (!mu_.AwaitWithTimeout(absl::Condition(this, &JobRepository::JoinedOrFull),
                                  join_wait_)) {
          ++stats_.join_timeouts;
        }
      }
      if (queue_.size() <= max_batch_) {
        batch.swap(queue_);
      } else {
        batch.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.begin() + static_cast<long>(max_batch_)));
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<long>(max_batch_));
      }
    }
    std::vector<JobRecord> records;
    records.reserve(batch.size());
    for (Pending& p : batch) records.push_back(std::move(p.job));
    const absl::Status stored = store_->CreateJobs(records);
    {
      absl::MutexLock lock(&mu_);
      ++stats_.batches;
      stats_.jobs += static_cast<int64_t>(records.size());
      stats_.largest_batch = std::max(stats_.largest_batch, static_cast<int64_t>(records.size()));
      if (!stored.ok()) ++stats_.failed_batches;
    }
    if (on_batch_) on_batch_(records, stored);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].done) batch[i].done(records[i], stored);
    }
  }
}

absl::StatusOr<std::vector<JobRecord>> JobRepository::ListJobs(loom::v1::JobPhase phase) {
  return store_->ListJobs(phase);
}
absl::StatusOr<std::vector<NodeRecord>> JobRepository::ListNodes() { return store_->ListNodes(); }
absl::Status JobRepository::WriteMetrics(const std::vector<MetricRow>& rows) {
  return store_->WriteMetrics(rows);
}
absl::StatusOr<std::vector<MetricRow>> JobRepository::ListMetrics(const std::string& job_id,
                                                                  int64_t after_key, int limit) {
  return store_->ListMetrics(job_id, after_key, limit);
}
absl::Status JobRepository::UpdateJob(const JobRecord& job) { return store_->UpdateJob(job); }
absl::Status JobRepository::UpdateJobs(const std::vector<JobRecord>& jobs) {
  return store_->UpdateJobs(jobs);
}
absl::Status JobRepository::UpsertNode(const NodeRecord& node) { return store_->UpsertNode(node); }

absl::Status JobRepository::UpdateJobsVersioned(const std::vector<JobRecord>& jobs,
                                                const std::vector<uint64_t>& versions) {
  if (jobs.size() != versions.size()) {
    return absl::InvalidArgumentError(absl::StrCat("UpdateJobsVersioned: ", jobs.size(),
                                                   " jobs but ", versions.size(), " versions"));
  }
  absl::MutexLock lock(&versions_mu_);
  std::vector<JobRecord> fresh;
  std::vector<uint64_t> fresh_versions;
  fresh.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto it = written_versions_.find(jobs[i].id);
    if (it != written_versions_.end() && it->second >= versions[i]) continue;  // newer is stored
    fresh.push_back(jobs[i]);
    fresh_versions.push_back(versions[i]);
  }
  if (fresh.empty()) return absl::OkStatus();
  absl::Status stored = fresh.size() == 1 ? store_->UpdateJob(fresh[0]) : store_->UpdateJobs(fresh);
  if (!stored.ok()) return stored;
  for (size_t i = 0; i < fresh.size(); ++i) {
    uint64_t& v = written_versions_[fresh[i].id];
    v = std::max(v, fresh_versions[i]);
  }
  return absl::OkStatus();
}

JobRepository::Stats JobRepository::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace loom
