// File: scheduler/retention_worker.h
//
// Checkpoint retention (spec.checkpoint.keep_last / keep_best; storage/checkpoint
// ApplyRetention) carried out asynchronously, on its own thread with its own queue, so that
// neither the scheduler's lock nor its scheduling loop waits on a slow or frozen checkpoint
// service (issue 16, "nothing slow under the lock"). Moved out of CheckpointWorker, which keeps
// the resume lookups and hands retention requests to one of these.
//
//   * One request per job: the latest request for a job wins (it replaces one queued or waiting
//     for a retry, and inherits that one's backoff).
//   * A transient failure (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED: the
//     service is down, frozen or overloaded) is retried after retry_initial x 2^(k-1) for the
//     k-th consecutive failure, at most retry_max (real time, absl::Now), until the service
//     answers: retention catches up once it resumes.
//   * A failure of the deletion itself (any other code but NOT_FOUND and INVALID_ARGUMENT, e.g.
//     PERMISSION_DENIED or INTERNAL for a step whose files cannot be removed; the message names
//     the step, file and OS error) is reported to the job's owner through the Reporter (once
//     per distinct message, and once more with OK when a later pass succeeds) and retried with
//     the same backoff, so the step goes as soon as it can (issue 42 defect 4: it used to be
//     logged in the scheduler's log only).
//   * NOT_FOUND (no checkpoint directory) and INVALID_ARGUMENT are logged and dropped.
//   Retention never fails a job.
//
// Thread-safe. Lock order: a caller's lock before this class's; the worker thread calls the
// catalog without holding any lock. The destructor waits for an in-flight catalog call (bounded
// by the catalog's own deadline) and drops what is still queued.
#ifndef LOOM_SCHEDULER_RETENTION_WORKER_H_
#define LOOM_SCHEDULER_RETENTION_WORKER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/common.pb.h"
#include "scheduler/checkpoint_catalog.h"

namespace loom {

class RetentionWorker {
 public:
  struct Task {
    std::string checkpoint_dir;
    loom::v1::CheckpointPolicy policy;
    std::vector<int64_t> protected_steps;  // never deleted (e.g. the attempt's resume point)
  };
  struct Stats {
    int64_t applied = 0;           // calls that succeeded
    int64_t deleted_steps = 0;     // checkpoints they deleted
    int64_t retries = 0;           // failures followed by a retry (transient or reported)
    int64_t reported = 0;          // Reporter calls with an error
    int64_t dropped = 0;           // permanent failures (logged, not retried)
  };
  // Tells the job's owner about retention of `job_id`: `status` is the failure (non-OK; it will
  // be retried), or OK when a pass succeeded after a reported failure. Called on the worker
  // thread with no lock of this class held (it may take the caller's lock); must not call
  // back into the worker.
  using Reporter = std::function<void(const std::string& job_id, const absl::Status& status)>;

  // `catalog` must outlive the worker. `retry_initial` > 0, `retry_max` >= retry_initial.
  // `reporter` may be empty (failures are then only logged).
  RetentionWorker(CheckpointCatalog* catalog, absl::Duration retry_initial,
                  absl::Duration retry_max, Reporter reporter = nullptr);
  ~RetentionWorker();
  RetentionWorker(const RetentionWorker&) = delete;
  RetentionWorker& operator=(const RetentionWorker&) = delete;

  // Queues retention for `job_id` (replacing a queued or retrying request for it).
  void Request(const std::string& job_id, Task task);
  // Blocks until nothing is queued, retrying or in flight (or the worker stops).
  void WaitIdle();
  // Requests queued or waiting for a retry (not counting one in flight).
  int Backlog() const;
  Stats stats() const;

 private:
  struct Entry {
    Task task;
    absl::Time not_before = absl::InfinitePast();
    int failures = 0;
  };
  absl::Duration Backoff(int failures) const;
  void Loop();

  // Reports `status` for `job_id` unless it is the message reported last (OK: only after a
  // reported failure). Takes mu_; calls the reporter without it.
  void Report(const std::string& job_id, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  CheckpointCatalog* const catalog_;
  const absl::Duration retry_initial_;
  const absl::Duration retry_max_;
  const Reporter reporter_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Entry> queue_ ABSL_GUARDED_BY(mu_);  // by job id
  // The failure last reported per job, until a pass succeeds.
  std::map<std::string, std::string> reported_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_RETENTION_WORKER_H_
