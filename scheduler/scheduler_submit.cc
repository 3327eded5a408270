// The Scheduler facade's submissions: validation, path confinement, idempotent request ids
// and the group commit of concurrent submissions into one store transaction.
#include "scheduler/scheduler.h"

#include "scheduler/job_spec_validation_accelerators.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/job_state.h"
#include "scheduler/path_policy.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

std::string Scheduler::NewJobId() {
  while (true) {
    std::string id = absl::StrFormat("job-%08x", absl::Uniform<uint32_t>(bitgen_));
    if (jobs_.count(id) == 0 && inflight_ids_.count(id) == 0) return id;
  }
}

absl::StatusOr<loom::v1::Job> Scheduler::SubmitJob(const loom::v1::JobSpec& spec,
                                                   const std::string& request_id,
                                                   bool* deduplicated,
                                                   const std::string& tenant_in) {
  if (deduplicated != nullptr) *deduplicated = false;
  RETURN_IF_ERROR(CheckIdLength("request_id", request_id));
  const std::string tenant = tenant_in.empty() ? std::string("default") : tenant_in;
  // A retry of an earlier submission (same request id): the earlier job, if it is the same
  // tenant's and the same spec. Request ids are unique across tenants; another tenant's job is
  // not revealed.
  auto earlier_submission = [&](const JobRecord& earlier) -> absl::StatusOr<loom::v1::Job> {
    if (earlier.tenant != tenant) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id ", request_id, " was already used by another tenant"));
    }
    if (!google::protobuf::util::MessageDifferencer::Equals(earlier.spec, spec)) {
      return absl::AlreadyExistsError(absl::StrCat("request_id ", request_id,
                                                   " was already used for job ", earlier.id,
                                                   " with a different spec"));
    }
    if (deduplicated != nullptr) *deduplicated = true;
    return JobRecordToProto(earlier);
  };
  {
    absl::MutexLock lock(&mu_);
    auto known = job_by_request_.find(request_id);
    if (!request_id.empty() && known != job_by_request_.end()) {
      return earlier_submission(jobs_.at(known->second));
    }
  }
  // Paths first: validation reads the files, and must not for a path the tenant may not name.
  if (options_.confine_paths) RETURN_IF_ERROR(ConfineSubmittedPaths(spec, tenant));
  RETURN_IF_ERROR(ValidateJobSpec(spec, options_.validation));
  RETURN_IF_ERROR(ValidateAcceleratorsPerNode(spec.resources(), LargestRegisteredNodes()));
  RETURN_IF_ERROR(ResolveQueue(options_.queues, spec.queue(), tenant).status());
  RETURN_IF_ERROR(Transition(v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING));
  Submission sub;
  {
    absl::MutexLock lock(&mu_);
    if (!request_id.empty() && job_by_request_.count(request_id)) {
      // A concurrent retry created it between the check above and validation.
      return earlier_submission(jobs_.at(job_by_request_.at(request_id)));
    }
    if (!request_id.empty() && inflight_requests_.count(request_id)) {
      return absl::UnavailableError(absl::StrCat(
          "request_id ", request_id, ": a submission with this id is being committed; retry"));
    }
    JobRecord& job = sub.job;
    job.id = NewJobId();
    job.request_id = request_id;
    job.tenant = tenant;
    job.sequence = next_sequence_++;
    job.spec = spec;
    job.phase = v1::JOB_PHASE_PENDING;
    job.reason = "Queued";
    job.message = "waiting for the next scheduling cycle";
    job.create_time = clock_->Now();
    job.checkpoint_dir = absl::StrCat(options_.checkpoint_root, "/", job.id);
    job.progress.set_total_steps(spec.training().steps());
    AppendHistory(&job.state, job.create_time, job.phase, job.reason, job.message, 0);
    inflight_ids_.insert(job.id);
    if (!request_id.empty()) inflight_requests_.insert(request_id);
    absl::MutexLock queue_lock(&commit_mu_);
    commit_queue_.push_back(&sub);
  }
  // Group commit: the first waiting submitter without a leader writes every queued submission
  // in one transaction (one fsync) while later ones queue up for the next batch. The job is
  // acknowledged only once its transaction committed.
  commit_mu_.Lock();
  while (!sub.done) {
    if (commit_leader_) {
      commit_cv_.Wait(&commit_mu_);
      continue;
    }
    commit_leader_ = true;
    std::vector<Submission*> batch;
    batch.swap(commit_queue_);
    commit_mu_.Unlock();
    CommitSubmissions(batch);
    commit_mu_.Lock();
    for (Submission* b : batch) b->done = true;
    commit_leader_ = false;
    commit_cv_.SignalAll();
  }
  commit_mu_.Unlock();
  RETURN_IF_ERROR(sub.status);
  return JobRecordToProto(sub.job);
}

absl::Status Scheduler::ConfineSubmittedPaths(const loom::v1::JobSpec& spec,
                                              const std::string& tenant) {
  PathPolicy policy;
  policy.checkpoint_root = options_.checkpoint_root;
  policy.default_data_roots =
      options_.queues.data_roots.value_or(std::vector<std::string>{options_.validation.fortunes_dir});
  policy.tenant_data_roots = options_.queues.tenant_data_roots;
  return ConfineJobSpecPaths(spec, tenant, policy,
                             [this](const std::string& job_id) -> absl::StatusOr<std::string> {
                               absl::MutexLock lock(&mu_);
                               auto it = jobs_.find(job_id);
                               if (it == jobs_.end()) return absl::NotFoundError(job_id);
                               return it->second.tenant;
                             });
}

void Scheduler::CommitSubmissions(const std::vector<Submission*>& batch) {
  std::vector<JobRecord> records;
  records.reserve(batch.size());
  for (const Submission* b : batch) records.push_back(b->job);
  const absl::Status stored = store_->CreateJobs(records);
  absl::MutexLock lock(&mu_);
  for (Submission* b : batch) {
    const JobRecord& job = b->job;
    inflight_ids_.erase(job.id);
    if (!job.request_id.empty()) inflight_requests_.erase(job.request_id);
    b->status = stored;
    if (!stored.ok()) continue;
    job_order_[job.sequence] = job.id;
    if (!job.request_id.empty()) job_by_request_[job.request_id] = job.id;
    jobs_[job.id] = job;
    ++phase_counts_[job.phase];
    if (metrics_ != nullptr) {
      metrics_->JobSubmitted();
      metrics_->PhaseTransition(v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING);
    }
    VLOG(1) << "job " << job.id << " submitted: " << job.spec.resources().num_ranks()
            << " ranks, " << job.spec.training().steps() << " steps";
  }
  if (!stored.ok()) {
    LOG(WARNING) << "submission of " << batch.size() << " jobs failed: " << stored;
    return;
  }
  // Only the job counts changed (UpdateGauges would also walk every rank and node).
  if (metrics_ != nullptr) metrics_->SetJobCounts(phase_counts_);
}

}  // namespace loom

namespace loom {

std::map<loom::v1::AcceleratorKind, int> Scheduler::LargestRegisteredNodes() {
  absl::MutexLock lock(&mu_);
  std::map<loom::v1::AcceleratorKind, int> largest;
  for (const auto& [id, node] : nodes_) {
    if (node.lost) continue;
    int& most = largest[node.inventory.accelerator()];
    most = std::max(most, node.inventory.slots());
  }
  return largest;
}

}  // namespace loom
