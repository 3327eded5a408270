#include "scheduler/scheduler.h"

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

namespace loom {
namespace {

// The job's progress once rank 0 of its current attempt reports `reported`. A new attempt's rank
// starts with empty progress and, when it resumed, evaluates first at the resume step: the job
// keeps its "before training" loss, and its last evaluation, checkpoint and step until the new
// attempt reports newer ones.
loom::v1::Progress MergeProgress(const loom::v1::Progress& job,
                                 const loom::v1::Progress& reported) {
  loom::v1::Progress merged = reported;
  if (job.has_eval_loss()) {
    merged.set_initial_eval_loss(job.initial_eval_loss());
    if (!reported.has_eval_loss()) {
      merged.set_has_eval_loss(true);
      merged.set_eval_loss(job.eval_loss());
      merged.set_eval_step(job.eval_step());
    }
  }
  if (reported.step() == 0) {
    merged.set_step(job.step());
    merged.set_loss(job.loss());
  }
  merged.set_last_checkpoint_step(std::max(job.last_checkpoint_step(), reported.last_checkpoint_step()));
  return merged;
}

using loom::v1::AcceleratorKind;
using loom::v1::JobPhase;
using loom::v1::RankState;

AcceleratorKind KindOf(const loom::v1::JobSpec& spec) { return loom::KindOf(spec.resources()); }

std::string KindName(AcceleratorKind kind) { return AcceleratorKindName(kind); }

bool IsInfraClass(loom::v1::FailureClass c) {
  return c == v1::FAILURE_CLASS_INFRA || c == v1::FAILURE_CLASS_SETUP;
}

void AddSuspect(JobRecord* job, const std::string& node_id) {
  if (node_id.empty()) return;
  for (const std::string& n : job->state.suspect_nodes()) {
    if (n == node_id) return;
  }
  job->state.add_suspect_nodes(node_id);
}

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* ts) {
  const int64_t micros = absl::ToUnixMicros(t);
  int64_t seconds = micros / 1000000;
  int64_t rem = micros % 1000000;
  if (rem < 0) {
    rem += 1000000;
    --seconds;
  }
  ts->set_seconds(seconds);
  ts->set_nanos(static_cast<int32_t>(rem * 1000));
}

// INVALID_ARGUMENT for an id too long to be real (and to be echoed back in an error).
absl::Status CheckIdLength(absl::string_view field, const std::string& id) {
  if (id.size() <= kMaxIdBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", id.size(), " bytes, longer than ",
                                                 kMaxIdBytes, " (starts with '",
                                                 absl::CEscape(id.substr(0, 32)), "')"));
}

std::string NodeAddress(const NodeRecord& node) {
  if (!node.inventory.address().empty()) return node.inventory.address();
  if (!node.inventory.hostname().empty()) return node.inventory.hostname();
  return node.id;
}

}  // namespace

absl::Status SchedulerOptions::Validate() const {
  if (checkpoint_root.empty()) {
    return absl::InvalidArgumentError("checkpoint_root: required");
  }
  if (heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_timeout: must be > 0, got ", absl::FormatDuration(heartbeat_timeout)));
  }
  if (!(hang_step_time_factor >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hang_step_time_factor: must be >= 1, got ", hang_step_time_factor));
  }
  if (hang_min_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hang_min_timeout: must be > 0");
  }
  if (cancel_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("cancel_grace: must be > 0");
  }
  if (resume_lookup_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume_lookup_wait: must be >= 0, got ", absl::FormatDuration(resume_lookup_wait)));
  }
  if (checkpoint_worker.retry_initial <= absl::ZeroDuration() ||
      checkpoint_worker.retry_max < checkpoint_worker.retry_initial) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_worker.retry_initial: must be in (0, retry_max], got ",
                     absl::FormatDuration(checkpoint_worker.retry_initial)));
  }
  if (heartbeat_interval <= absl::ZeroDuration() || heartbeat_interval >= heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval: must be in (0, heartbeat_timeout = ",
        absl::FormatDuration(heartbeat_timeout), "), got ",
        absl::FormatDuration(heartbeat_interval)));
  }
  if (reregistration_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("reregistration_grace: must be >= 0");
  }
  if (queues.queues.empty()) return absl::InvalidArgumentError("queues: at least one queue");
  if (default_max_infra_restarts < 0) {
    return absl::InvalidArgumentError(absl::StrCat("default_max_infra_restarts: must be >= 0, got ",
                                                   default_max_infra_restarts));
  }
  if (ready_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ready_timeout: must be > 0");
  }
  if (ready_backoff_base <= absl::ZeroDuration() || ready_backoff_cap < ready_backoff_base) {
    return absl::InvalidArgumentError(
        "ready_backoff_base: must be > 0 and at most ready_backoff_cap");
  }
  if (restart_backoff_base < absl::ZeroDuration() || restart_backoff_cap < restart_backoff_base) {
    return absl::InvalidArgumentError(
        "restart_backoff_base: must be >= 0 and at most restart_backoff_cap");
  }
  return absl::OkStatus();
}

loom::v1::Job JobRecordToProto(const JobRecord& r) {
  loom::v1::Job job;
  job.set_id(r.id);
  job.set_request_id(r.request_id);
  job.set_tenant(r.tenant);
  job.set_user_restarts(r.state.user_restarts());
  job.set_infra_restarts(r.state.infra_restarts());
  job.set_preemptions(r.state.preemptions());
  *job.mutable_spec() = r.spec;
  job.set_phase(r.phase);
  job.set_failure_class(r.failure_class);
  job.set_reason(r.reason);
  job.set_message(r.message);
  if (r.create_time != absl::InfinitePast()) SetTimestamp(r.create_time, job.mutable_create_time());
  if (r.start_time != absl::InfinitePast()) SetTimestamp(r.start_time, job.mutable_start_time());
  if (r.end_time != absl::InfinitePast()) SetTimestamp(r.end_time, job.mutable_end_time());
  job.set_attempt(r.attempt);
  *job.mutable_progress() = r.progress;
  job.set_checkpoint_dir(r.checkpoint_dir);
  for (const std::string& node : r.rank_nodes) job.add_rank_nodes(node);
  return job;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                             JobStore* store, Clock* clock,
                                                             SchedulerMetrics* metrics,
                                                             CheckpointCatalog* checkpoints) {
  RETURN_IF_ERROR(options.Validate());
  if (store == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("Scheduler::Create: store and clock are required");
  }
  std::unique_ptr<Scheduler> scheduler(
      new Scheduler(options, store, clock, metrics, checkpoints));
  {
    absl::MutexLock lock(&scheduler->mu_);
    RETURN_IF_ERROR(scheduler->Load());
    scheduler->UpdateGauges();
  }
  return scheduler;
}

Scheduler::~Scheduler() {
  checkpoint_worker_.reset();  // waits for an in-flight catalog call (bounded by its deadline)
  std::vector<std::shared_ptr<JobSubscription>> subs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, sub] : watchers_) subs.push_back(sub);
    watchers_.clear();
  }
  for (auto& sub : subs) sub->Cancel();
}

absl::Status Scheduler::Load() {
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes());
  for (NodeRecord& node : nodes) {
    // Grace: the scheduler was down, so no node could heartbeat; each gets a full timeout, at
    // least reregistration_grace, to come back (CheckNodeLiveness).
    if (!node.lost) {
      node.last_heartbeat_time = now;
      awaiting_reregistration_.insert(node.id);
    }
    nodes_[node.id] = std::move(node);
  }
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, store_->ListJobs(v1::JOB_PHASE_UNSPECIFIED));
  std::vector<std::pair<std::string, std::string>> orphaned;  // (job id, node id)
  for (JobRecord& job : jobs) {
    next_sequence_ = std::max(next_sequence_, job.sequence + 1);
    job_order_[job.sequence] = job.id;
    if (!job.request_id.empty()) job_by_request_[job.request_id] = job.id;
    const bool placed = job.phase == v1::JOB_PHASE_STARTING || job.phase == v1::JOB_PHASE_RUNNING ||
                        job.phase == v1::JOB_PHASE_STOPPING;
    if (placed && job.attempt > 0) {
      for (int32_t rank = 0; rank < static_cast<int32_t>(job.rank_nodes.size()); ++rank) {
        RankRuntime rt;
        rt.attempt = job.attempt;
        rt.node_id = job.rank_nodes[rank];
        // Ranks known to have started (all of a RUNNING job, rank 0 once it published its
        // rendezvous port) are re-adopted as running: a worker that no longer reports one lost
        // it (RankLost), and it must not silently restart from step 0 under the same attempt.
        // Ranks never acknowledged are handed out again.
        if (job.phase == v1::JOB_PHASE_RUNNING || job.phase == v1::JOB_PHASE_STOPPING ||
            (rank == 0 && job.rendezvous_port != 0)) {
          rt.reported = true;
          rt.state = v1::RANK_STATE_RUNNING;
        }
        if (job.phase == v1::JOB_PHASE_STOPPING) {
          // A graceful stop was in progress: ask again, with a fresh grace period.
          rt.stop_requested = true;
          rt.graceful_stop = true;
          stops_[job.id].deadline = now + options_.cancel_grace;
        }
        ranks_[{job.id, rank}] = rt;
        auto node = nodes_.find(rt.node_id);
        if (node == nodes_.end() || node->second.lost) orphaned.emplace_back(job.id, rt.node_id);
      }
    }
    if (placed && job.attempt > 1) {
      // The attempt resumed from the newest committed checkpoint at its placement; unless it has
      // written newer ones since, that is still the newest. Ranks handed out again get it.
      absl::StatusOr<CommittedCheckpoint> newest =
          checkpoints_->NewestCommitted(job.id, job.checkpoint_dir);
      if (newest.ok()) {
        resume_from_[job.id] = *newest;
      } else if (!absl::IsNotFound(newest.status())) {
        LOG(WARNING) << "job " << job.id << ": cannot find its resume checkpoint: "
                     << newest.status();
      }
    }
    ++phase_counts_[job.phase];
    jobs_[job.id] = std::move(job);
  }
  LOG(INFO) << "scheduler state loaded: " << jobs_.size() << " jobs, " << nodes_.size()
            << " nodes, " << ranks_.size() << " ranks to re-adopt";
  for (const auto& [job_id, node_id] : orphaned) {
    if (IsTerminal(jobs_[job_id].phase)) continue;
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "NodeLost",
                                absl::StrCat("node ", node_id, " was lost while the scheduler was down"),
                                node_id));
  }
  return absl::OkStatus();
}

