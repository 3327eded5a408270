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
#include "storage/checkpoint/consolidate.h"

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

bool RankEnded(RankState s) {
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED ||
         s == v1::RANK_STATE_STOPPED;
}

AcceleratorKind KindOf(const loom::v1::JobSpec& spec) {
  return spec.resources().accelerator() == v1::ACCELERATOR_KIND_UNSPECIFIED
             ? v1::ACCELERATOR_KIND_CPU
             : spec.resources().accelerator();
}

std::string KindName(AcceleratorKind kind) {
  std::string name = loom::v1::AcceleratorKind_Name(kind);
  absl::string_view prefix = "ACCELERATOR_KIND_";
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
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

// Failure class of a failed rank (DESIGN.md "Job model"): OOM when the error or a SIGKILL exit
// (137, what the kernel's OOM killer leaves) says so; SETUP when the rank never ran and could
// not start (126/127: not executable / not found) or rendezvous; USER otherwise.
loom::v1::FailureClass ClassifyRankFailure(const loom::v1::RankStatus& st, bool had_run) {
  const std::string error = absl::AsciiStrToLower(st.error());
  if (absl::StrContains(error, "out of memory") || st.exit_code() == 137) {
    return v1::FAILURE_CLASS_OOM;
  }
  if (!had_run && (st.exit_code() == 126 || st.exit_code() == 127 ||
                   absl::StrContains(error, "rendezvous"))) {
    return v1::FAILURE_CLASS_SETUP;
  }
  return v1::FAILURE_CLASS_USER;
}

std::string RankExitMessage(int32_t rank, const std::string& node_id,
                            const loom::v1::RankStatus& st) {
  std::string msg = absl::StrCat("rank ", rank, " on node ", node_id, " exited with code ",
                                 st.exit_code());
  if (st.state() == v1::RANK_STATE_STOPPED) absl::StrAppend(&msg, " (stopped unrequested)");
  if (!st.error().empty()) absl::StrAppend(&msg, ": ", st.error());
  return msg;
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
  if (heartbeat_interval <= absl::ZeroDuration() || heartbeat_interval >= heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval: must be in (0, heartbeat_timeout = ",
        absl::FormatDuration(heartbeat_timeout), "), got ",
        absl::FormatDuration(heartbeat_interval)));
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
  absl::MutexLock lock(&scheduler->mu_);
  RETURN_IF_ERROR(scheduler->Load());
  scheduler->UpdateGauges();
  return scheduler;
}

absl::Status Scheduler::Load() {
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<NodeRecord> nodes, store_->ListNodes());
  for (NodeRecord& node : nodes) {
    // Grace: the scheduler was down, so no node could heartbeat; each gets a full timeout.
    if (!node.lost) node.last_heartbeat_time = now;
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
    if (jobs_.count(id) == 0) return id;
  }
}

absl::Status Scheduler::CommitJob(JobRecord job) {
  auto it = jobs_.find(job.id);
  if (it == jobs_.end()) return absl::InternalError(absl::StrCat("job ", job.id, " vanished"));
  const JobPhase from = it->second.phase;
  if (from != job.phase) RETURN_IF_ERROR(Transition(from, job.phase));
  RETURN_IF_ERROR(store_->UpdateJob(job));
  if (from != job.phase) {
    VLOG(1) << "job " << job.id << ": " << JobPhaseName(from) << " -> " << JobPhaseName(job.phase)
            << (job.message.empty() ? "" : ": ") << job.message;
    if (metrics_ != nullptr) {
      metrics_->PhaseTransition(from, job.phase);
      if (from == v1::JOB_PHASE_PENDING && job.phase != v1::JOB_PHASE_CANCELLED) {
        metrics_->ObserveQueueWait(clock_->Now() - job.create_time);
      }
    }
  }
  it->second = std::move(job);
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
  step_seconds_.erase(job_id);
  for (auto it = ranks_.lower_bound({job_id, 0});
       it != ranks_.end() && it->first.first == job_id;) {
    if (RankEnded(it->second.state)) {
      it = ranks_.erase(it);  // its slot is free; nothing to stop
    } else {
      it->second.stop_requested = true;
      ++it;
    }
  }
  return absl::OkStatus();
}

