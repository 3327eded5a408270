#include "scheduler/retention_worker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace loom {

RetentionWorker::RetentionWorker(CheckpointCatalog* catalog, absl::Duration retry_initial,
                                 absl::Duration retry_max, Reporter reporter)
    : catalog_(catalog),
      retry_initial_(retry_initial),
      retry_max_(retry_max),
      reporter_(std::move(reporter)) {
  thread_ = std::thread([this] { Loop(); });
}

RetentionWorker::~RetentionWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Duration RetentionWorker::Backoff(int failures) const {
  absl::Duration d = retry_initial_;
  for (int i = 1; i < failures && d < retry_max_; ++i) d *= 2;
  return std::min(d, retry_max_);
}

void RetentionWorker::Request(const std::string& job_id, Task task) {
  absl::MutexLock lock(&mu_);
  Entry& e = queue_[job_id];  // a newer request replaces one queued, keeping its backoff
  e.task = std::move(task);
}

void RetentionWorker::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (queue_.empty() && !busy_);
  };
  mu_.Await(absl::Condition(&idle));
}

int RetentionWorker::Backlog() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

RetentionWorker::Stats RetentionWorker::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void RetentionWorker::Report(const std::string& job_id, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      if (reported_.erase(job_id) == 0) return;
    } else {
      auto [it, inserted] = reported_.emplace(job_id, std::string(status.message()));
      if (!inserted && it->second == status.message()) return;
      it->second = std::string(status.message());
      ++stats_.reported;
    }
  }
  if (reporter_) reporter_(job_id, status);
}

void RetentionWorker::Loop() {
  while (true) {
    std::string job_id;
    Entry r;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      while (true) {
        if (stop_) return;
        const absl::Time now = absl::Now();
        absl::Time next = absl::InfiniteFuture();
        for (const auto& [id, entry] : queue_) {
          if (entry.not_before <= now) {
            job_id = id;
            break;
          }
          next = std::min(next, entry.not_before);
        }
        if (!job_id.empty()) break;
        auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (stop_) return true;
          const absl::Time t = absl::Now();
          for (const auto& [id, entry] : queue_) {
            if (entry.not_before <= t) return true;
          }
          return false;
        };
        mu_.AwaitWithDeadline(absl::Condition(&due), next);
      }
      r = std::move(queue_.at(job_id));
      queue_.erase(job_id);
      busy_ = true;
    }
    absl::StatusOr<std::vector<int64_t>> deleted = catalog_->ApplyRetention(
        job_id, r.task.checkpoint_dir, r.task.policy, r.task.protected_steps);
    if (deleted.ok()) {
      if (!deleted->empty()) {
        LOG(INFO) << "job " << job_id << ": retention deleted checkpoints of steps "
                  << absl::StrJoin(*deleted, ", ")
                  << (r.failures > 0 ? " (after a retry)" : "");
      }
      {
        absl::MutexLock lock(&mu_);
        ++stats_.applied;
        stats_.deleted_steps += static_cast<int64_t>(deleted->size());
      }
      Report(job_id, absl::OkStatus());
      continue;
    }
    const absl::StatusCode code = deleted.status().code();
    const bool transient = code == absl::StatusCode::kUnavailable ||
                           code == absl::StatusCode::kDeadlineExceeded ||
                           code == absl::StatusCode::kResourceExhausted ||
                           code == absl::StatusCode::kAborted;
    const bool permanent =
        code == absl::StatusCode::kNotFound || code == absl::StatusCode::kInvalidArgument;
    if (permanent) {
      LOG(WARNING) << "job " << job_id << ": checkpoint retention failed: " << deleted.status();
      absl::MutexLock lock(&mu_);
      ++stats_.dropped;
      continue;
    }
    const int failures = r.failures + 1;
    const absl::Time retry_at = absl::Now() + Backoff(failures);
    LOG_EVERY_N(WARNING, 10) << "job " << job_id << ": checkpoint retention failed ("
                             << deleted.status() << "); retry " << failures << " in "
                             << absl::FormatDuration(Backoff(failures));
    // A deletion that failed (not the service being unreachable) is the job owner's business.
    if (!transient) Report(job_id, deleted.status());
    absl::MutexLock lock(&mu_);
    ++stats_.retries;
    auto [it, inserted] = queue_.emplace(job_id, std::move(r));  // unless a newer one came
    it->second.failures = failures;
    it->second.not_before = std::max(it->second.not_before, retry_at);
  }
}

}  // namespace loom