std::string Scheduler::NewJobId() {
  while (true) {
    std::string id = absl::StrFormat("job-%08x", absl::Uniform<uint32_t>(bitgen_));
    if (jobs_.count(id) == 0 && inflight_ids_.count(id) == 0) return id;
  }
}

absl::Status Scheduler::CommitJob(JobRecord job) {
  auto it = jobs_.find(job.id);
  if (it == jobs_.end()) return absl::InternalError(absl::StrCat("job ", job.id, " vanished"));
  const JobPhase from = it->second.phase;
  if (from != job.phase) {
    RETURN_IF_ERROR(Transition(from, job.phase));
    AppendHistory(&job.state, clock_->Now(), job.phase, job.reason, job.message, job.attempt);
  }
  if (deferred_writes_ != nullptr) {
    (*deferred_writes_)[job.id] = job;  // written in one transaction at the end of the cycle
  } else {
    RETURN_IF_ERROR(store_->UpdateJob(job));
  }
  if (from != job.phase) {
    --phase_counts_[from];
    ++phase_counts_[job.phase];
    VLOG(1) << "job " << job.id << ": " << JobPhaseName(from) << " -> " << JobPhaseName(job.phase)
            << (job.message.empty() ? "" : ": ") << job.message;
    if (metrics_ != nullptr) {
      metrics_->PhaseTransition(from, job.phase);
      if (from == v1::JOB_PHASE_PENDING && job.phase != v1::JOB_PHASE_CANCELLED) {
        metrics_->ObserveQueueWait(clock_->Now() - job.create_time);
      }
    }
  }
  const bool phase_changed = from != job.phase;
  it->second = std::move(job);
  PublishJobChange(it->second, phase_changed);
  return absl::OkStatus();
}

void Scheduler::PublishJobChange(const JobRecord& job, bool phase_changed) {
  const bool terminal = IsTerminal(job.phase);
  if (terminal) logs_->MarkEnded(job.id);
  auto [begin, end] = watchers_.equal_range(job.id);
  if (begin == end) return;
  loom::v1::JobEvent event;
  *event.mutable_job() = JobRecordToProto(job);
  event.set_type(phase_changed ? "PhaseChanged" : "Progress");
  for (auto it = begin; it != end; ++it) it->second->Push(event);
  if (terminal) watchers_.erase(begin, end);  // their streams end with this event
}

absl::StatusOr<std::shared_ptr<JobSubscription>> Scheduler::WatchJob(
    const std::string& job_id, std::function<void()> on_event) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  auto waker = std::make_shared<Waker>(std::move(on_event));
  auto sub = std::make_shared<JobSubscription>(job_id, waker, dispatcher_.get());
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  loom::v1::JobEvent snapshot;
  *snapshot.mutable_job() = JobRecordToProto(it->second);
  snapshot.set_type("Snapshot");
  if (IsTerminal(it->second.phase)) {
    // An ended job: replay its retained phase changes (its restarts and why) first.
    for (const loom::internal::JobHistoryEntry& h : it->second.state.history()) {
      loom::v1::JobEvent past;
      *past.mutable_job() = snapshot.job();
      past.mutable_job()->set_phase(static_cast<JobPhase>(h.phase()));
      past.mutable_job()->set_reason(h.reason());
      past.mutable_job()->set_message(h.message());
      past.mutable_job()->set_attempt(h.attempt());
      past.set_type("History");
      SetTimestamp(absl::FromUnixMicros(h.time_us()), past.mutable_time());
      sub->Push(std::move(past));
    }
  }
  sub->Push(std::move(snapshot));
  if (!sub->ended()) watchers_.emplace(job_id, sub);
  return sub;
}

void Scheduler::Unwatch(const std::shared_ptr<JobSubscription>& subscription) {
  subscription->Cancel();  // outside mu_: waits for a running callback
  absl::MutexLock lock(&mu_);
  auto [begin, end] = watchers_.equal_range(subscription->job_id());
  for (auto it = begin; it != end; ++it) {
    if (it->second == subscription) {
      watchers_.erase(it);
      break;
    }
  }
}

absl::Status Scheduler::MarkSucceeded(const std::string& job_id, const std::string& message) {
  RETURN_IF_ERROR(
      EndJob(job_id, v1::JOB_PHASE_SUCCEEDED, v1::FAILURE_CLASS_UNSPECIFIED, "Succeeded", message));
  // Nothing resumes from the attempt's starting checkpoint any more (EndJob dropped it): apply
  // the retention policy once more without protecting it.
  ApplyRetention(jobs_.at(job_id));
  return absl::OkStatus();
}

absl::Status Scheduler::EndJob(const std::string& job_id, JobPhase phase,
                               loom::v1::FailureClass failure_class, const std::string& reason,
                               const std::string& message) {
  JobRecord job = jobs_.at(job_id);
  job.phase = phase;
  job.failure_class = failure_class;
  job.reason = reason;
  job.message = message;
  job.end_time = clock_->Now();
  RETURN_IF_ERROR(CommitJob(std::move(job)));
  LOG(INFO) << "job " << job_id << " " << JobPhaseName(phase) << ": " << message;
  last_step_advance_.erase(job_id);
  rank_progress_.Forget(job_id);
  step_seconds_.erase(job_id);
  stops_.erase(job_id);
  resume_from_.erase(job_id);  // no attempt of an ended job resumes
  StopLiveRanks(job_id, /*graceful=*/false);  // the job ended: no checkpoint, stop now
  return absl::OkStatus();
}

