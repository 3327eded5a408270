// File: scheduler/checkpoint_worker.h
//
// The scheduler's calls into the checkpoint catalog (possibly loom-checkpoint over gRPC, with a
// deadline of seconds), made on two background threads with their own queues so that neither
// the scheduler's lock nor its scheduling loop waits on a slow or frozen checkpoint service:
//
//   * Resume lookups (CheckpointCatalog::NewestIntact) for jobs waiting to start attempt + 1.
//     The scheduling cycle requests them (RequestResume), waits a bounded time for answers off
//     the lock (AwaitResume), and uses whatever has been answered (Resume); a job without an
//     answer stays waiting, nothing else does. A definite answer (found / NOT_FOUND) is kept
//     for `resume_ttl`; an error is kept (the job's reason shows it) while the lookup is retried
//     with exponential backoff.
//   * Retention (CheckpointCatalog::ApplyRetention) is handed to a RetentionWorker
//     (retention_worker.h: its own thread, queue and retries; the latest request per job wins, a
//     failed call is retried with exponential backoff), so retention catches up once the service
//     answers again. The Retention* methods below forward to it.
//
// Backoff: retry_initial x 2^(k-1) after the k-th consecutive failure, at most retry_max, real
// time (absl::Now); resume_ttl is measured on the given Clock (the scheduler's). Thread-safe. Lock order: the scheduler's mutex before this class's (callers
// may hold theirs); the worker threads never take a caller's lock and call the catalog without
// holding this class's own lock. The destructor waits for an in-flight catalog call (bounded by
// the catalog's own deadline).
#ifndef LOOM_SCHEDULER_CHECKPOINT_WORKER_H_
#define LOOM_SCHEDULER_CHECKPOINT_WORKER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "scheduler/checkpoint_catalog.h"
#include "scheduler/clock.h"
#include "scheduler/retention_worker.h"

namespace loom {

struct CheckpointWorkerOptions {
  absl::Duration retry_initial = absl::Milliseconds(500);
  absl::Duration retry_max = absl::Seconds(30);
  // How long a definite resume answer is reused (the scheduler's answer only changes through
  // retention, which keeps the newest checkpoint, while no rank of the job runs).
  absl::Duration resume_ttl = absl::Seconds(30);
  // Told when retention of a job fails in a way its owner must see, and when that clears
  // (RetentionWorker::Reporter). May be empty.
  RetentionWorker::Reporter retention_reporter;
};

class CheckpointWorker {
 public:
  using RetentionTask = RetentionWorker::Task;
  // An answer to a resume lookup. `definite`: found or NOT_FOUND (else an error; retrying).
  struct ResumeAnswer {
    absl::StatusOr<CommittedCheckpoint> result;
    bool definite = false;
  };

  // `catalog` and `clock` must outlive the worker; `clock` (the scheduler's) dates answers for
  // resume_ttl. Starts the lookup thread and the retention worker.
  explicit CheckpointWorker(CheckpointCatalog* catalog, CheckpointWorkerOptions options = {},
                            Clock* clock = RealClock());
  ~CheckpointWorker();
  CheckpointWorker(const CheckpointWorker&) = delete;
  CheckpointWorker& operator=(const CheckpointWorker&) = delete;

  // Asks for the resume point of `job_id`'s attempt `attempt` + 1 unless that lookup is queued,
  // in flight, retrying, or answered definitely less than resume_ttl ago. A lookup for another
  // attempt of the job is replaced. True when a new call was queued by this request.
  bool RequestResume(const std::string& job_id, int32_t attempt, const std::string& checkpoint_dir);
  // The latest answer for (job_id, attempt); nullopt while none has come yet.
  std::optional<ResumeAnswer> Resume(const std::string& job_id, int32_t attempt) const;
  // Drops the lookups of jobs not in `wanted` (placed, ended): queued ones are not made, and an
  // in-flight one's answer is discarded.
  void RetainResume(const std::vector<std::string>& wanted);
  // Waits up to `timeout` until every (job id, attempt) in `keys` has an answer (definite or an
  // error). False on timeout.
  bool AwaitResume(const std::vector<std::pair<std::string, int32_t>>& keys, absl::Duration timeout);

  // Queues retention for `job_id` (replacing a queued request for it).
  void RequestRetention(const std::string& job_id, RetentionTask task);
  // Blocks until no retention is queued, retrying or in flight (or the worker stops).
  void WaitForRetention();
  // Retention requests queued or waiting for a retry (not counting one in flight).
  int RetentionBacklog() const;

 private:
  struct Lookup {
    int32_t attempt = 0;
    std::string checkpoint_dir;
    uint64_t generation = 0;       // changes when the lookup is replaced or dropped
    bool in_flight = false;
    bool queued = true;            // a call is due at not_before
    absl::Time not_before = absl::InfinitePast();
    int failures = 0;
    std::optional<ResumeAnswer> answer;
    absl::Time answered = absl::InfinitePast();
  };
  absl::Duration Backoff(int failures) const;
  void LookupLoop();

  CheckpointCatalog* const catalog_;
  const CheckpointWorkerOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, Lookup> lookups_ ABSL_GUARDED_BY(mu_);
  std::thread lookup_thread_;
  RetentionWorker retention_;  // its own lock and thread
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_CHECKPOINT_WORKER_H_