absl::Status Scheduler::FailAttempt(const std::string& job_id,
                                    loom::v1::FailureClass failure_class,
                                    const std::string& reason, const std::string& message,
                                    const std::string& suspect_node) {
  const JobRecord& job = jobs_.at(job_id);
  if (IsTerminal(job.phase) || job.phase == v1::JOB_PHASE_RECOVERING) return absl::OkStatus();
  const int32_t max_restarts = job.spec.max_restarts();
  const int32_t restarts_used = std::max(0, job.attempt - 1);
  if (restarts_used >= max_restarts) {
    std::string final_message = message;
    if (max_restarts > 0) {
      final_message = absl::StrCat(message, " (attempt ", job.attempt, "; all ", max_restarts,
                                   " restarts used)");
    }
    return EndJob(job_id, v1::JOB_PHASE_FAILED, failure_class, reason, final_message);
  }
  JobRecord updated = job;
  updated.phase = v1::JOB_PHASE_RECOVERING;
  updated.failure_class = failure_class;
  updated.reason = reason;
  updated.message = absl::StrCat("attempt ", job.attempt, " failed: ", message,
                                 "; restarting from the newest committed checkpoint (restart ",
                                 restarts_used + 1, " of ", max_restarts, ")");
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  if (metrics_ != nullptr) metrics_->JobRestarted(failure_class);
  LOG(WARNING) << "job " << job_id << " RECOVERING: " << jobs_.at(job_id).message;
  last_step_advance_.erase(job_id);
  if (!suspect_node.empty()) suspects_[job_id].insert(suspect_node);
  for (auto it = ranks_.lower_bound({job_id, 0});
       it != ranks_.end() && it->first.first == job_id;) {
    if (RankEnded(it->second.state)) {
      it = ranks_.erase(it);
    } else {
      it->second.stop_requested = true;
      ++it;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<loom::v1::Job> Scheduler::SubmitJob(const loom::v1::JobSpec& spec,
                                                   const std::string& request_id,
                                                   bool* deduplicated,
                                                   const std::string& tenant) {
  if (deduplicated != nullptr) *deduplicated = false;
  RETURN_IF_ERROR(CheckIdLength("request_id", request_id));
  {
    absl::MutexLock lock(&mu_);
    auto known = job_by_request_.find(request_id);
    if (!request_id.empty() && known != job_by_request_.end()) {
      const JobRecord& earlier = jobs_.at(known->second);
      if (earlier.tenant != tenant) {
        // Request ids are unique across tenants; do not reveal the other tenant's job.
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id ", request_id, " was already used by another tenant"));
      }
      if (!google::protobuf::util::MessageDifferencer::Equals(earlier.spec, spec)) {
        return absl::AlreadyExistsError(absl::StrCat("request_id ", request_id,
                                                     " was already used for job ", earlier.id,
                                                     " with a different spec"));
      }
      if (deduplicated != nullptr) *deduplicated = true;
      return JobRecordToProto(earlier);
    }
  }
  RETURN_IF_ERROR(ValidateJobSpec(spec, options_.validation));
  absl::MutexLock lock(&mu_);
  if (!request_id.empty() && job_by_request_.count(request_id)) {
    // A concurrent retry created it between the check above and validation.
    if (deduplicated != nullptr) *deduplicated = true;
    return JobRecordToProto(jobs_.at(job_by_request_.at(request_id)));
  }
  JobRecord job;
  job.id = NewJobId();
  job.request_id = request_id;
  job.tenant = tenant.empty() ? "default" : tenant;
  job.sequence = next_sequence_;
  job.spec = spec;
  RETURN_IF_ERROR(Transition(v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING));
  job.phase = v1::JOB_PHASE_PENDING;
  job.reason = "Queued";
  job.message = "waiting for the next scheduling cycle";
  job.create_time = clock_->Now();
  job.checkpoint_dir = absl::StrCat(options_.checkpoint_root, "/", job.id);
  job.progress.set_total_steps(spec.training().steps());
  RETURN_IF_ERROR(store_->CreateJob(job));
  ++next_sequence_;
  job_order_[job.sequence] = job.id;
  if (!request_id.empty()) job_by_request_[request_id] = job.id;
  jobs_[job.id] = job;
  if (metrics_ != nullptr) {
    metrics_->JobSubmitted();
    metrics_->PhaseTransition(v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING);
  }
  LOG(INFO) << "job " << job.id << " submitted: " << spec.resources().num_ranks() << " ranks, "
            << spec.training().steps() << " steps";
  UpdateGauges();
  return JobRecordToProto(job);
}

absl::StatusOr<loom::v1::Job> Scheduler::GetJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return JobRecordToProto(it->second);
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
  for (auto it = job_order_.upper_bound(after); it != job_order_.end(); ++it) {
    const JobRecord& job = jobs_.at(it->second);
    if (request.phase() != v1::JOB_PHASE_UNSPECIFIED && job.phase != request.phase()) continue;
    if (!absl::StartsWith(job.spec.name(), request.name_prefix())) continue;
    if (!request.tenant().empty() && job.tenant != request.tenant()) continue;
    if (!request.queue().empty() &&
        (job.spec.queue().empty() ? "default" : job.spec.queue()) != request.queue()) {
      continue;
    }
    if (page.jobs_size() == page_size) {
      page.set_next_page_token(
          absl::WebSafeBase64Escape(absl::StrCat("after:", jobs_.at(page.jobs(page_size - 1).id()).sequence)));
      break;
    }
    *page.add_jobs() = JobRecordToProto(job);
  }
  return page;
}

absl::StatusOr<loom::v1::ExplainPendingResponse> Scheduler::ExplainPending(
    const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  const JobRecord& job = it->second;
  loom::v1::ExplainPendingResponse out;
  out.set_phase(job.phase);
  out.set_reason(job.reason);
  out.set_message(job.message);
  const bool waiting = job.phase == v1::JOB_PHASE_PENDING || job.phase == v1::JOB_PHASE_RECOVERING;
  if (!waiting) return out;
  const AcceleratorKind kind = KindOf(job.spec);
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

absl::StatusOr<loom::v1::Job> Scheduler::CancelJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdLength("job_id", job_id));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  if (IsTerminal(it->second.phase)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (",
                                                      JobPhaseName(it->second.phase), ")"));
  }
  RETURN_IF_ERROR(EndJob(job_id, v1::JOB_PHASE_CANCELLED, v1::FAILURE_CLASS_UNSPECIFIED,
                         "Cancelled", "cancelled by request"));
  UpdateGauges();
  return JobRecordToProto(jobs_.at(job_id));
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
  absl::MutexLock lock(&mu_);
  NodeRecord node;
  node.id = node_id;
  node.inventory = inventory;
  if (node.inventory.accelerator() == v1::ACCELERATOR_KIND_UNSPECIFIED) {
    node.inventory.set_accelerator(v1::ACCELERATOR_KIND_CPU);
  }
  node.last_heartbeat_time = clock_->Now();
  node.lost = false;
  RETURN_IF_ERROR(store_->UpsertNode(node));
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
  }

  loom::v1::HeartbeatResponse response;
  std::set<std::pair<std::string, int32_t>> stops;  // (job id, attempt)
  std::set<RankKey> seen;
  std::set<std::string> touched_jobs;

  for (const loom::v1::RankStatus& st : request.ranks()) {
    const RankKey key{st.job_id(), st.rank()};
    auto rt_it = ranks_.find(key);
    const bool ours = rt_it != ranks_.end() && rt_it->second.attempt == st.attempt() &&
                      rt_it->second.node_id == node_id;
    if (!ours) {
      // An old attempt, an ended job, or a rank placed elsewhere: it must not keep running.
      if (!RankEnded(st.state())) stops.emplace(st.job_id(), st.attempt());
      continue;
    }
    RankRuntime& rt = rt_it->second;
    seen.insert(key);
    const RankState previous = rt.state;
    rt.reported = true;
    rt.state = st.state();
    const auto job_it = jobs_.find(st.job_id());
    if (rt.stop_requested || job_it == jobs_.end() || IsTerminal(job_it->second.phase)) {
      if (RankEnded(st.state())) {
        ranks_.erase(rt_it);
      } else {
        stops.emplace(st.job_id(), st.attempt());
      }
      continue;
    }
    JobRecord& job = job_it->second;
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
      RETURN_IF_ERROR(FailAttempt(st.job_id(), ClassifyRankFailure(st, had_run), "RankFailed",
                                  message, suspect));
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

  // Replies: assignments not yet acknowledged, and stops.
  for (auto& [key, rt] : ranks_) {
    if (rt.node_id != node_id) continue;
    if (rt.stop_requested) {
      stops.emplace(key.first, rt.attempt);
      continue;
    }
    if (rt.reported) continue;
    const JobRecord& job = jobs_.at(key.first);
    if (key.second != 0 && job.rendezvous_port == 0) continue;  // wait for rank 0's port
    *response.add_start() = StartAssignment(job, key.second);
  }
  for (const auto& [job_id, attempt] : stops) {
    loom::v1::RankAssignment* stop = response.add_stop();
    stop->set_job_id(job_id);
    stop->set_attempt(attempt);
  }
  UpdateGauges();
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
    JobRecord updated = job;
    updated.phase = v1::JOB_PHASE_SUCCEEDED;
    updated.reason = "Succeeded";
    updated.message = absl::StrCat("all ", total, " ranks succeeded");
    updated.end_time = clock_->Now();
    RETURN_IF_ERROR(CommitJob(std::move(updated)));
    for (auto it = ranks_.lower_bound({job_id, 0});
         it != ranks_.end() && it->first.first == job_id;) {
      it = ranks_.erase(it);
    }
    LOG(INFO) << "job " << job_id << " SUCCEEDED";
    last_step_advance_.erase(job_id);
    step_seconds_.erase(job_id);
    // Nothing resumes from the attempt's starting checkpoint any more: apply the policy once
    // more without protecting it.
    resume_from_.erase(job_id);
    ApplyRetention(jobs_.at(job_id));
    return absl::OkStatus();
  }
  if (running_or_done == total && job.phase == v1::JOB_PHASE_STARTING) {
    JobRecord updated = job;
    updated.phase = v1::JOB_PHASE_RUNNING;
    updated.reason = "Running";
    updated.message = absl::StrCat("all ", total, " ranks running");
    RETURN_IF_ERROR(CommitJob(std::move(updated)));
  }
  return absl::OkStatus();
}