absl::Status Scheduler::FailAttempt(const std::string& job_id,
                                    loom::v1::FailureClass failure_class,
                                    const std::string& reason, const std::string& message,
                                    const std::string& suspect_node, bool no_restart) {
  const JobRecord& job = jobs_.at(job_id);
  // RECOVERING: the attempt already ended. PENDING: requeued (preempted, drained) and its
  // ranks are only being stopped; no attempt is running that could fail.
  if (IsTerminal(job.phase) || job.phase == v1::JOB_PHASE_RECOVERING ||
      job.phase == v1::JOB_PHASE_PENDING) {
    return absl::OkStatus();
  }
  if (job.phase == v1::JOB_PHASE_STOPPING) {
    // Cancelled and stopping: no restart; the final checkpoint cannot complete any more.
    return EscalateStop(job_id, message);
  }
  // Two budgets (docs/scheduling.md "Restart budgets"): infrastructure failures (lost node or
  // rank, hang, setup/rendezvous, gang-ready timeout) and the job's own failures.
  const bool infra = IsInfraClass(failure_class);
  const int32_t max_restarts =
      infra ? (!job.spec.has_max_infra_restarts() || job.spec.max_infra_restarts() < 0
                   ? options_.default_max_infra_restarts
                   : job.spec.max_infra_restarts())
            : job.spec.max_restarts();
  const int32_t restarts_used = infra ? job.state.infra_restarts() : job.state.user_restarts();
  const char* budget = infra ? "infra" : "user";
  if (no_restart) {
    return EndJob(job_id, v1::JOB_PHASE_FAILED, failure_class, reason,
                  absl::StrCat(message, " (attempt ", job.attempt,
                               "; a configuration error fails the same way every time: not "
                               "restarted)"));
  }
  if (restarts_used >= max_restarts) {
    std::string final_message = message;
    if (max_restarts > 0) {
      final_message = absl::StrCat(message, " (attempt ", job.attempt, "; all ", max_restarts,
                                   " ", budget, " restarts used)");
    }
    return EndJob(job_id, v1::JOB_PHASE_FAILED, failure_class, reason, final_message);
  }
  JobRecord updated = job;
  updated.phase = v1::JOB_PHASE_RECOVERING;
  updated.failure_class = failure_class;
  updated.reason = reason;
  if (infra) {
    updated.state.set_infra_restarts(restarts_used + 1);
  } else {
    updated.state.set_user_restarts(restarts_used + 1);
  }
  AddSuspect(&updated, suspect_node);
  updated.message = absl::StrCat("attempt ", job.attempt, " failed: ", message,
                                 "; restarting from the newest committed checkpoint (", budget,
                                 " restart ", restarts_used + 1, " of ", max_restarts, ")");
  const absl::Duration backoff =
      ExponentialBackoff(updated.state.user_restarts() + updated.state.infra_restarts(),
                         options_.restart_backoff_base, options_.restart_backoff_cap);
  if (backoff > absl::ZeroDuration() && updated.state.not_before_us() == 0) {
    // (A gang-ready timeout set its own, longer backoff already.)
    const absl::Time not_before = clock_->Now() + backoff;
    updated.state.set_not_before_us(absl::ToUnixMicros(not_before));
    absl::StrAppend(&updated.message, "; next attempt not before ", Utc(not_before),
                    " (backoff ", absl::FormatDuration(backoff), ")");
  }
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  if (metrics_ != nullptr) metrics_->JobRestarted(failure_class);
  LOG(WARNING) << "job " << job_id << " RECOVERING: " << jobs_.at(job_id).message;
  last_step_advance_.erase(job_id);
  rank_progress_.Forget(job_id);
  StopLiveRanks(job_id, /*graceful=*/false);
  return absl::OkStatus();
}

void Scheduler::StopLiveRanks(const std::string& job_id, bool graceful) {
  for (auto it = ranks_.lower_bound({job_id, 0});
       it != ranks_.end() && it->first.first == job_id;) {
    if (RankEnded(it->second.state)) {
      it = ranks_.erase(it);  // its slot is free; nothing to stop
    } else {
      it->second.stop_requested = true;
      it->second.graceful_stop = graceful;
      ++it;
    }
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

absl::Status Scheduler::JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

absl::StatusOr<loom::v1::Job> Scheduler::GetJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return JobRecordToProto(it->second);
}

absl::StatusOr<std::string> Scheduler::JobTenant(const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return it->second.tenant;
}

absl::StatusOr<std::vector<loom::v1::Job>> Scheduler::ListJobs(JobPhase phase) {
  absl::MutexLock lock(&mu_);
  std::vector<loom::v1::Job> out;
  for (const auto& [seq, id] : job_order_) {
    const JobRecord& job = jobs_.at(id);
    if (phase == v1::JOB_PHASE_UNSPECIFIED || job.phase == phase) {
      out.push_back(JobRecordToProto(job));
    }
  }
  return out;
}

absl::StatusOr<loom::v1::ListJobsResponse> Scheduler::ListJobsPage(
    const loom::v1::ListJobsRequest& request) {
  constexpr int kDefaultPageSize = 100, kMaxPageSize = 1000;
  // Well under gRPC's default 4 MB receive limit (a job's spec is at most kMaxJobSpecBytes).
  constexpr size_t kMaxPageBytes = 2 << 20;
  if (request.page_size() < 0 || request.page_size() > kMaxPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: must be in [0, ", kMaxPageSize,
                                                   "], got ", request.page_size()));
  }
  const int page_size = request.page_size() == 0 ? kDefaultPageSize : request.page_size();
  // Token: web-safe base64 of "after:<sequence>".
  int64_t after = 0;
  if (!request.page_token().empty()) {
    std::string decoded;
    if (!absl::WebSafeBase64Unescape(request.page_token(), &decoded) ||
        !absl::StartsWith(decoded, "after:") ||
        !absl::SimpleAtoi(decoded.substr(6), &after) || after < 0) {
      return absl::InvalidArgumentError("page_token: not a token from a previous ListJobs");
    }
  }
  absl::MutexLock lock(&mu_);
  loom::v1::ListJobsResponse page;
  size_t page_bytes = 0;
  int64_t last_sequence = after;
  for (auto it = job_order_.upper_bound(after); it != job_order_.end(); ++it) {
    const JobRecord& job = jobs_.at(it->second);
    if (request.phase() != v1::JOB_PHASE_UNSPECIFIED && job.phase != request.phase()) continue;
    if (!absl::StartsWith(job.spec.name(), request.name_prefix())) continue;
    if (!request.tenant().empty() && job.tenant != request.tenant()) continue;
    if (!request.queue().empty() &&
        QueueOf(job.spec) != request.queue()) {
      continue;
    }
    if (page.jobs_size() == page_size) {
      page.set_next_page_token(absl::WebSafeBase64Escape(absl::StrCat("after:", last_sequence)));
      break;
    }
    loom::v1::Job proto = JobRecordToProto(job);
    // Each repeated element costs its size plus a tag and a length prefix (at most 6 bytes).
    const size_t bytes = proto.ByteSizeLong() + 6;
    if (page.jobs_size() > 0 && page_bytes + bytes > kMaxPageBytes) {
      page.set_next_page_token(absl::WebSafeBase64Escape(absl::StrCat("after:", last_sequence)));
      break;
    }
    page_bytes += bytes;
    last_sequence = job.sequence;
    *page.add_jobs() = std::move(proto);
  }
  return page;
}

absl::StatusOr<loom::v1::ExplainPendingResponse> Scheduler::ExplainPending(
    const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  const JobRecord& job = it->second;
  loom::v1::ExplainPendingResponse out;
  out.set_phase(job.phase);
  out.set_reason(job.reason);
  out.set_message(job.message);
  const bool waiting = job.phase == v1::JOB_PHASE_PENDING || job.phase == v1::JOB_PHASE_RECOVERING;
  if (!waiting) return out;
  const AcceleratorKind kind = KindOf(job.spec);
  const std::vector<std::string>& order = queue_order_[kind];
  if (auto pos = std::find(order.begin(), order.end(), job_id); pos != order.end()) {
    // The order of the last scheduling cycle (priority, fair share, age); at most
    // kMaxJobsAhead of the jobs ahead are named.
    constexpr int kMaxJobsAhead = 100;
    const int position = static_cast<int>(pos - order.begin()) + 1;
    out.set_queue_position(position);
    for (int i = 0; i + 1 < position && i < kMaxJobsAhead; ++i) out.add_jobs_ahead(order[i]);
    return out;
  }
  // Not yet seen by a cycle: submission order among waiting jobs of its kind.
  int position = 0;
  for (const auto& [seq, id] : job_order_) {
    const JobRecord& other = jobs_.at(id);
    const bool other_waiting =
        other.phase == v1::JOB_PHASE_PENDING || other.phase == v1::JOB_PHASE_RECOVERING;
    if (!other_waiting || KindOf(other.spec) != kind) continue;
    ++position;
    if (id == job_id) break;
    out.add_jobs_ahead(id);
  }
  out.set_queue_position(position);
  return out;
}

absl::StatusOr<const JobRecord*> Scheduler::FindUnendedJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  if (IsTerminal(it->second.phase)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (",
                                                      JobPhaseName(it->second.phase), ")"));
  }
  return &it->second;
}

absl::StatusOr<loom::v1::Job> Scheduler::CancelJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobRecord* found, FindUnendedJob(job_id));
  const JobRecord& job = *found;
  if (job.phase == v1::JOB_PHASE_STOPPING) return JobRecordToProto(job);  // already stopping
  if (job.phase != v1::JOB_PHASE_RUNNING) {
    // Not training (yet): nothing to checkpoint. STARTING ranks may still wait for their
    // peers' rendezvous, so they cannot agree on a step to stop at; stop them now.
    std::string message = absl::StrCat("cancelled by request while ", JobPhaseName(job.phase));
    if (job.phase == v1::JOB_PHASE_STARTING || job.phase == v1::JOB_PHASE_RECOVERING) {
      absl::StrAppend(&message, " (no final checkpoint; ",
                      job.progress.last_checkpoint_step() > 0
                          ? absl::StrCat("newest checkpoint at step ",
                                         job.progress.last_checkpoint_step())
                          : std::string("no checkpoint written"),
                      ")");
    }
    RETURN_IF_ERROR(EndJob(job_id, v1::JOB_PHASE_CANCELLED, v1::FAILURE_CLASS_UNSPECIFIED,
                           "Cancelled", message));
    UpdateGauges();
    return JobRecordToProto(jobs_.at(job_id));
  }
  JobRecord updated = job;
  updated.phase = v1::JOB_PHASE_STOPPING;
  updated.reason = "Stopping";
  updated.message = absl::StrCat(
      "cancel requested: the ranks write a final checkpoint, then stop (killed if not stopped "
      "within ", absl::FormatDuration(options_.cancel_grace), ")");
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  StopRequest& stop = stops_[job_id];
  stop = StopRequest();
  stop.deadline = clock_->Now() + options_.cancel_grace;
  for (auto r = ranks_.lower_bound({job_id, 0}); r != ranks_.end() && r->first.first == job_id;
       ++r) {
    r->second.stop_requested = true;
    r->second.graceful_stop = true;
  }
  LOG(INFO) << "job " << job_id << " STOPPING: " << jobs_.at(job_id).message;
  UpdateGauges();
  return JobRecordToProto(jobs_.at(job_id));
}

