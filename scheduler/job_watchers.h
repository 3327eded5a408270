// File: scheduler/job_watchers.h
//
// The WatchJob subscribers of every job and the events they are sent (docs/operations.md, REST
// ":watch"; proto/job_service.proto JobEvent): a new subscription gets the job's retained phase changes as "History" events when the
// job has ended, then a "Snapshot" (the whole job, spec included); every later change of the
// record is one event ("PhaseChanged", "Progress", "ReasonChanged") carrying the job without its
// spec, which never changes after submission (it was most of every event's bytes: 2.3 KB of a
// REST :watch event, issue 49). After an event of a terminal phase the job's subscriptions end
// and are forgotten. Each event carries its time (issue 52).
//
// Part of the Scheduler facade (scheduler.h), which owns one and calls it under its mutex.
// Not thread-safe on its own. Subscriptions (job_events.h) are thread-safe: their consumers pop
// events on other threads, woken through the WakeDispatcher.
#ifndef LOOM_SCHEDULER_JOB_WATCHERS_H_
#define LOOM_SCHEDULER_JOB_WATCHERS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/job_events.h"
#include "storage/job_store.h"

namespace loom {

class JobWatchers {
 public:
  // `dispatcher` wakes the subscribers; it must outlive this object.
  explicit JobWatchers(WakeDispatcher* dispatcher) : dispatcher_(dispatcher) {}

  // A new subscription to `job` holding its History events (an ended job) and a Snapshot stamped
  // `now`; kept for later events unless the job has ended. `on_event` runs on the dispatcher's
  // thread whenever events were queued.
  std::shared_ptr<JobSubscription> Subscribe(const JobRecord& job, absl::Time now,
                                             std::function<void()> on_event);
  // Queues an event of `type` for `job`'s subscribers, stamped `now`; after a terminal phase
  // they are forgotten (their streams end with this event).
  void Publish(const JobRecord& job, const char* type, absl::Time now);
  // Forgets `subscription` (the caller cancels it: JobSubscription::Cancel blocks while its
  // callback runs, so never under a lock that callback might take).
  void Remove(const std::shared_ptr<JobSubscription>& subscription);
  // Forgets every subscription and returns them, for the caller to cancel.
  std::vector<std::shared_ptr<JobSubscription>> TakeAll();

 private:
  WakeDispatcher* const dispatcher_;
  std::multimap<std::string, std::shared_ptr<JobSubscription>> by_job_;  // job id -> its streams
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_WATCHERS_H_
