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
#include "scheduler/scheduler_internal.h"

namespace loom {

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
  repository_.reset();  // commits queued submissions; its listener uses the state below
  checkpoint_worker_.reset();  // waits for an in-flight catalog call (bounded by its deadline)
  std::vector<std::shared_ptr<JobSubscription>> subs;
  {
    absl::MutexLock lock(&mu_);
    subs = watchers_.TakeAll();
  }
  for (auto& sub : subs) sub->Cancel();
}

absl::Status Scheduler::Load() {
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, repository_->ListNodes());
  for (NodeRecord& node : nodes) {
    // Grace: the scheduler was down, so no node could heartbeat; each gets a full timeout, at
    // least reregistration_grace, to come back (CheckNodeLiveness).
    if (!node.lost) {
      node.last_heartbeat_time = now;
      awaiting_reregistration_.insert(node.id);
    }
    const std::string node_id = node.id;
    nodes_[node_id] = std::move(node);
    NoteNodeChanged(node_id);
  }
  ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, repository_->ListJobs(v1::JOB_PHASE_UNSPECIFIED));
  std::vector<std::pair<std::string, std::string>> orphaned;  // (job id, node id)
  for (JobRecord& job : jobs) {
    const bool placed = job.phase == v1::JOB_PHASE_STARTING || job.phase == v1::JOB_PHASE_RUNNING ||
                        job.phase == v1::JOB_PHASE_STOPPING;
    if (placed && job.attempt > 0) {
      for (int32_t rank = 0; rank < static_cast<int32_t>(job.rank_nodes.size()); ++rank) {
        RankRuntime rt;
        rt.attempt = job.attempt;
        rt.node_id = job.rank_nodes[rank];
        if (job.state.rank_device_indices_size() == static_cast<int>(job.rank_nodes.size())) {
          rt.device_index = job.state.rank_device_indices(rank);
        }
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
          stop_coordinator_.Rearm(job.id, now, options_.cancel_grace);
        }
        PutRank({job.id, rank}, rt);
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
    jobs_.Add(std::move(job));
  }
  admission_gate_.NoteJobChanged();
  LOG(INFO) << "scheduler state loaded: " << jobs_.size() << " jobs, " << nodes_.size()
            << " nodes, " << reconciler_.ranks().size() << " ranks to re-adopt";
  for (const auto& [job_id, node_id] : orphaned) {
    if (IsTerminal(jobs_.at(job_id).phase)) continue;
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "NodeLost",
                                absl::StrCat("node ", node_id, " was lost while the scheduler was down"),
                                node_id));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::CommitJob(JobRecord job) {
  auto it = jobs_.find(job.id);
  if (it == jobs_.end()) return absl::InternalError(absl::StrCat("job ", job.id, " vanished"));
  const JobPhase from = it->second.phase;
  if (from != job.phase) {
    RETURN_IF_ERROR(Transition(from, job.phase));
    AppendHistory(&job.state, clock_->Now(), job.phase, job.reason, job.message, job.attempt);
    if (job.phase == v1::JOB_PHASE_PENDING) {
      job.state.set_pending_since_us(absl::ToUnixMicros(clock_->Now()));
    }
  }
  if (deferred_writes_ != nullptr) {
    (*deferred_writes_)[job.id] = job;  // written in one transaction at the end of the cycle
  } else {
    RETURN_IF_ERROR(repository_->UpdateJobsVersioned({job}, {++write_version_}));
  }
  if (from != job.phase) {
    VLOG(1) << "job " << job.id << ": " << JobPhaseName(from) << " -> " << JobPhaseName(job.phase)
            << (job.message.empty() ? "" : ": ") << job.message;
    if (metrics_ != nullptr) {
      metrics_->PhaseTransition(from, job.phase);
      if (from == v1::JOB_PHASE_PENDING && job.phase != v1::JOB_PHASE_CANCELLED) {
        // Since it entered PENDING: a requeued or resumed job's wait is not its age.
        metrics_->ObserveQueueWait(clock_->Now() - (job.state.pending_since_us() > 0
                                                        ? absl::FromUnixMicros(
                                                              job.state.pending_since_us())
                                                        : job.create_time));
      }
    }
  }
  const bool phase_changed = from != job.phase;
  progress_dirty_.erase(job.id);  // this write (or the cycle's) carries the progress too
  const JobRecord& stored = jobs_.Replace(std::move(job));  // indexes and counts follow
  admission_gate_.NoteJobChanged();  // the next admission pass must look again
  PublishJobChange(stored, phase_changed);
  return absl::OkStatus();
}