absl::StatusOr<loom::v1::Job> Scheduler::KillJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobRecord* found, FindUnendedJob(job_id));
  const JobRecord& job = *found;
  std::string message = absl::StrCat("killed by request while ", JobPhaseName(job.phase),
                                     ": ranks stopped without a final checkpoint");
  if (job.progress.last_checkpoint_step() > 0) {
    absl::StrAppend(&message, " (newest checkpoint at step ", job.progress.last_checkpoint_step(),
                    ")");
  }
  RETURN_IF_ERROR(EndJob(job_id, v1::JOB_PHASE_CANCELLED, v1::FAILURE_CLASS_UNSPECIFIED,
                         "Killed", message));
  UpdateGauges();
  return JobRecordToProto(jobs_.at(job_id));
}

void Scheduler::RecordStoppingRank(const loom::v1::RankStatus& st, const std::string& node_id) {
  auto stop_it = stops_.find(st.job_id());
  if (stop_it == stops_.end()) return;
  StopRequest& stop = stop_it->second;
  if (st.state() == v1::RANK_STATE_SUCCEEDED) {
    stop.training_finished = true;  // the last step came before the stop
    if (st.rank() == 0) stop.final_checkpoint_step = st.progress().last_checkpoint_step();
  } else if (st.state() == v1::RANK_STATE_STOPPED && st.graceful_stop()) {
    if (st.rank() == 0) stop.final_checkpoint_step = st.progress().last_checkpoint_step();
  } else if (RankEnded(st.state()) && !stop.escalated) {
    // Failed, or stopped without its checkpoint: the peers cannot complete theirs.
    (void)EscalateStop(st.job_id(), RankExitMessage(st.rank(), node_id, st));
  }
}

absl::Status Scheduler::EscalateStop(const std::string& job_id, const std::string& why) {
  auto stop_it = stops_.find(job_id);
  if (stop_it == stops_.end() || stop_it->second.escalated) return absl::OkStatus();
  stop_it->second.escalated = true;
  stop_it->second.escalation = why;
  for (auto r = ranks_.lower_bound({job_id, 0}); r != ranks_.end() && r->first.first == job_id;
       ++r) {
    r->second.graceful_stop = false;
  }
  JobRecord updated = jobs_.at(job_id);
  updated.message = absl::StrCat("cancel requested; graceful stop abandoned (", why,
                                 "): killing the ranks");
  LOG(WARNING) << "job " << job_id << ": " << updated.message;
  return CommitJob(std::move(updated));
}

absl::Status Scheduler::FinishStops() {
  std::vector<std::string> done;
  for (const auto& [job_id, stop] : stops_) {
    auto r = ranks_.lower_bound({job_id, 0});
    if (r == ranks_.end() || r->first.first != job_id) done.push_back(job_id);
  }
  for (const std::string& job_id : done) {
    const StopRequest stop = stops_.at(job_id);
    const JobRecord& job = jobs_.at(job_id);
    if (job.phase != v1::JOB_PHASE_STOPPING) {
      stops_.erase(job_id);
      continue;
    }
    const int64_t newest = job.progress.last_checkpoint_step();
    const std::string newest_text =
        newest > 0 ? absl::StrCat("newest checkpoint at step ", newest) : "no checkpoint written";
    std::string message;
    if (stop.escalated) {
      message = absl::StrCat("cancelled by request; the graceful stop was abandoned (",
                             stop.escalation, ") and the ranks were killed without a final "
                             "checkpoint (", newest_text, ")");
    } else if (stop.training_finished) {
      message = absl::StrCat("cancelled by request, but training had finished first; final "
                             "checkpoint at step ", stop.final_checkpoint_step);
    } else if (stop.final_checkpoint_step >= 0) {
      message = absl::StrCat("cancelled by request; final checkpoint written at step ",
                             stop.final_checkpoint_step);
    } else {
      message = absl::StrCat("cancelled by request; the ranks ended without confirming a final "
                             "checkpoint (", newest_text, ")");
    }
    RETURN_IF_ERROR(EndJob(job_id, v1::JOB_PHASE_CANCELLED, v1::FAILURE_CLASS_UNSPECIFIED,
                           "Cancelled", message));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::CheckStops() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> late;
  for (const auto& [job_id, stop] : stops_) {
    if (!stop.escalated && now > stop.deadline) late.push_back(job_id);
  }
  for (const std::string& job_id : late) {
    RETURN_IF_ERROR(EscalateStop(
        job_id, absl::StrCat("the ranks did not stop within ",
                             absl::FormatDuration(options_.cancel_grace))));
  }
  return FinishStops();
}

absl::StatusOr<absl::Duration> Scheduler::RegisterWorker(const std::string& node_id,
                                                         const loom::v1::NodeInventory& inventory) {
  if (node_id.empty()) return absl::InvalidArgumentError("node_id: required");
  RETURN_IF_ERROR(CheckIdLength("node_id", node_id));
  if (inventory.slots() < 1 || inventory.slots() > kMaxSlotsPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("inventory.slots: must be in [1, ",
                                                   kMaxSlotsPerNode, "], got ", inventory.slots()));
  }
  if (!loom::v1::AcceleratorKind_IsValid(inventory.accelerator())) {
    return absl::InvalidArgumentError(
        absl::StrCat("inventory.accelerator: unknown kind ", inventory.accelerator()));
  }
  if (inventory.accelerator_memory_bytes() < 0 || inventory.host_memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inventory.accelerator_memory_bytes / host_memory_bytes: must be >= 0, got ",
        inventory.accelerator_memory_bytes(), " / ", inventory.host_memory_bytes()));
  }
  if (!inventory.cpu_arch().empty() && inventory.cpu_arch() != "x86_64" &&
      inventory.cpu_arch() != "aarch64") {
    return absl::InvalidArgumentError(absl::StrCat("inventory.cpu_arch: must be x86_64 or aarch64, got '",
                                                   absl::CEscape(inventory.cpu_arch().substr(0, 32)), "'"));
  }
  for (const auto& [key, value] : inventory.labels()) {
    if (key.empty() || key.size() > 63 || value.size() > 63) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inventory.labels: keys must be 1-63 bytes and values at most 63 bytes (key '",
          absl::CEscape(key.substr(0, 32)), "')"));
    }
  }
  absl::MutexLock lock(&mu_);
  NodeRecord node;
  node.id = node_id;
  if (auto known = nodes_.find(node_id); known != nodes_.end()) {
    node.admin = known->second.admin;  // cordon/drain survive re-registration
  }
  node.inventory = inventory;
  if (node.inventory.accelerator() == v1::ACCELERATOR_KIND_UNSPECIFIED) {
    node.inventory.set_accelerator(v1::ACCELERATOR_KIND_CPU);
  }
  node.last_heartbeat_time = clock_->Now();
  node.lost = false;
  RETURN_IF_ERROR(store_->UpsertNode(node));
  awaiting_reregistration_.erase(node_id);
  const bool known = nodes_.count(node_id) > 0;
  nodes_[node_id] = std::move(node);
  LOG(INFO) << "node " << node_id << (known ? " re-registered: " : " registered: ")
            << inventory.slots() << " " << KindName(nodes_[node_id].inventory.accelerator())
            << " slots at " << NodeAddress(nodes_[node_id]);
  UpdateGauges();
  return options_.heartbeat_interval;
}

