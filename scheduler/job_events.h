// File: scheduler/job_events.h
//
// What the scheduler publishes for streaming clients (JobService.WatchJob and StreamLogs), kept
// apart from the scheduling core's mutex so that a slow or stuck client can never block
// scheduling, heartbeats or other clients:
//
//   * WakeDispatcher: one thread that runs subscribers' wake callbacks. Publishers (the
//     scheduler, under its own mutex) only append to bounded queues and post a wake, which never
//     blocks and never calls into gRPC; the callback (e.g. a ServerWriteReactor's StartWrite)
//     runs on the dispatcher thread with no scheduler lock held.
//   * JobSubscription: one WatchJob client's bounded event queue. Progress events coalesce
//     (a queued "Progress" is replaced by the newer event), so the queue holds at most the
//     unsent phase changes plus one progress event; beyond kMaxQueuedJobEvents the oldest events
//     are dropped (each event carries the whole Job, so the newest one is always complete).
//   * JobLogBuffer: the ranks' output lines per job, in memory only (a scheduler restart loses
//     them; they are not persisted), bounded per job (kMaxLogLinesPerJob lines and
//     kMaxLogBytesPerJob bytes, oldest dropped first), in the number of jobs (kMaxJobsWithLogs)
//     and in total text (kMaxLogBytesTotal); beyond either, the job whose logs were touched
//     least recently goes first, except that jobs being followed are never evicted. Lines are
//     deduplicated per (job, attempt, rank) by sequence number, so a worker's retried heartbeat
//     adds nothing twice. Followers (StreamLogs follow=true) subscribe for wakes.
//
// Prior art: Kubernetes' watch cache (bounded per-watcher buffers, a slow watcher is cut off
// rather than blocking the apiserver) and Determined's TaskLogs(follow, rank_ids).
//
// Thread-safety: every class here is thread-safe. Lock order: scheduler mutex -> JobLogBuffer /
// JobSubscription mutex -> WakeDispatcher mutex; wake callbacks run with none of them held.
#ifndef LOOM_SCHEDULER_JOB_EVENTS_H_
#define LOOM_SCHEDULER_JOB_EVENTS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "proto/job_service.pb.h"
#include "proto/worker_service.pb.h"

namespace loom {

// Most events one watcher's queue holds (see JobSubscription).
inline constexpr size_t kMaxQueuedJobEvents = 64;
// Retained log lines per job, and their total text bytes.
inline constexpr size_t kMaxLogLinesPerJob = 10000;
inline constexpr size_t kMaxLogBytesPerJob = 4 << 20;
// Jobs whose logs are retained at once, and their text in all (least recently appended to or
// ended are evicted first).
inline constexpr size_t kMaxJobsWithLogs = 64;
inline constexpr size_t kMaxLogBytesTotal = 128 << 20;
// Longest retained line; longer ones are cut (the worker already cuts at 4 KiB).
inline constexpr size_t kMaxLogLineBytes = 4096;

// A subscriber's wake-up: `callback` runs on the dispatcher thread after Wake(), at most once
// per Wake() burst (wakes posted while one is pending coalesce), never concurrently with
// itself and never after Close() returned.
class Waker {
 public:
  explicit Waker(std::function<void()> callback) : callback_(std::move(callback)) {}
  // Blocks until a running callback returned; afterwards the callback never runs again.
  // Must not be called from inside the callback.
  void Close();
  bool closed() const;

 private:
  friend class WakeDispatcher;
  void Run();
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool pending_ = false;  // guarded by the dispatcher's mutex
  std::function<void()> callback_;
};

// One thread running wake callbacks. Thread-safe.
class WakeDispatcher {
 public:
  WakeDispatcher();
  ~WakeDispatcher();  // runs the wakes still queued, then joins
  // Queues `waker` unless already queued. Never blocks on a callback.
  void Wake(const std::shared_ptr<Waker>& waker);