absl::Status Scheduler::FlushProgress() {
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> records;
  std::vector<uint64_t> versions;
  for (const auto& [id, unused] : progress_dirty_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    records.push_back(it->second);
    versions.push_back(++write_version_);
  }
  if (records.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(repository_->UpdateJobsVersioned(records, versions));
  progress_dirty_.clear();
  return absl::OkStatus();
}

void Scheduler::NoteProgress(const std::string& job_id, loom::v1::Progress progress) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  it->second.progress = std::move(progress);
  progress_dirty_.try_emplace(job_id, clock_->Now());  // the oldest unstored change's time
  PublishJobChange(it->second, /*phase_changed=*/false);
}

void Scheduler::PublishJobChange(const JobRecord& job, bool phase_changed) {
  PublishJobEvent(job, phase_changed ? "PhaseChanged" : "Progress");
}

void Scheduler::PublishJobEvent(const JobRecord& job, const char* type) {
  if (IsTerminal(job.phase)) logs_->MarkEnded(job.id);
  watchers_.Publish(job, type, clock_->Now());
}

absl::StatusOr<std::shared_ptr<JobSubscription>> Scheduler::WatchJob(
    const std::string& job_id, std::function<void()> on_event) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
  absl::MutexLock lock(&mu_);  // no change of the job between its snapshot and the subscription
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return watchers_.Subscribe(it->second, clock_->Now(), std::move(on_event));
}

void Scheduler::Unwatch(const std::shared_ptr<JobSubscription>& subscription) {
  subscription->Cancel();  // outside mu_: waits for a running callback
  absl::MutexLock lock(&mu_);
  watchers_.Remove(subscription);
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
  reconciler_.ForgetJob(job_id);
  stop_coordinator_.Forget(job_id);
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
                  absl::StrCat(message, " (attempt ", job.attempt, "; a ",
                               reason == "DatasetError" ? "dataset" : "configuration",
                               " error fails the same way every time: not restarted)"));
  }
  if (restarts_used >= max_restarts) {
    std::string final_message = message;
    if (max_restarts > 0) {
      final_message = absl::StrCat(message, " (attempt ", job.attempt, "; all ", max_restarts,
                                   " ", budget, " restarts used)");
    }
    absl::StrAppend(&final_message, ResumeHint(job));  // issue 49
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
                                 "; restarting from the newest committed checkpoint (",
                                 RestartNote(infra, restarts_used + 1, max_restarts), ")");
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
  reconciler_.ForgetAttemptSteps(job_id);
  StopLiveRanks(job_id, /*graceful=*/false);
  return absl::OkStatus();
}

void Scheduler::PutRank(const RankKey& key, RankRuntime rt) { reconciler_.Put(key, std::move(rt)); }

RankReconciler::RankMap::iterator Scheduler::EraseRank(RankReconciler::RankMap::const_iterator it) {
  return reconciler_.Erase(it);
}

void Scheduler::ClearRanks() { reconciler_.Clear(); }

std::vector<Scheduler::RankKey> Scheduler::RanksOnNode(const std::string& node_id) const {
  return reconciler_.RanksOnNode(node_id);
}

void Scheduler::StopLiveRanks(const std::string& job_id, bool graceful) {
  reconciler_.StopLiveRanks(job_id, graceful);
}

namespace {
NodeCapacity CapacityOf(const NodeRecord& node) {
  NodeCapacity capacity;
  capacity.kind = node.inventory.accelerator();
  capacity.slots = node.inventory.slots();
  capacity.lost = node.lost;
  capacity.cordoned = node.admin.cordoned() || node.admin.draining();
  capacity.host_memory_bytes = node.inventory.host_memory_bytes();
  capacity.accelerator_memory_bytes = node.inventory.accelerator_memory_bytes();
  return capacity;
}
}  // namespace

void Scheduler::NoteNodeChanged(const std::string& node_id) {
  admission_gate_.NoteNodeChanged();
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    reconciler_.RemoveNode(node_id);
    return;
  }
  reconciler_.SetNode(node_id, CapacityOf(it->second));
}