absl::StatusOr<loom::v1::HeartbeatResponse> Scheduler::Heartbeat(
    const loom::v1::HeartbeatRequest& request) {
  RETURN_IF_ERROR(CheckIdLength("node_id", request.node_id()));
  // Output lines first, without the scheduler's lock (the buffer has its own, and deduplicates
  // lines of a retried heartbeat by sequence).
  for (const loom::v1::RankStatus& st : request.ranks()) {
    logs_->Append(st.job_id(), st.attempt(), st.rank(), st.log_lines());
  }
  absl::MutexLock lock(&mu_);
  const std::string& node_id = request.node_id();
  auto node_it = nodes_.find(node_id);
  if (node_it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is not registered; register again"));
  }
  if (node_it->second.lost) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " was declared lost; register again"));
  }
  {
    NodeRecord updated = node_it->second;
    updated.last_heartbeat_time = clock_->Now();
    RETURN_IF_ERROR(store_->UpsertNode(updated));
    node_it->second = std::move(updated);
    awaiting_reregistration_.erase(node_id);
  }

  loom::v1::HeartbeatResponse response;
  std::map<std::pair<std::string, int32_t>, bool> stops;  // (job id, attempt) -> graceful
  auto add_stop = [&stops](const std::string& job_id, int32_t attempt, bool graceful) {
    auto [it, inserted] = stops.emplace(std::make_pair(job_id, attempt), graceful);
    if (!inserted) it->second = it->second && graceful;  // a kill overrides a graceful stop
  };
  std::set<RankKey> seen;
  std::set<std::string> touched_jobs;

  for (const loom::v1::RankStatus& st : request.ranks()) {
    const RankKey key{st.job_id(), st.rank()};
    auto rt_it = ranks_.find(key);
    const bool ours = rt_it != ranks_.end() && rt_it->second.attempt == st.attempt() &&
                      rt_it->second.node_id == node_id;
    if (!ours) {
      // An old attempt, an ended job, or a rank placed elsewhere: it must not keep running.
      if (!RankEnded(st.state())) add_stop(st.job_id(), st.attempt(), false);
      continue;
    }
    RankRuntime& rt = rt_it->second;
    seen.insert(key);
    const RankState previous = rt.state;
    rt.reported = true;
    rt.state = st.state();
    const auto job_it = jobs_.find(st.job_id());
    if (job_it != jobs_.end() && job_it->second.phase == v1::JOB_PHASE_STOPPING) {
      // Graceful stop in progress: keep rank 0's progress (its final checkpoint step).
      if (st.rank() == 0 && st.has_progress()) {
        JobRecord updated = job_it->second;
        updated.progress = MergeProgress(job_it->second.progress, st.progress());
        if (updated.progress.total_steps() == 0) {
          updated.progress.set_total_steps(updated.spec.training().steps());
        }
        if (!google::protobuf::util::MessageDifferencer::Equals(updated.progress,
                                                                job_it->second.progress)) {
          RETURN_IF_ERROR(CommitJob(std::move(updated)));
        }
      }
      const bool graceful = rt.graceful_stop;
      if (RankEnded(st.state())) {
        RecordStoppingRank(st, node_id);
        ranks_.erase(key);
      } else {
        add_stop(st.job_id(), st.attempt(), graceful);
      }
      continue;
    }
    if (rt.stop_requested || job_it == jobs_.end() || IsTerminal(job_it->second.phase)) {
      // A rank of an attempt that already failed: perhaps the real cause, reporting late.
      if (st.state() == v1::RANK_STATE_FAILED) {
        RETURN_IF_ERROR(ReconsiderBlame(st, node_id));
        rt_it = ranks_.find(key);  // ending the job may have forgotten this ended rank
        if (rt_it == ranks_.end()) continue;
      }
      if (RankEnded(st.state())) {
        ranks_.erase(rt_it);
      } else {
        add_stop(st.job_id(), st.attempt(), false);
      }
      continue;
    }
    JobRecord& job = job_it->second;
    // Every rank's step, not only rank 0's: any stepping rank proves the gang alive
    // (CheckNodeLiveness), also while rank 0's own worker is silent.
    if (st.has_progress()) {
      rank_progress_.Observe(job.id, st.attempt(), st.rank(), st.progress().step(), clock_->Now());
    }
    if (st.rank() == 0 && (st.rendezvous_port() < 0 || st.rendezvous_port() > 65535)) {
      // A broken worker: handing ranks 1..N-1 this port would only fail their rendezvous later.
      RETURN_IF_ERROR(FailAttempt(st.job_id(), v1::FAILURE_CLASS_SETUP, "RendezvousFailed",
                                  absl::StrCat("rank 0 on node ", node_id,
                                               " reported rendezvous port ", st.rendezvous_port(),
                                               ", outside [1, 65535]"),
                                  node_id));
      continue;
    }
    if (st.rank() == 0) {
      JobRecord updated = job;
      if (st.rendezvous_port() > 0 && job.rendezvous_port == 0) {
        updated.rendezvous_port = st.rendezvous_port();
        if (updated.phase == v1::JOB_PHASE_STARTING) {
          updated.message = absl::StrCat("attempt ", job.attempt, ": rank 0 rendezvous at ",
                                         NodeAddress(node_it->second), ":", st.rendezvous_port(),
                                         "; waiting for every rank to run");
        }
        LOG(INFO) << "job " << job.id << " attempt " << job.attempt << ": rank 0 rendezvous at "
                  << NodeAddress(node_it->second) << ":" << st.rendezvous_port();
      }
      if (st.has_progress()) {
        if (st.progress().last_checkpoint_step() > job.progress.last_checkpoint_step()) {
          ApplyRetention(job);
        }
        if (st.progress().step() > job.progress.step()) {
          RecordStepAdvance(job.id, job.progress.step(), st.progress().step());
        }
        updated.progress = MergeProgress(job.progress, st.progress());
        if (updated.progress.total_steps() == 0) {
          updated.progress.set_total_steps(job.spec.training().steps());
        }
      }
      if (updated.rendezvous_port != job.rendezvous_port || updated.message != job.message ||
          !google::protobuf::util::MessageDifferencer::Equals(updated.progress, job.progress)) {
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
      }
    }
    if (st.state() == v1::RANK_STATE_FAILED || st.state() == v1::RANK_STATE_STOPPED) {
      const bool had_run = previous == v1::RANK_STATE_RUNNING;
      // A rank that lost a peer fails with a collective error ("connection reset"); the peer's
      // node, gone silent, is the likely cause and the better suspect.
      std::string suspect = node_id;
      std::string message = RankExitMessage(st.rank(), node_id, st);
      const absl::Time now = clock_->Now();
      for (const std::string& peer : job.rank_nodes) {
        auto n = nodes_.find(peer);
        if (peer == node_id || n == nodes_.end()) continue;
        const absl::Duration silent = now - n->second.last_heartbeat_time;
        if (silent > 2 * options_.heartbeat_interval) {
          suspect = peer;
          absl::StrAppend(&message, " (node ", peer, ", with another rank of this job, has not "
                          "heartbeated for ", absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
                          ": likely the cause)");
          break;
        }
      }
      // Losing a peer whose node went silent is an infrastructure failure (infra budget).
      const RankExitClass exit = ClassifyRankExit(st, had_run);
      const bool own = suspect == node_id;
      // A rank that only saw a peer go away is charged provisionally to the infra budget while
      // it has restarts left (else the user's): the peer's own report re-attributes the failure
      // and moves the restart to the real cause's budget (restart_attribution.cc).
      const bool infra_left =
          job.state.infra_restarts() <
          (!job.spec.has_max_infra_restarts() || job.spec.max_infra_restarts() < 0
               ? options_.default_max_infra_restarts
               : job.spec.max_infra_restarts());
      const bool provisional =
          own && SawPeerGoAway(st) && exit.failure_class == v1::FAILURE_CLASS_USER && infra_left;
      const loom::v1::FailureClass failure_class =
          own && !provisional ? exit.failure_class : v1::FAILURE_CLASS_INFRA;
      const int32_t attempt = job.attempt;
      RETURN_IF_ERROR(FailAttempt(st.job_id(), failure_class, own ? exit.reason : "RankFailed",
                                  message, suspect, own && exit.final));
      RecordBlame(st.job_id(), attempt, st, node_id, message, failure_class);
      continue;
    }
    touched_jobs.insert(st.job_id());
  }

  // Ranks this node reported before but no longer does: the worker lost them. Ranks that
  // were asked to stop and are not reported are gone: their slots are free.
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    RankRuntime& rt = it->second;
    if (rt.node_id != node_id || seen.count(it->first)) {
      ++it;
      continue;
    }
    if (rt.stop_requested) {
      it = ranks_.erase(it);
      continue;
    }
    if (rt.reported && !RankEnded(rt.state)) {
      const std::string job_id = it->first.first;
      const int32_t rank = it->first.second;
      ++it;  // EndJob may erase entries of this job; resume from a fresh lookup below
      RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "RankLost",
                                  absl::StrCat("rank ", rank, " on node ", node_id,
                                               " is no longer reported by its worker"),
                                  node_id));
      touched_jobs.erase(job_id);
      it = ranks_.upper_bound({job_id, rank});
      continue;
    }
    ++it;
  }

  for (const std::string& job_id : touched_jobs) RETURN_IF_ERROR(AdvanceJob(job_id));
  RETURN_IF_ERROR(FinishStops());

  // Replies: assignments not yet acknowledged, and stops.
  for (auto& [key, rt] : ranks_) {
    if (rt.node_id != node_id) continue;
    if (rt.stop_requested) {
      add_stop(key.first, rt.attempt, rt.graceful_stop);
      continue;
    }
    if (rt.reported) continue;
    const JobRecord& job = jobs_.at(key.first);
    if (key.second != 0 && job.rendezvous_port == 0) continue;  // wait for rank 0's port
    *response.add_start() = StartAssignment(job, key.second);
  }
  for (const auto& [job_attempt, graceful] : stops) {
    loom::v1::RankAssignment* stop = response.add_stop();
    stop->set_job_id(job_attempt.first);
    stop->set_attempt(job_attempt.second);
    stop->set_graceful_stop(graceful);
  }
  // Not the per-tenant job counts: they walk every job, and heartbeats arrive from every node
  // every interval. Each scheduling cycle and the RPCs that change jobs refresh those.
  UpdateGauges(/*with_tenant_counts=*/false);
  return response;
}