int Scheduler::UsedSlots(const std::string& node_id) const {
  int used = 0;
  for (const auto& [key, rt] : ranks_) {
    if (rt.node_id == node_id && !RankEnded(rt.state)) ++used;
  }
  return used;
}

absl::Status Scheduler::RunSchedulingCycle() {
  const absl::Time started = absl::Now();  // real time: this measures our own compute
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckNodeLiveness());
  RETURN_IF_ERROR(CheckHangs());
  RETURN_IF_ERROR(PlacePendingJobs());
  UpdateGauges();
  if (metrics_ != nullptr) metrics_->ObserveSchedulingCycle(absl::Now() - started);
  return absl::OkStatus();
}

void Scheduler::ApplyRetention(const JobRecord& job) {
  const loom::v1::CheckpointPolicy& policy = job.spec.checkpoint();
  if (policy.keep_last() <= 0) return;  // keep everything
  std::vector<int64_t> protected_steps;
  if (auto r = resume_from_.find(job.id); r != resume_from_.end()) {
    protected_steps.push_back(r->second.step);  // the current attempt may still need it
  }
  absl::StatusOr<std::vector<int64_t>> deleted =
      checkpoints_->ApplyRetention(job.id, job.checkpoint_dir, policy, protected_steps);
  if (!deleted.ok()) {
    LOG(WARNING) << "job " << job.id << ": checkpoint retention failed: " << deleted.status();
  } else if (!deleted->empty()) {
    LOG(INFO) << "job " << job.id << ": retention deleted checkpoints of steps "
              << absl::StrJoin(*deleted, ", ");
  }
}

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
    auto window = step_seconds_.find(job_id);
    if (last == last_step_advance_.end() || window == step_seconds_.end() ||
        window->second.size() < 3) {
      continue;
    }
    std::vector<double> sorted(window->second.begin(), window->second.end());
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median_s = sorted[sorted.size() / 2];
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
    step_seconds_.erase(job_id);
    RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "Hang", message, ""));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::CheckNodeLiveness() {
  const absl::Time now = clock_->Now();
  for (auto& [node_id, node] : nodes_) {
    if (node.lost || now - node.last_heartbeat_time <= options_.heartbeat_timeout) continue;
    // Missed heartbeats alone do not make a node lost while a job with a rank on it is still
    // stepping (its rank 0, reporting through another node, advanced within the timeout): the
    // gang's collectives cannot progress without that node's ranks, so they are alive.
    std::string stepping_job;
    for (const auto& [key, rt] : ranks_) {
      if (rt.node_id != node_id) continue;
      auto advanced = last_step_advance_.find(key.first);
      if (advanced != last_step_advance_.end() &&
          now - advanced->second <= options_.heartbeat_timeout) {
        stepping_job = key.first;
        break;
      }
    }
    if (!stepping_job.empty()) {
      LOG_EVERY_N(WARNING, 20) << "node " << node_id << " has not heartbeated for "
                               << absl::FormatDuration(now - node.last_heartbeat_time)
                               << " but job " << stepping_job
                               << " on it is still stepping; not declaring it lost";
      continue;
    }
    NodeRecord updated = node;
    updated.lost = true;
    RETURN_IF_ERROR(store_->UpsertNode(updated));
    node = std::move(updated);
    const std::string message = absl::StrCat(
        "node ", node_id, " lost: no heartbeat for ",
        absl::FormatDuration(absl::Trunc(now - node.last_heartbeat_time, absl::Milliseconds(1))),
        " (timeout ", absl::FormatDuration(options_.heartbeat_timeout), ")");
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
          !IsTerminal(jobs_.at(job_id).phase)) {
        JobRecord updated = jobs_.at(job_id);
        updated.phase = v1::JOB_PHASE_SUCCEEDED;
        updated.reason = "Succeeded";
        updated.message = absl::StrCat("training completed (rank 0 passed the final barrier of all ",
                                       updated.rank_nodes.size(), " ranks); ", message,
                                       " afterwards");
        updated.end_time = now;
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
        for (auto it = ranks_.lower_bound({job_id, 0});
             it != ranks_.end() && it->first.first == job_id;) {
          it = ranks_.erase(it);
        }
        last_step_advance_.erase(job_id);
        step_seconds_.erase(job_id);
        LOG(INFO) << "job " << job_id << " SUCCEEDED: " << jobs_.at(job_id).message;
        continue;
      }
      if (jobs_.at(job_id).phase == v1::JOB_PHASE_RECOVERING) {
        // The attempt already ended (typically a peer rank failing with a collective error when
        // this node died): name the lost node in the job's message and avoid it.
        JobRecord updated = jobs_.at(job_id);
        absl::StrAppend(&updated.message, "; then ", message, ": likely the cause");
        RETURN_IF_ERROR(CommitJob(std::move(updated)));
        suspects_[job_id].insert(node_id);
        continue;
      }
      RETURN_IF_ERROR(FailAttempt(job_id, v1::FAILURE_CLASS_INFRA, "NodeLost", message, node_id));
    }
  }
  return absl::OkStatus();
}

