#include "scheduler/job_table.h"

#include <algorithm>
#include <utility>

#include "scheduler/job_state.h"
#include "scheduler/record_helpers.h"

namespace loom {

JobRecord& JobTable::Add(JobRecord job) {
  if (records_.count(job.id) != 0) return Replace(std::move(job));
  next_sequence_ = std::max(next_sequence_, job.sequence + 1);
  order_[job.sequence] = job.id;
  if (!job.request_id.empty()) by_request_[job.request_id] = job.id;
  Count(job, job.phase, +1);
  ++phase_changes_;
  const std::string id = job.id;
  JobRecord& stored = records_[id];
  stored = std::move(job);
  Index(&stored);
  return stored;
}

JobRecord& JobTable::Replace(JobRecord job) {
  auto it = records_.find(job.id);
  if (it == records_.end()) return Add(std::move(job));
  if (it->second.phase != job.phase) {
    Count(it->second, it->second.phase, -1);
    Count(job, job.phase, +1);
    ++phase_changes_;
  }
  it->second = std::move(job);
  Index(&it->second);
  return it->second;
}

void JobTable::Clear() {
  records_.clear();
  order_.clear();
  by_request_.clear();
  active_.clear();
  waiting_.clear();
  phase_counts_.clear();
  tenant_counts_.clear();
  ++phase_changes_;
}

const JobRecord* JobTable::FindByRequest(const std::string& request_id) const {
  if (request_id.empty()) return nullptr;
  auto it = by_request_.find(request_id);
  if (it == by_request_.end()) return nullptr;
  auto record = records_.find(it->second);
  return record == records_.end() ? nullptr : &record->second;
}

int64_t JobTable::UnfinishedJobs(const std::string& tenant) const {
  int64_t unfinished = 0;
  if (auto it = inflight_by_tenant_.find(tenant); it != inflight_by_tenant_.end()) {
    unfinished += it->second;
  }
  // Ordered by (tenant, queue, phase): this tenant's entries are contiguous.
  for (auto it = tenant_counts_.lower_bound({tenant, std::string(), v1::JOB_PHASE_UNSPECIFIED});
       it != tenant_counts_.end() && std::get<0>(it->first) == tenant; ++it) {
    if (!IsTerminal(std::get<2>(it->first))) unfinished += it->second;
  }
  return unfinished;
}

int64_t JobTable::BeginSubmission(const std::string& id, const std::string& request_id,
                                  const std::string& tenant) {
  inflight_ids_.insert(id);
  if (!request_id.empty()) inflight_requests_.insert(request_id);
  ++inflight_by_tenant_[tenant];
  return next_sequence_++;
}

void JobTable::EndSubmission(const JobRecord& job) {
  inflight_ids_.erase(job.id);
  if (!job.request_id.empty()) inflight_requests_.erase(job.request_id);
  if (auto t = inflight_by_tenant_.find(job.tenant);
      t != inflight_by_tenant_.end() && --t->second <= 0) {
    inflight_by_tenant_.erase(t);
  }
}

bool JobTable::IdTaken(const std::string& id) const {
  return records_.count(id) != 0 || inflight_ids_.count(id) != 0;
}

bool JobTable::RequestInFlight(const std::string& request_id) const {
  return inflight_requests_.count(request_id) != 0;
}

void JobTable::Index(JobRecord* job) {
  const bool terminal = IsTerminal(job->phase);
  const bool fresh = job->phase == v1::JOB_PHASE_PENDING && job->attempt == 0;
  if (!terminal && !fresh) {
    active_[job->id] = job;
  } else {
    active_.erase(job->id);
  }
  if (Waiting(*job)) {
    waiting_[job->id] = WaitingEntry{job, ClusterSnapshot::WaitingJob::Of(*job)};
  } else {
    waiting_.erase(job->id);
  }
}

void JobTable::Count(const JobRecord& job, loom::v1::JobPhase phase, int delta) {
  phase_counts_[phase] += delta;
  tenant_counts_[{job.tenant, QueueOf(job.spec), phase}] += delta;
}

}  // namespace loom