loom::v1::RankAssignment Scheduler::StartAssignment(const JobRecord& job, int32_t rank) const {
  loom::v1::RankAssignment a;
  a.set_job_id(job.id);
  a.set_attempt(job.attempt);
  a.set_rank(rank);
  a.set_world_size(static_cast<int32_t>(job.rank_nodes.size()));
  *a.mutable_spec() = job.spec;
  auto node = nodes_.find(job.rank_nodes.at(0));
  a.set_master_addr(node == nodes_.end() ? job.rank_nodes.at(0) : NodeAddress(node->second));
  a.set_master_port(job.rendezvous_port);
  a.set_checkpoint_dir(job.checkpoint_dir);
  a.set_tenant(job.tenant);
  if (job.attempt > 1) {
    auto r = resume_from_.find(job.id);
    if (r != resume_from_.end()) a.set_resume_from(r->second.path);
  }
  return a;
}

absl::Status Scheduler::AdvanceJob(const std::string& job_id) {
  const JobRecord& job = jobs_.at(job_id);
  if (IsTerminal(job.phase)) return absl::OkStatus();
  int total = 0, running_or_done = 0, succeeded = 0;
  for (auto it = ranks_.lower_bound({job_id, 0}); it != ranks_.end() && it->first.first == job_id;
       ++it) {
    ++total;
    if (it->second.state == v1::RANK_STATE_SUCCEEDED) ++succeeded;
    if (it->second.state == v1::RANK_STATE_SUCCEEDED || it->second.state == v1::RANK_STATE_RUNNING) {
      ++running_or_done;
    }
  }
  if (total == 0 || total != static_cast<int>(job.rank_nodes.size())) return absl::OkStatus();
  if (succeeded == total) {
    return MarkSucceeded(job_id, absl::StrCat("all ", total, " ranks succeeded"));
  }
  if (running_or_done == total && job.phase == v1::JOB_PHASE_STARTING) {
    JobRecord updated = job;
    updated.phase = v1::JOB_PHASE_RUNNING;
    updated.state.set_ready_timeouts(0);  // the gang came up: backoff starts over
    updated.reason = "Running";
    updated.message = absl::StrCat("all ", total, " ranks running");
    RETURN_IF_ERROR(CommitJob(std::move(updated)));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::RunSchedulingCycle() {
  const absl::Time started = absl::Now();  // real time: this measures our own compute
  std::vector<std::pair<std::string, int32_t>> requested;  // (job id, attempt): new lookups
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckNodeLiveness());
    RETURN_IF_ERROR(CheckHangs());
    RETURN_IF_ERROR(CheckStops());
    RETURN_IF_ERROR(CheckReadyTimeouts());
    // Jobs that may be placed again this cycle need their resume checkpoint: waiting for a new
    // attempt, and every rank of the previous one ended. The lookups run on the checkpoint
    // worker's thread (checkpoint_worker.h), never under this lock nor in this loop.
    std::vector<std::string> wanted;
    for (const auto& [job_id, job] : jobs_) {
      if (job.attempt == 0 ||
          (job.phase != v1::JOB_PHASE_PENDING && job.phase != v1::JOB_PHASE_RECOVERING)) {
        continue;
      }
      auto r = ranks_.lower_bound({job_id, 0});
      if (r != ranks_.end() && r->first.first == job_id) continue;
      wanted.push_back(job_id);
      if (checkpoint_worker_->RequestResume(job_id, job.attempt, job.checkpoint_dir)) {
        requested.emplace_back(job_id, job.attempt);
      }
    }
    checkpoint_worker_->RetainResume(wanted);  // forgets jobs placed or ended meanwhile
  }
  // A lookup asked for just now usually answers at once (a local catalog, a healthy service):
  // give it resume_lookup_wait, off the lock, so that the job is placed in this cycle. A slow
  // service delays only this; lookups already in flight are not waited for again.
  if (!requested.empty()) {
    checkpoint_worker_->AwaitResume(requested, options_.resume_lookup_wait);
  }
  absl::MutexLock lock(&mu_);
  std::map<std::string, absl::StatusOr<CommittedCheckpoint>> results;
  for (const auto& [job_id, job] : jobs_) {
    if (job.attempt == 0 ||
        (job.phase != v1::JOB_PHASE_PENDING && job.phase != v1::JOB_PHASE_RECOVERING)) {
      continue;
    }
    std::optional<CheckpointWorker::ResumeAnswer> answer =
        checkpoint_worker_->Resume(job_id, job.attempt);
    if (answer.has_value()) results.emplace(job_id, std::move(answer->result));
  }
  prefetched_resume_ = std::move(results);
  // Job writes of the placement pass are collected and stored in one transaction (one fsync)
  // before the lock is released, so no heartbeat reply can hand out a placement that is not
  // durable.
  std::map<std::string, JobRecord> deferred;
  deferred_writes_ = &deferred;
  absl::Status placed = PlacePendingJobs();
  deferred_writes_ = nullptr;
  prefetched_resume_.clear();
  if (!deferred.empty()) {
    std::vector<JobRecord> records;
    records.reserve(deferred.size());
    for (auto& [id, record] : deferred) records.push_back(std::move(record));
    absl::Status stored = store_->UpdateJobs(records);
    if (!stored.ok()) {
      // Memory is ahead of the store: reload the last durable state.
      LOG(ERROR) << "storing " << records.size() << " job updates of a scheduling cycle failed ("
                 << stored << "); reloading the scheduler state from the store";
      Resync();
      return stored;
    }
  }
  RETURN_IF_ERROR(placed);
  UpdateGauges();
  if (metrics_ != nullptr) metrics_->ObserveSchedulingCycle(absl::Now() - started);
  return absl::OkStatus();
}

absl::StatusOr<CommittedCheckpoint> Scheduler::PrefetchedResume(const std::string& job_id) {
  auto it = prefetched_resume_.find(job_id);
  if (it == prefetched_resume_.end()) {
    return absl::UnavailableError("lookup in progress (the checkpoint catalog has not answered yet)");
  }
  return it->second;
}

void Scheduler::ApplyRetention(const JobRecord& job) {
  const loom::v1::CheckpointPolicy& policy = job.spec.checkpoint();
  if (policy.keep_last() <= 0) return;  // keep everything
  CheckpointWorker::RetentionTask task;
  task.checkpoint_dir = job.checkpoint_dir;
  task.policy = policy;
  if (auto r = resume_from_.find(job.id); r != resume_from_.end()) {
    task.protected_steps.push_back(r->second.step);  // the current attempt may still need it
  }
  // Off the lock, retried with backoff; a newer request for the job replaces one queued.
  checkpoint_worker_->RequestRetention(job.id, std::move(task));
}

void Scheduler::WaitForCheckpointRetention() { checkpoint_worker_->WaitForRetention(); }

void Scheduler::RecordStepAdvance(const std::string& job_id, int64_t from_step,
                                  int64_t to_step) {
  const absl::Time now = clock_->Now();
  auto last = last_step_advance_.find(job_id);
  // The first report of an attempt (from_step may be a resumed or stale step) gives no interval.
  if (last != last_step_advance_.end() && from_step > 0 && to_step > from_step) {
    std::deque<double>& window = step_seconds_[job_id];
    window.push_back(absl::ToDoubleSeconds(now - last->second) /
                     static_cast<double>(to_step - from_step));
    if (window.size() > 32) window.pop_front();
  }
  last_step_advance_[job_id] = now;
}