absl::Status Scheduler::SetPendingReason(const std::string& job_id, const std::string& reason,
                                         const std::string& message) {
  const JobRecord& job = jobs_.at(job_id);
  if (job.reason == reason && job.message == message) return absl::OkStatus();
  JobRecord updated = job;
  updated.reason = reason;
  updated.message = message;
  return CommitJob(std::move(updated));
}

absl::Status Scheduler::PlacePendingJobs() {
  // Capacity of live nodes per accelerator kind.
  std::map<AcceleratorKind, int64_t> total_slots, live_nodes;
  std::map<std::string, int> free_slots;  // live nodes only, by id (deterministic order)
  for (const auto& [node_id, node] : nodes_) {
    if (node.lost) continue;
    total_slots[node.inventory.accelerator()] += node.inventory.slots();
    live_nodes[node.inventory.accelerator()] += 1;
    free_slots[node_id] = std::max(0, node.inventory.slots() - UsedSlots(node_id));
  }
  std::map<AcceleratorKind, std::string> blocked_by;  // kind -> first job that did not fit

  // Copy the order: committing jobs below does not change it, but keep iteration obvious.
  const std::map<int64_t, std::string> order = job_order_;
  for (const auto& [seq, job_id] : order) {
    const JobRecord& job = jobs_.at(job_id);
    const bool recovering = job.phase == v1::JOB_PHASE_RECOVERING;
    if (job.phase != v1::JOB_PHASE_PENDING && !recovering) continue;
    if (recovering) {
      // The failed attempt's ranks must all have ended (or their node been declared lost)
      // before the next attempt starts: two incarnations of one rank never run at once.
      auto r = ranks_.lower_bound({job_id, 0});
      if (r != ranks_.end() && r->first.first == job_id) continue;
    }
    const AcceleratorKind kind = KindOf(job.spec);
    const int need = job.spec.resources().num_ranks();
    const std::string kind_name = KindName(kind);
    if (need > total_slots[kind]) {
      if (metrics_ != nullptr) metrics_->AdmissionAttempt("infeasible");
      RETURN_IF_ERROR(SetPendingReason(
          job_id, "Unschedulable",
          absl::StrCat("needs ", need, " ", kind_name, " rank slots; the ", live_nodes[kind],
                       " live ", kind_name, " nodes offer ", total_slots[kind],
                       " in total (register more workers)")));
      continue;
    }
    if (blocked_by.count(kind)) {
      RETURN_IF_ERROR(SetPendingReason(
          job_id, "Queued", absl::StrCat("waiting behind job ", blocked_by[kind])));
      continue;
    }
    // Candidate nodes with free slots of the right kind, in node-id order.
    std::vector<std::string> candidates;
    int64_t free_total = 0;
    for (const auto& [node_id, free] : free_slots) {
      if (free > 0 && nodes_.at(node_id).inventory.accelerator() == kind) {
        candidates.push_back(node_id);
        free_total += free;
      }
    }
    if (free_total < need) {
      if (metrics_ != nullptr) metrics_->AdmissionAttempt("no_capacity");
      blocked_by[kind] = job_id;
      RETURN_IF_ERROR(SetPendingReason(
          job_id, "WaitingForSlots",
          absl::StrCat("needs ", need, " ", kind_name, " rank slots; ", free_total, " of ",
                       total_slots[kind], " are free")));
      continue;
    }
    // Nodes suspected in this job's earlier failed attempts go last.
    const std::set<std::string>& suspects = suspects_[job_id];
    std::stable_partition(candidates.begin(), candidates.end(),
                          [&](const std::string& n) { return suspects.count(n) == 0; });
    // Spread: one rank per node per round, nodes in id order, until the gang is placed.
    std::map<std::string, int> free_copy = free_slots;
    std::vector<std::string> placement;
    while (static_cast<int>(placement.size()) < need) {
      for (const std::string& node_id : candidates) {
        if (static_cast<int>(placement.size()) == need) break;
        if (free_copy[node_id] == 0) continue;
        --free_copy[node_id];
        placement.push_back(node_id);
      }
    }
    if (metrics_ != nullptr) metrics_->AdmissionAttempt("admitted");
    JobRecord updated = job;
    updated.phase = v1::JOB_PHASE_STARTING;
    updated.attempt = job.attempt + 1;
    updated.rank_nodes = placement;
    updated.rendezvous_port = 0;
    updated.reason = "Starting";
    updated.failure_class = v1::FAILURE_CLASS_UNSPECIFIED;
    updated.message = absl::StrCat("attempt ", updated.attempt, ": ", need,
                                   " ranks placed; waiting for rank 0's rendezvous port");
    resume_from_.erase(job_id);
    if (updated.attempt > 1) {
      absl::StatusOr<CommittedCheckpoint> newest =
          checkpoints_->NewestCommitted(job_id, updated.checkpoint_dir);
      if (!newest.ok() && !absl::IsNotFound(newest.status())) {
        // Never restart from scratch because the catalog could not answer: try next cycle.
        RETURN_IF_ERROR(SetPendingReason(
            job_id, "CheckpointsUnavailable",
            absl::StrCat("cannot find the newest committed checkpoint to resume from: ",
                         newest.status().message())));
        continue;
      }
      if (newest.ok()) resume_from_[job_id] = *newest;
      absl::StrAppend(&updated.message,
                      newest.ok() ? absl::StrCat(" (resuming from ", newest->path, ")")
                                  : std::string(" (no committed checkpoint: starting over)"));
      if (job.phase == v1::JOB_PHASE_RECOVERING) {
        absl::StrAppend(&updated.message, ". Previously: ", job.message);  // why it restarted
      }
    }
    if (updated.start_time == absl::InfinitePast()) updated.start_time = clock_->Now();
    RETURN_IF_ERROR(CommitJob(std::move(updated)));
    last_step_advance_.erase(job_id);  // the new attempt's first report gives no interval
    free_slots = std::move(free_copy);
    const JobRecord& placed = jobs_.at(job_id);
    for (int32_t rank = 0; rank < need; ++rank) {
      RankRuntime rt;
      rt.attempt = placed.attempt;
      rt.node_id = placement[rank];
      ranks_[{job_id, rank}] = rt;
    }
    LOG(INFO) << "job " << job_id << " attempt " << placed.attempt << " placed: rank 0 on "
              << placement[0] << ", " << need << " ranks on " << candidates.size()
              << " candidate nodes";
  }
  return absl::OkStatus();
}

