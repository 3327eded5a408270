#include "scheduler/checkpoint_worker.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace loom {

CheckpointWorker::CheckpointWorker(CheckpointCatalog* catalog, CheckpointWorkerOptions options,
                                   Clock* clock)
    : catalog_(catalog),
      options_(options),
      clock_(clock),
      retention_(catalog, options.retry_initial, options.retry_max, options.retention_reporter) {
  lookup_thread_ = std::thread([this] { LookupLoop(); });
}

CheckpointWorker::~CheckpointWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  lookup_thread_.join();
}

absl::Duration CheckpointWorker::Backoff(int failures) const {
  absl::Duration d = options_.retry_initial;
  for (int i = 1; i < failures && d < options_.retry_max; ++i) d *= 2;
  return std::min(d, options_.retry_max);
}

bool CheckpointWorker::RequestResume(const std::string& job_id, int32_t attempt,
                                     const std::string& checkpoint_dir) {
  absl::MutexLock lock(&mu_);
  auto it = lookups_.find(job_id);
  if (it != lookups_.end() && it->second.attempt == attempt) {
    Lookup& l = it->second;
    const bool fresh = l.answer.has_value() && l.answer->definite &&
                       clock_->Now() - l.answered < options_.resume_ttl;
    if (l.in_flight || l.queued || fresh) return false;
    // A definite answer that got old: ask again (until then, no answer: the job waits).
    l.answer.reset();
    l.queued = true;
    l.not_before = absl::InfinitePast();
    l.generation = next_generation_++;
    return true;
  }
  Lookup l;
  l.attempt = attempt;
  l.checkpoint_dir = checkpoint_dir;
  l.generation = next_generation_++;
  lookups_[job_id] = std::move(l);
  return true;
}

std::optional<CheckpointWorker::ResumeAnswer> CheckpointWorker::Resume(const std::string& job_id,
                                                                       int32_t attempt) const {
  absl::MutexLock lock(&mu_);
  auto it = lookups_.find(job_id);
  if (it == lookups_.end() || it->second.attempt != attempt) return std::nullopt;
  return it->second.answer;
}

void CheckpointWorker::RetainResume(const std::vector<std::string>& wanted) {
  const std::set<std::string> keep(wanted.begin(), wanted.end());
  absl::MutexLock lock(&mu_);
  for (auto it = lookups_.begin(); it != lookups_.end();) {
    it = keep.count(it->first) ? std::next(it) : lookups_.erase(it);
  }
}

bool CheckpointWorker::AwaitResume(const std::vector<std::pair<std::string, int32_t>>& keys,
                                   absl::Duration timeout) {
  auto answered = [this, &keys]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_) return true;
    for (const auto& [job_id, attempt] : keys) {
      auto it = lookups_.find(job_id);
      if (it == lookups_.end() || it->second.attempt != attempt) continue;  // dropped
      if (!it->second.answer.has_value()) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&answered), timeout);
}

void CheckpointWorker::LookupLoop() {
  while (true) {
    std::string job_id, dir;
    uint64_t generation = 0;
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stop_) return;
        const absl::Time now = absl::Now();
        absl::Time next = absl::InfiniteFuture();
        for (auto& [id, l] : lookups_) {
          if (!l.queued || l.in_flight) continue;
          if (l.not_before <= now) {
            job_id = id;
            break;
          }
          next = std::min(next, l.not_before);
        }
        if (!job_id.empty()) break;
        // Woken by a new request (any release of mu_ re-checks), or when a retry is due.
        auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (stop_) return true;
          const absl::Time t = absl::Now();
          for (const auto& [id, l] : lookups_) {
            if (l.queued && !l.in_flight && l.not_before <= t) return true;
          }
          return false;
        };
        mu_.AwaitWithDeadline(absl::Condition(&due), next);
      }
      Lookup& l = lookups_.at(job_id);
      l.in_flight = true;
      l.queued = false;
      dir = l.checkpoint_dir;
      generation = l.generation;
    }
    // Verified (CRC-32): a corrupt newest step is marked and skipped (restart_policy.h).
    absl::StatusOr<CommittedCheckpoint> result = catalog_->NewestIntact(job_id, dir);
    absl::MutexLock lock(&mu_);
    auto it = lookups_.find(job_id);
    if (it == lookups_.end()) continue;  // dropped meanwhile
    Lookup& l = it->second;
    l.in_flight = false;
    if (l.generation != generation) continue;  // replaced meanwhile (it is queued again)
    const bool definite = result.ok() || absl::IsNotFound(result.status());
    if (definite) {
      l.failures = 0;
    } else {
      ++l.failures;
      l.queued = true;
      l.not_before = absl::Now() + Backoff(l.failures);
      LOG_EVERY_N(WARNING, 10) << "job " << job_id << ": resume-checkpoint lookup failed ("
                               << result.status() << "); retry " << l.failures << " in "
                               << absl::FormatDuration(Backoff(l.failures));
    }
    l.answer = ResumeAnswer{std::move(result), definite};
    l.answered = clock_->Now();
  }
}

void CheckpointWorker::RequestRetention(const std::string& job_id, RetentionTask task) {
  retention_.Request(job_id, std::move(task));
}

void CheckpointWorker::WaitForRetention() { retention_.WaitIdle(); }

int CheckpointWorker::RetentionBacklog() const { return retention_.Backlog(); }

}  // namespace loom