absl::Status Scheduler::CheckHangs() {
  const absl::Time now = clock_->Now();
  std::vector<std::pair<std::string, std::string>> hung;  // (job id, message)
  for (const auto& [job_id, job] : jobs_) {
    if (job.phase != v1::JOB_PHASE_RUNNING) continue;
    auto last = last_step_advance_.find(job_id);
    const double median_s = MedianStepSeconds(job_id);  // 0 until 3 steps were timed
    if (last == last_step_advance_.end() || median_s <= 0) continue;
    const absl::Duration threshold =
        std::max(options_.hang_min_timeout, absl::Seconds(options_.hang_step_time_factor * median_s));
    const absl::Duration idle = now - last->second;
    if (idle > threshold) {
      hung.emplace_back(job_id, absl::StrCat("no step progress for ",
                                             absl::FormatDuration(absl::Trunc(idle, absl::Seconds(1))),
                                             " after step ", job.progress.step(), " (limit ",
                                             absl::FormatDuration(absl::Trunc(threshold, absl::Seconds(1))),
                                             ", median step time ", absl::StrFormat("%.3f", median_s),
                                             " s)"));
    }
  }
  for (const auto& [job_id, message] : hung) {
    LOG(WARNING) << "job " << job_id << " hung: " << message;
    last_step_advance_.erase(job_id);
  rank_progress_.Forget(job_id);
    step_seconds_.erase(job_id);
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "Hang", message, ""));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::CheckNodeLiveness() {
  const absl::Time now = clock_->Now();
  for (auto& [node_id, node] : nodes_) {
    // Not heard from since this scheduler started: at least the re-registration grace.
    const absl::Duration timeout =
        awaiting_reregistration_.count(node_id) > 0
            ? std::max(options_.heartbeat_timeout, options_.reregistration_grace)
            : options_.heartbeat_timeout;
    if (node.lost || now - node.last_heartbeat_time <= timeout) continue;
    // Missed heartbeats alone do not make a node lost while a job with a rank on it is still
    // stepping (any of its ranks, reporting through another node, advanced within the timeout;
    // rank_progress.h): the gang's collectives cannot progress without that node's ranks, so
    // they are alive. The node is then "unreachable" (NodeInfo.unreachable): kept, but given no
    // new ranks until it heartbeats again.
    std::string stepping_job;
    for (const auto& [key, rt] : ranks_) {
      if (rt.node_id != node_id) continue;
      std::optional<absl::Time> advanced = rank_progress_.LastAdvance(key.first);
      auto rank0 = last_step_advance_.find(key.first);
      if (rank0 != last_step_advance_.end() &&
          (!advanced.has_value() || rank0->second > *advanced)) {
        advanced = rank0->second;
      }
      if (advanced.has_value() && now - *advanced <= options_.heartbeat_timeout) {
        stepping_job = key.first;
        break;
      }
    }
    if (!stepping_job.empty()) {
      LOG_EVERY_N(WARNING, 20) << "node " << node_id << " has not heartbeated for "
                               << absl::FormatDuration(now - node.last_heartbeat_time)
                               << " but job " << stepping_job
                               << " on it is still stepping; node unreachable, not lost";
      continue;
    }
    NodeRecord updated = node;
    updated.lost = true;
    RETURN_IF_ERROR(store_->UpsertNode(updated));
    node = std::move(updated);
    const std::string message = absl::StrCat(
        "node ", node_id, " lost: no heartbeat for ",
        absl::FormatDuration(absl::Trunc(now - node.last_heartbeat_time, absl::Milliseconds(1))),
        " (timeout ", absl::FormatDuration(timeout), ")");
    LOG(WARNING) << message;
    std::set<std::string> affected;
    for (auto it = ranks_.begin(); it != ranks_.end();) {
      if (it->second.node_id == node_id) {
        affected.insert(it->first.first);
        it = ranks_.erase(it);  // the node is gone, and so are its ranks
      } else {
        ++it;
      }
    }
    for (const std::string& job_id : affected) {
      // Rank 0 reports SUCCEEDED only after the trainers' final barrier, which every rank
      // reaches after writing its last checkpoint shard: the lost node's ranks had finished.
      auto rank0 = ranks_.find({job_id, 0});
      if (rank0 != ranks_.end() && rank0->second.state == v1::RANK_STATE_SUCCEEDED &&
          !IsTerminal(jobs_.at(job_id).phase) &&
          jobs_.at(job_id).phase != v1::JOB_PHASE_STOPPING) {
        RETURN_IF_ERROR(MarkSucceeded(
            job_id, absl::StrCat("training completed (rank 0 passed the final barrier of all ",
                                 jobs_.at(job_id).rank_nodes.size(), " ranks); ", message,
                                 " afterwards")));
        continue;
      }
      if (jobs_.at(job_id).phase == v1::JOB_PHASE_RECOVERING) {
        // The attempt already ended (typically a peer rank failing with a collective error when
        // this node died): name the lost node in the job's message and avoid it.
        JobRecord updated = jobs_.at(job_id);
        // Onto the failure message (the in-memory one may be a pending reason by now).
        updated.message = absl::StrCat(PhaseMessage(updated), "; then ", message,
                                       ": likely the cause");
        auto* history = updated.state.mutable_history();
        if (!history->empty() && history->rbegin()->phase() == updated.phase) {
          history->rbegin()->set_message(updated.message.substr(0, kMaxHistoryMessageBytes));
        }
        AddSuspect(&updated, node_id);
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
        continue;
      }
      RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "NodeLost", message, node_id));
    }
  }
  return absl::OkStatus();
}

void Scheduler::SetPendingReason(JobRecord& job, const std::string& reason,
                                 const std::string& message) {
  // In memory only: a waiting job's reason and message are recomputed by every cycle (also the
  // first one after a restart), so storing each change would only cost a write per job and
  // cycle. The record is stored with its latest reason at its next phase change.
  job.reason = reason;
  job.message = message;
}

double Scheduler::MedianStepSeconds(const std::string& job_id) const {
  auto window = step_seconds_.find(job_id);
  if (window == step_seconds_.end() || window->second.size() < 3) return 0;
  std::vector<double> sorted(window->second.begin(), window->second.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  return sorted[sorted.size() / 2];
}

absl::Status Scheduler::RequeueJob(const std::string& job_id, const std::string& reason,
                                   const std::string& message, bool preempted) {
  const JobRecord& job = jobs_.at(job_id);
  if (job.phase != v1::JOB_PHASE_STARTING && job.phase != v1::JOB_PHASE_RUNNING) {
    return absl::OkStatus();
  }
  JobRecord updated = job;
  updated.phase = v1::JOB_PHASE_PENDING;
  updated.reason = reason;
  updated.message = message;
  updated.failure_class = preempted ? v1::FAILURE_CLASS_PREEMPTED : v1::FAILURE_CLASS_UNSPECIFIED;
  if (preempted) updated.state.set_preemptions(updated.state.preemptions() + 1);
  updated.state.set_attempt_start_us(0);
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  if (preempted && metrics_ != nullptr) metrics_->JobRestarted(v1::FAILURE_CLASS_PREEMPTED);
  LOG(WARNING) << "job " << job_id << " requeued (" << reason << "): " << message;
  last_step_advance_.erase(job_id);
  rank_progress_.Forget(job_id);
  StopLiveRanks(job_id, /*graceful=*/false);
  return absl::OkStatus();
}

absl::Status Scheduler::CheckReadyTimeouts() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> expired;
  for (const auto& [job_id, job] : jobs_) {
    if (job.phase != v1::JOB_PHASE_STARTING || job.state.attempt_start_us() <= 0) continue;
    if (now - absl::FromUnixMicros(job.state.attempt_start_us()) > options_.ready_timeout) {
      expired.push_back(job_id);
    }
  }
  for (const std::string& job_id : expired) {
    JobRecord& job = jobs_.at(job_id);
    const int32_t k = job.state.ready_timeouts() + 1;
    const absl::Duration backoff =
        ExponentialBackoff(k, options_.ready_backoff_base, options_.ready_backoff_cap);
    // Persisted by FailAttempt's commit below.
    job.state.set_ready_timeouts(k);
    job.state.set_not_before_us(absl::ToUnixMicros(now + backoff));
    int running = 0;
    std::string suspect;
    std::vector<std::string> not_running;
    for (auto it = ranks_.lower_bound({job_id, 0}); it != ranks_.end() && it->first.first == job_id;
         ++it) {
      if (it->second.state == v1::RANK_STATE_RUNNING ||
          it->second.state == v1::RANK_STATE_SUCCEEDED) {
        ++running;
      } else {
        if (suspect.empty()) suspect = it->second.node_id;
        if (not_running.size() < 4) {
          not_running.push_back(absl::StrCat("rank ", it->first.second, " on ", it->second.node_id));
        }
      }
    }
    const std::string message = absl::StrCat(
        "only ", running, " of ", job.rank_nodes.size(), " ranks running ",
        absl::FormatDuration(options_.ready_timeout), " after placement (not running: ",
        absl::StrJoin(not_running, ", "), "); gang-ready timeout ", k, ", next attempt not before ",
        Utc(now + backoff), " (backoff ", absl::FormatDuration(backoff), ")");
    LOG(WARNING) << "job " << job_id << ": " << message;
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "ReadyTimeout", message, suspect));
  }
  return absl::OkStatus();
}