void Scheduler::UpdateGauges() {
  if (metrics_ == nullptr) return;
  std::map<JobPhase, int> counts;
  for (const auto& [id, job] : jobs_) ++counts[job.phase];
  metrics_->SetJobCounts(counts);
  int live = 0, lost = 0, free = 0, used = 0;
  for (const auto& [node_id, node] : nodes_) {
    if (node.lost) {
      ++lost;
      continue;
    }
    ++live;
    const int u = UsedSlots(node_id);
    used += u;
    free += std::max(0, node.inventory.slots() - u);
  }
  metrics_->SetNodes(live, lost);
  metrics_->SetRankSlots(free, used);
  std::map<std::tuple<std::string, std::string, JobPhase>, int> tenant_counts;
  for (const auto& [id, job] : jobs_) {
    ++tenant_counts[{job.tenant, job.spec.queue().empty() ? "default" : job.spec.queue(),
                     job.phase}];
  }
  metrics_->SetTenantJobCounts(tenant_counts);
  // Cordoned nodes: add their slots as "cordoned" once nodes can be cordoned.
  std::map<std::pair<AcceleratorKind, std::string>, int> accelerators;
  for (const auto& [node_id, node] : nodes_) {
    const AcceleratorKind kind = node.inventory.accelerator();
    if (node.lost) {
      accelerators[{kind, "lost"}] += node.inventory.slots();
      continue;
    }
    const int u = std::min(node.inventory.slots(), UsedSlots(node_id));
    accelerators[{kind, "allocated"}] += u;
    accelerators[{kind, "free"}] += node.inventory.slots() - u;
  }
  metrics_->SetAccelerators(accelerators);
}

}  // namespace loom