absl::Status Scheduler::CheckCapacityCounts() {
  absl::MutexLock lock(&mu_);
  const CapacityCounts kept = reconciler_.capacity();
  // From the facade's own nodes_, not the reconciler's copy: a node change the facade did not
  // report (NoteNodeChanged) shows up here.
  std::map<std::string, NodeCapacity> nodes;
  for (const auto& [id, node] : nodes_) nodes[id] = CapacityOf(node);
  const CapacityCounts recount = CountCapacity(nodes, reconciler_.ranks());
  if (kept != recount) {
    return absl::InternalError(absl::StrCat("capacity counts kept: ", kept.DebugString(),
                                            "; recounted: ", recount.DebugString()));
  }
  return absl::OkStatus();
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

absl::Status Scheduler::RunSchedulingCycle() {
  const absl::Time started = absl::Now();  // real time: this measures our own compute
  CyclePhases phases;
  PhaseClock timer;
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
    // Only jobs placed before (jobs_.active()), not every job ever submitted.
    std::vector<std::string> wanted;
    for (const auto& [job_id, job] : jobs_.active()) {
      if (job->attempt == 0 ||
          (job->phase != v1::JOB_PHASE_PENDING && job->phase != v1::JOB_PHASE_RECOVERING)) {
        continue;
      }
      if (reconciler_.HasRanks(job_id)) continue;
      wanted.push_back(job_id);
      if (checkpoint_worker_->RequestResume(job_id, job->attempt, job->checkpoint_dir)) {
        requested.emplace_back(job_id, job->attempt);
      }
    }
    checkpoint_worker_->RetainResume(wanted);  // forgets jobs placed or ended meanwhile
    phases.checks = timer.Lap();
  }
  // A lookup asked for just now usually answers at once (a local catalog, a healthy service):
  // give it resume_lookup_wait, off the lock, so that the job is placed in this cycle. A slow
  // service delays only this; lookups already in flight are not waited for again.
  if (!requested.empty()) {
    checkpoint_worker_->AwaitResume(requested, options_.resume_lookup_wait);
  }
  phases.resume_wait = timer.Lap();
  absl::ReleasableMutexLock lock(&mu_);
  timer.Restart();  // waiting for the lock is no phase's own time
  std::map<std::string, absl::StatusOr<CommittedCheckpoint>> results;
  for (const auto& [job_id, job] : jobs_.active()) {
    if (job->attempt == 0 ||
        (job->phase != v1::JOB_PHASE_PENDING && job->phase != v1::JOB_PHASE_RECOVERING)) {
      continue;
    }
    std::optional<CheckpointWorker::ResumeAnswer> answer =
        checkpoint_worker_->Resume(job_id, job->attempt);
    if (answer.has_value()) results.emplace(job_id, std::move(answer->result));
  }
  // Nothing the pass reads changed since the last one: no snapshot, no placement
  // (docs/scheduling.md "Admission passes").
  const AdmissionPassStats::Kind pass = ChooseAdmissionPass(results, clock_->Now());
  prefetched_resume_ = std::move(results);
  // Job writes of the placement pass are collected and stored in one transaction (one fsync)
  // once the lock is released (StoreOffLock); until then no heartbeat reply hands out a
  // placement of this pass (undurable_), so none is handed out before it is durable.
  std::map<std::string, JobRecord> deferred;
  deferred_writes_ = &deferred;
  absl::Status placed = absl::OkStatus();
  phases.checks += timer.Lap();  // the resume answers and the gate's choice, under the lock
  if (pass == AdmissionPassStats::Kind::kSkipped) {
    admission_gate_.NoteSkipped(static_cast<int>(jobs_.waiting().size()));
  } else {
    placed = PlacePendingJobs(
        pass == AdmissionPassStats::Kind::kFull ? 0 : options_.admission_queue_depth, &phases);
  }
  timer.Restart();  // PlacePendingJobs timed its own phases
  deferred_writes_ = nullptr;
  prefetched_resume_.clear();
  // Progress-only changes at least progress_store_interval old ride along in the same
  // transaction (at most one progress write per job per interval).
  const absl::Time progress_due = clock_->Now() - options_.progress_store_interval;
  for (const auto& [id, since] : progress_dirty_) {
    if (since <= progress_due) deferred.try_emplace(id);
  }
  if (placed.ok()) UpdateGauges();
  phases.apply += timer.Lap();
  // One transaction (one fsync) for the cycle, written after mu_ is released: the placed jobs'
  // assignments wait for it (StoreOffLock), nothing else does.
  absl::Status stored = StoreOffLock(deferred, &lock);
  phases.store = timer.Lap();
  {
    absl::MutexLock relock(&mu_);
    last_cycle_phases_ = phases;
  }
  if (!stored.ok()) return stored;
  RETURN_IF_ERROR(placed);
  if (metrics_ != nullptr) metrics_->ObserveSchedulingCycle(absl::Now() - started);
  return absl::OkStatus();
}