 private:
  void Loop();
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Waker>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// One WatchJob client's queue. Created by Scheduler::WatchJob with the "Snapshot" event queued.
class JobSubscription {
 public:
  JobSubscription(std::string job_id, std::shared_ptr<Waker> waker, WakeDispatcher* dispatcher)
      : job_id_(std::move(job_id)), waker_(std::move(waker)), dispatcher_(dispatcher) {}

  const std::string& job_id() const { return job_id_; }
  // Appends (coalescing progress, dropping the oldest beyond kMaxQueuedJobEvents) and wakes the
  // subscriber. Ignored after the terminal event was queued or after Cancel().
  void Push(loom::v1::JobEvent event);
  // Takes the oldest queued event; false if none.
  bool Pop(loom::v1::JobEvent* event);
  // True once an event whose job is terminal was queued (nothing follows it).
  bool ended() const;
  // Stops queuing and closes the waker (blocks while its callback runs).
  void Cancel();
  // Events dropped because the queue was full (for tests and logs).
  int64_t dropped() const;

 private:
  const std::string job_id_;
  const std::shared_ptr<Waker> waker_;
  WakeDispatcher* const dispatcher_;
  mutable absl::Mutex mu_;
  std::deque<loom::v1::JobEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// A log follower's position: lines with index >= next_index are new to it.
struct LogCursor {
  int64_t next_index = 0;
};

class JobLogBuffer {
 public:
  explicit JobLogBuffer(WakeDispatcher* dispatcher) : dispatcher_(dispatcher) {}

  // Adds `lines` of one rank; lines whose sequence is not above the last one kept for (job,
  // attempt, rank) are dropped as duplicates. Wakes the job's followers. Returns lines added.
  int Append(const std::string& job_id, int32_t attempt, int32_t rank,
             const google::protobuf::RepeatedPtrField<loom::v1::RankLogLine>& lines);
  // The retained lines of `job_id` at or after `cursor` (oldest first), restricted to `ranks`
  // (empty = all); with `tail_lines` > 0 only the last tail_lines of those. At most
  // `max_lines` (> 0) are returned; `cursor` is advanced past what was returned (and past lines
  // filtered out). `*more` (may be null) says whether matching lines remain after the batch.
  std::vector<loom::v1::LogLine> Read(const std::string& job_id, const std::set<int32_t>& ranks,
                                      int32_t tail_lines, size_t max_lines, LogCursor* cursor,
                                      bool* more = nullptr);
  // Marks the job ended: followers are woken and see ended() true. Lines may still arrive (a
  // rank's last lines), and are kept.
  void MarkEnded(const std::string& job_id);
  // Undoes MarkEnded for a job that ResumeJob moved back to PENDING: a later follower waits for
  // the new attempt's lines instead of stopping at once. The retained lines are kept.
  void MarkResumed(const std::string& job_id);
  bool Ended(const std::string& job_id) const;
  // Registers `waker` for appends to (and the end of) `job_id`; Unfollow removes it.
  void Follow(const std::string& job_id, const std::shared_ptr<Waker>& waker);
  void Unfollow(const std::string& job_id, const std::shared_ptr<Waker>& waker);
  // Retained lines of a job (tests).
  size_t LineCount(const std::string& job_id) const;

 private:
  struct JobLogs {
    std::deque<loom::v1::LogLine> lines;
    int64_t first_index = 0;  // index of lines.front()
    size_t bytes = 0;
    std::map<std::pair<int32_t, int32_t>, int64_t> last_sequence;  // (attempt, rank) -> seq
    bool ended = false;
    std::list<std::string>::iterator lru;
  };
  JobLogs& Touch(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the least recently touched job's logs, skipping `keep` and followed jobs; false if
  // there is none to drop.
  bool EvictOne(const std::string& keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeFollowers(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WakeDispatcher* const dispatcher_;
  mutable absl::Mutex mu_;
  std::map<std::string, JobLogs> jobs_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // most recently touched first
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<std::string, std::shared_ptr<Waker>> followers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_EVENTS_H_
