#include "scheduler/job_watchers.h"

#include <utility>

#include "scheduler/job_state.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

std::shared_ptr<JobSubscription> JobWatchers::Subscribe(const JobRecord& job, absl::Time now,
                                                        std::function<void()> on_event) {
  auto sub = std::make_shared<JobSubscription>(
      job.id, std::make_shared<Waker>(std::move(on_event)), dispatcher_);
  loom::v1::JobEvent snapshot;
  *snapshot.mutable_job() = JobRecordToProto(job);
  snapshot.set_type("Snapshot");
  SetTimestamp(now, snapshot.mutable_time());
  if (IsTerminal(job.phase)) {
    // An ended job: replay its retained phase changes (its restarts and why) first.
    for (const loom::internal::JobHistoryEntry& h : job.state.history()) {
      loom::v1::JobEvent past;
      *past.mutable_job() = snapshot.job();
      past.mutable_job()->clear_spec();  // in the Snapshot that follows
      past.mutable_job()->set_phase(static_cast<loom::v1::JobPhase>(h.phase()));
      past.mutable_job()->set_reason(h.reason());
      past.mutable_job()->set_message(h.message());
      past.mutable_job()->set_attempt(h.attempt());
      past.set_type("History");
      SetTimestamp(absl::FromUnixMicros(h.time_us()), past.mutable_time());
      sub->Push(std::move(past));
    }
  }
  sub->Push(std::move(snapshot));
  if (!sub->ended()) by_job_.emplace(job.id, sub);
  return sub;
}

void JobWatchers::Publish(const JobRecord& job, const char* type, absl::Time now) {
  auto [begin, end] = by_job_.equal_range(job.id);
  if (begin == end) return;
  loom::v1::JobEvent event;
  *event.mutable_job() = JobRecordToProto(job);
  event.mutable_job()->clear_spec();  // only the Snapshot carries it
  event.set_type(type);
  SetTimestamp(now, event.mutable_time());
  for (auto it = begin; it != end; ++it) it->second->Push(event);
  if (IsTerminal(job.phase)) by_job_.erase(begin, end);  // their streams end with this event
}

void JobWatchers::Remove(const std::shared_ptr<JobSubscription>& subscription) {
  auto [begin, end] = by_job_.equal_range(subscription->job_id());
  for (auto it = begin; it != end; ++it) {
    if (it->second == subscription) {
      by_job_.erase(it);
      return;
    }
  }
}

std::vector<std::shared_ptr<JobSubscription>> JobWatchers::TakeAll() {
  std::vector<std::shared_ptr<JobSubscription>> out;
  out.reserve(by_job_.size());
  for (auto& [id, sub] : by_job_) out.push_back(std::move(sub));
  by_job_.clear();
  return out;
}

}  // namespace loom