absl::Status Scheduler::StoreOffLock(const std::map<std::string, JobRecord>& changed,
                                     absl::ReleasableMutexLock* lock) {
  if (changed.empty()) {
    lock->Release();
    return absl::OkStatus();
  }
  std::vector<JobRecord> records;
  std::vector<uint64_t> versions;
  std::vector<std::string> ids;
  records.reserve(changed.size());
  for (const auto& [id, unused] : changed) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    records.push_back(it->second);  // the state now, progress included
    versions.push_back(++write_version_);
    progress_dirty_.erase(id);
    ++undurable_[id];
    ids.push_back(id);
  }
  lock->Release();
  // Versioned (job_repository.h): if another writer stored a newer state of a job meanwhile,
  // this older copy is dropped, so the store never goes back.
  absl::Status stored = repository_->UpdateJobsVersioned(records, versions);
  absl::MutexLock relock(&mu_);
  for (const std::string& id : ids) {
    auto u = undurable_.find(id);
    if (u != undurable_.end() && --u->second <= 0) undurable_.erase(u);
  }
  if (!stored.ok()) {
    // Memory is ahead of the store: reload the last durable state. No assignment of these jobs
    // was handed out (undurable_).
    LOG(ERROR) << "storing " << records.size() << " job updates failed (" << stored
               << "); reloading the scheduler state from the store";
    Resync();
  }
  return stored;
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

CheckpointWorkerOptions Scheduler::WithRetentionReporter(CheckpointWorkerOptions options) {
  options.retention_reporter = [this](const std::string& job_id, const absl::Status& status) {
    OnRetentionReport(job_id, status);
  };
  return options;
}

void Scheduler::OnRetentionReport(const std::string& job_id, const absl::Status& status) {
  // Called on the retention thread (no lock of the worker held). In memory, and stored with the
  // record's next write: a scheduler restart retries retention at the job's next checkpoint.
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  JobRecord& job = it->second;
  const std::string error =
      status.ok() ? "" : absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                      status.message());
  if (job.state.checkpoint_retention_error() == error) return;
  LOG(WARNING) << "job " << job_id << ": checkpoint retention "
               << (status.ok() ? "succeeded again" : absl::StrCat("failed: ", error));
  job.state.set_checkpoint_retention_error(error);
  PublishJobChange(job, /*phase_changed=*/false);
}

void Scheduler::SetPendingReason(JobRecord& job, std::string reason, std::string message) {
  // In memory only: a waiting job's reason and message are recomputed by every cycle (also the
  // first one after a restart), so storing each change would only cost a write per job and
  // cycle. The record is stored with its latest reason at its next phase change.
  if (job.reason == reason && job.message == message) return;
  job.reason = std::move(reason);
  job.message = std::move(message);
  // Watchers see it (issue 52: Queued -> Unschedulable inside PENDING never reached them).
  PublishJobEvent(job, "ReasonChanged");
}

double Scheduler::MedianStepSeconds(const std::string& job_id) const {
  return reconciler_.MedianStepSeconds(job_id);
}

void Scheduler::UpdateGauges(bool with_tenant_counts) {
  if (metrics_ == nullptr) return;
  // Tenant counts change only with a phase (tenant and queue are fixed at submission).
  if (tenant_counts_at_ == jobs_.phase_changes()) with_tenant_counts = false;
  metrics_->SetJobCounts(jobs_.phase_counts());
  // Kept incrementally where ranks and nodes change (rank_reconciler.h): no walk over them.
  const CapacityCounts& capacity = reconciler_.capacity();
  metrics_->SetNodes(capacity.live_nodes, capacity.lost_nodes);
  metrics_->SetRankSlots(capacity.free_slots, capacity.used_slots, capacity.cordoned_slots);
  if (with_tenant_counts) {
    metrics_->SetTenantJobCounts(jobs_.tenant_counts());  // kept by jobs_: no walk over them
    tenant_counts_at_ = jobs_.phase_changes();
  }
  // A cordoned (or draining) node's slots count as "cordoned", except those ranks still hold.
  metrics_->SetAccelerators(capacity.accelerators);
}

void Scheduler::Resync() {
  jobs_.Clear();  // keeps the sequences and ids handed to submissions still being committed
  nodes_.clear();
  ClearRanks();  // and the step timing and capacity counts (reconciler_.Clear)
  resume_from_.clear();
  queue_order_.clear();
  admission_gate_.ResetNodes();  // no node unreachable, and a node change
  absl::Status s = Load();
  if (!s.ok()) LOG(ERROR) << "reloading the scheduler state failed: " << s;
}

}  // namespace loom