void Scheduler::UpdateGauges(bool with_tenant_counts) {
  if (metrics_ == nullptr) return;
  metrics_->SetJobCounts(phase_counts_);
  int live = 0, lost = 0, free = 0, used = 0;
  std::map<std::string, int> used_by_node;  // one pass over the ranks, not one per node
  for (const auto& [key, rt] : ranks_) {
    if (!RankEnded(rt.state)) ++used_by_node[rt.node_id];
  }
  for (const auto& [node_id, node] : nodes_) {
    if (node.lost) {
      ++lost;
      continue;
    }
    ++live;
    auto u_it = used_by_node.find(node_id);
    const int u = u_it == used_by_node.end() ? 0 : u_it->second;
    used += u;
    free += std::max(0, node.inventory.slots() - u);
  }
  metrics_->SetNodes(live, lost);
  metrics_->SetRankSlots(free, used);
  if (with_tenant_counts) {
    std::map<std::tuple<std::string, std::string, JobPhase>, int> tenant_counts;
    for (const auto& [id, job] : jobs_) {
      ++tenant_counts[{job.tenant, QueueOf(job.spec), job.phase}];
    }
    metrics_->SetTenantJobCounts(tenant_counts);
  }
  // A cordoned (or draining) node's slots count as "cordoned", except those ranks still hold.
  std::map<std::pair<AcceleratorKind, std::string>, int> accelerators;
  for (const auto& [node_id, node] : nodes_) {
    const AcceleratorKind kind = node.inventory.accelerator();
    if (node.lost) {
      accelerators[{kind, "lost"}] += node.inventory.slots();
      continue;
    }
    auto u_it = used_by_node.find(node_id);
    const int u = std::min(node.inventory.slots(), u_it == used_by_node.end() ? 0 : u_it->second);
    accelerators[{kind, "allocated"}] += u;
    const bool cordoned = node.admin.cordoned() || node.admin.draining();
    accelerators[{kind, cordoned ? "cordoned" : "free"}] += node.inventory.slots() - u;
  }
  metrics_->SetAccelerators(accelerators);
}

}  // namespace loom

namespace loom {

bool Scheduler::Unreachable(const NodeRecord& node, absl::Time now) const {
  return !node.lost && now - node.last_heartbeat_time > options_.heartbeat_timeout;
}

loom::v1::NodeInfo Scheduler::NodeInfoOf(const NodeRecord& node) const {
  loom::v1::NodeInfo info;
  info.set_node_id(node.id);
  *info.mutable_inventory() = node.inventory;
  info.set_live(!node.lost);
  info.set_unreachable(Unreachable(node, clock_->Now()));
  info.set_cordoned(node.admin.cordoned() || node.admin.draining());
  info.set_draining(node.admin.draining());
  info.set_admin_reason(node.admin.reason());
  int used = 0;
  std::set<std::string> jobs;
  for (const auto& [key, rt] : ranks_) {
    if (rt.node_id != node.id || RankEnded(rt.state)) continue;
    ++used;
    jobs.insert(key.first);
  }
  info.set_used_slots(used);
  info.set_free_slots(node.lost ? 0 : std::max(0, node.inventory.slots() - used));
  for (const std::string& j : jobs) info.add_job_ids(j);
  return info;
}

absl::StatusOr<std::vector<loom::v1::NodeInfo>> Scheduler::ListNodes() {
  absl::MutexLock lock(&mu_);
  std::vector<loom::v1::NodeInfo> out;
  for (const auto& [id, node] : nodes_) out.push_back(NodeInfoOf(node));
  return out;
}

absl::StatusOr<loom::v1::NodeInfo> Scheduler::CordonNode(const std::string& node_id,
                                                         const std::string& reason) {
  RETURN_IF_ERROR(CheckIdLength("node_id", node_id));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node_id, " not found"));
  NodeRecord updated = it->second;
  updated.admin.set_cordoned(true);
  updated.admin.set_reason(reason);
  RETURN_IF_ERROR(store_->UpsertNode(updated));
  it->second = std::move(updated);
  LOG(INFO) << "node " << node_id << " cordoned: " << reason;
  return NodeInfoOf(it->second);
}

absl::StatusOr<loom::v1::NodeInfo> Scheduler::UncordonNode(const std::string& node_id) {
  RETURN_IF_ERROR(CheckIdLength("node_id", node_id));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node_id, " not found"));
  NodeRecord updated = it->second;
  updated.admin.Clear();
  RETURN_IF_ERROR(store_->UpsertNode(updated));
  it->second = std::move(updated);
  LOG(INFO) << "node " << node_id << " uncordoned";
  return NodeInfoOf(it->second);
}

absl::StatusOr<loom::v1::DrainNodeResponse> Scheduler::DrainNode(const std::string& node_id,
                                                                 const std::string& reason) {
  RETURN_IF_ERROR(CheckIdLength("node_id", node_id));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node ", node_id, " not found"));
  NodeRecord updated = it->second;
  updated.admin.set_cordoned(true);
  updated.admin.set_draining(true);
  updated.admin.set_reason(reason);
  RETURN_IF_ERROR(store_->UpsertNode(updated));
  it->second = std::move(updated);
  std::set<std::string> jobs;
  for (const auto& [key, rt] : ranks_) {
    if (rt.node_id == node_id && !RankEnded(rt.state) && !rt.stop_requested) jobs.insert(key.first);
  }
  loom::v1::DrainNodeResponse response;
  for (const std::string& job_id : jobs) {
    const JobPhase phase = jobs_.at(job_id).phase;
    if (phase != v1::JOB_PHASE_STARTING && phase != v1::JOB_PHASE_RUNNING) continue;
    RETURN_IF_ERROR(RequeueJob(
        job_id, "Drained",
        absl::StrCat("node ", node_id, " is draining",
                     reason.empty() ? "" : absl::StrCat(" (", reason, ")"),
                     "; requeued: the next attempt resumes from the newest committed checkpoint"),
        /*preempted=*/false));
    response.add_requeued_job_ids(job_id);
  }
  LOG(INFO) << "node " << node_id << " draining (" << reason << "): requeued "
            << response.requeued_job_ids_size() << " jobs";
  *response.mutable_node() = NodeInfoOf(nodes_.at(node_id));
  UpdateGauges();
  return response;
}

absl::StatusOr<std::vector<loom::v1::QueueInfo>> Scheduler::ListQueues() {
  absl::MutexLock lock(&mu_);
  std::map<std::pair<std::string, AcceleratorKind>, int64_t> usage;
  for (const auto& [key, rt] : ranks_) {
    if (RankEnded(rt.state)) continue;
    auto j = jobs_.find(key.first);
    if (j == jobs_.end()) continue;
    ++usage[{QueueOf(j->second.spec), KindOf(j->second.spec)}];
  }
  std::map<std::string, std::pair<int, int>> counts;  // queue -> (pending, running)
  for (const auto& [id, job] : jobs_) {
    if (Waiting(job)) ++counts[QueueOf(job.spec)].first;
    if (job.phase == v1::JOB_PHASE_STARTING || job.phase == v1::JOB_PHASE_RUNNING ||
        job.phase == v1::JOB_PHASE_STOPPING) {
      ++counts[QueueOf(job.spec)].second;
    }
  }
  std::vector<loom::v1::QueueInfo> out;
  for (const QueueConfig& q : options_.queues.queues) {
    loom::v1::QueueInfo info;
    info.set_name(q.name);
    info.set_tenant(q.tenant);
    info.set_has_quota(q.has_quota);
    for (const auto& [kind, n] : q.nominal) (*info.mutable_nominal_quota())[KindName(kind)] = n;
    for (const auto& [kind, n] : q.borrowing_limit) {
      (*info.mutable_borrowing_limit())[KindName(kind)] = n;
    }
    for (const auto& [key, n] : usage) {
      if (key.first == q.name) (*info.mutable_usage())[KindName(key.second)] = n;
    }
    info.set_pending_jobs(counts[q.name].first);
    info.set_running_jobs(counts[q.name].second);
    info.set_tenant_weight(options_.queues.Weight(q.tenant));
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace loom

namespace loom {

void Scheduler::Resync() {
  const int64_t next_sequence = next_sequence_;
  jobs_.clear();
  job_order_.clear();
  job_by_request_.clear();
  nodes_.clear();
  ranks_.clear();
  last_step_advance_.clear();
  rank_progress_.Clear();
  step_seconds_.clear();
  resume_from_.clear();
  queue_order_.clear();
  phase_counts_.clear();
  absl::Status s = Load();
  if (!s.ok()) LOG(ERROR) << "reloading the scheduler state failed: " << s;
  // Sequences handed to submissions still being committed must not be reused.
  next_sequence_ = std::max(next_sequence_, next_sequence);
}

}  // namespace loom
