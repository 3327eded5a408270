// The Scheduler facade's submissions: validation, path confinement and idempotent request ids;
// the group commit itself is the JobRepository's (job_repository.h), which hands each committed
// batch back to AdoptSubmissions.
#include "scheduler/scheduler.h"

#include "scheduler/job_spec_validation_accelerators.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include <nlohmann/json.hpp>
#include "scheduler/job_state.h"
#include "scheduler/path_policy.h"
#include "scheduler/placement.h"
#include "scheduler/preemption.h"
#include "scheduler/record_helpers.h"
#include "scheduler/restart_policy.h"
#include "scheduler/scheduler_internal.h"
#include "spec/hf_trainer_config.h"
#include "spec/model_config.h"
#include "spec/struct_json.h"

namespace loom {

std::string Scheduler::NewJobId() {
  while (true) {
    std::string id = absl::StrFormat("job-%08x", absl::Uniform<uint32_t>(bitgen_));
    if (!jobs_.IdTaken(id)) return id;
  }
}

absl::StatusOr<loom::v1::Job> Scheduler::SubmitJob(const loom::v1::JobSpec& spec,
                                                   const std::string& request_id,
                                                   bool* deduplicated,
                                                   const std::string& tenant) {
  absl::Notification answered;
  absl::StatusOr<loom::v1::Job> result;
  bool was_deduplicated = false;
  SubmitJobAsync(spec, request_id, tenant,
                 [&](absl::StatusOr<loom::v1::Job> job, bool dedup) {
                   result = std::move(job);
                   was_deduplicated = dedup;
                   answered.Notify();
                 });
  answered.WaitForNotification();
  if (deduplicated != nullptr) *deduplicated = was_deduplicated;
  return result;
}

void Scheduler::SubmitJobAsync(const loom::v1::JobSpec& spec, const std::string& request_id,
                               const std::string& tenant_in, SubmitDone done,
                               bool wait_for_capacity) {
  // Announced before validation, so a batch being committed waits for this submission
  // (JobRepository "Joining a batch"); ended on return, after Submit() or a refusal.
  JobRepository::PreparingScope preparing(repository_.get());
  bool deduplicated = false;
  auto fail = [&](const absl::Status& status) { done(status, false); };
  if (absl::Status s = CheckIdLength("request_id", request_id); !s.ok()) return fail(s);
  // Printable ASCII without spaces (a UUID, Google AIP-155): a newline or control character
  // would be echoed into messages and logs (issue 52 finding 6).
  for (char c : request_id) {
    if (c <= ' ' || c > '~') {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "request_id: only printable ASCII without spaces (e.g. a UUID); found '",
          absl::CEscape(std::string(1, c)), "' in '", absl::CEscape(request_id), "'")));
    }
  }
  const std::string tenant = tenant_in.empty() ? std::string("default") : tenant_in;
  // A retry of an earlier submission (same request id): the earlier job, if it is the same
  // tenant's and the same spec. Request ids are unique across tenants; another tenant's job is
  // not revealed.
  auto earlier_submission = [&](const JobRecord& earlier) -> absl::StatusOr<loom::v1::Job> {
    if (earlier.tenant != tenant) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id ", request_id, " was already used by another tenant"));
    }
    if (!SameSubmittedSpec(earlier, spec)) {
      return absl::AlreadyExistsError(absl::StrCat("request_id ", request_id,
                                                   " was already used for job ", earlier.id,
                                                   " with a different spec"));
    }
    deduplicated = true;
    return JobRecordToProto(earlier);
  };
  std::optional<absl::StatusOr<loom::v1::Job>> answer;  // known without a commit
  {
    absl::MutexLock lock(&mu_);
    if (const JobRecord* known = jobs_.FindByRequest(request_id); known != nullptr) {
      answer = earlier_submission(*known);
    } else if (absl::Status s = CheckUnfinishedJobLimit(tenant); !s.ok()) {
      answer = s;  // refused before validation reads the spec (checked again below)
    }
  }
  if (answer.has_value()) return done(std::move(*answer), deduplicated);
  std::optional<AutoTechnique> chosen;  // technique: auto
  if (absl::Status s = CheckAdmissible(spec, tenant, wait_for_capacity, &chosen); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = Transition(v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING); !s.ok()) {
    return fail(s);
  }
  // The record is built (and the spec copied) before taking mu_; only the id, the sequence and
  // the in-flight sets need the lock.
  JobRecord job;
  job.request_id = request_id;
  job.tenant = tenant;
  if (chosen.has_value()) {
    job.spec = std::move(chosen->spec);
    *job.state.mutable_chosen_technique() = std::move(chosen->choice);
  } else {
    job.spec = spec;
  }
  job.phase = v1::JOB_PHASE_PENDING;
  job.reason = "Queued";
  job.message = "waiting for the next scheduling cycle";
  job.progress.set_total_steps(spec.training().steps());
  RecordPlannedRankMemory(job.spec, &job.state);  // placement's memory limits (issue 48)
  {
    absl::MutexLock lock(&mu_);
    if (const JobRecord* known = jobs_.FindByRequest(request_id); known != nullptr) {
      // A concurrent retry created it between the check above and validation.
      answer = earlier_submission(*known);
    } else if (!request_id.empty() && jobs_.RequestInFlight(request_id)) {
      answer = absl::UnavailableError(absl::StrCat(
          "request_id ", request_id, ": a submission with this id is being committed; retry"));
    } else if (absl::Status s = CheckUnfinishedJobLimit(tenant); !s.ok()) {
      answer = s;
    } else {
      job.id = NewJobId();
      job.sequence = jobs_.BeginSubmission(job.id, request_id, tenant);
      job.create_time = clock_->Now();
      job.checkpoint_dir = absl::StrCat(options_.checkpoint_root, "/", job.id);
      AppendHistory(&job.state, job.create_time, job.phase, job.reason, job.message, 0);
      // Queued under mu_, so batches keep submission (sequence) order. The job is acknowledged
      // only once its batch's transaction committed and AdoptSubmissions took it into jobs_.
      repository_->Submit(std::move(job),
                          [done](JobRecord& stored_job, const absl::Status& stored) {
                            if (!stored.ok()) return done(stored, false);
                            // Adopted (a copy in jobs_) before this runs: the reply takes it.
                            done(JobRecordToProto(std::move(stored_job)), false);
                          });
    }
  }
  if (answer.has_value()) done(std::move(*answer), deduplicated);
}

absl::Status Scheduler::CheckAdmissible(const loom::v1::JobSpec& spec,
                                        const std::string& tenant, bool wait_for_capacity,
                                        std::optional<AutoTechnique>* chosen) {
  // Paths first: validation reads the files, and must not for a path the tenant may not name.
  if (options_.confine_paths) RETURN_IF_ERROR(ConfineSubmittedPaths(spec, tenant));
  RETURN_IF_ERROR(ValidateJobSpec(spec, options_.validation));
  RETURN_IF_ERROR(ValidateAcceleratorsPerNode(spec.resources(), LargestRegisteredNodes()));
  RETURN_IF_ERROR(ResolveQueue(options_.queues, spec.queue(), tenant).status());
  const loom::v1::JobSpec* admitted = &spec;
  if (spec.technique() == "auto") {
    // Chosen against the nodes registered now, even when waiting for capacity: the choice is
    // written into the spec and fixes the checkpoint's layout (the ZeRO stage) for good.
    ASSIGN_OR_RETURN(AutoTechnique choice, ChooseTechniqueOnNodes(spec, RegisteredNodeShapes()));
    if (absl::Status s = ValidateJobSpec(choice.spec, options_.validation); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("technique: auto chose ", choice.choice.name(),
                                                  ", and the spec with its keys is refused: ",
                                                  s.message()));
    }
    *chosen = std::move(choice);
    admitted = &(*chosen)->spec;
  }
  if (wait_for_capacity) return absl::OkStatus();
  RETURN_IF_ERROR(CheckGangFitsRegisteredNodes(admitted->resources(), RegisteredNodesBySlots()));
  return CheckJobFitsNodeMemory(*admitted, RegisteredNodeShapes());
}

absl::StatusOr<loom::v1::SubmitJobResponse> Scheduler::DryRunSubmission(
    const loom::v1::JobSpec& spec, const std::string& tenant_in, bool wait_for_capacity) {
  const std::string tenant = tenant_in.empty() ? std::string("default") : tenant_in;
  std::optional<AutoTechnique> chosen;  // technique: auto
  RETURN_IF_ERROR(CheckAdmissible(spec, tenant, wait_for_capacity, &chosen));  // Submit's checks
  loom::v1::SubmitJobResponse answer;
  if (chosen.has_value()) {
    answer.add_notes(absl::StrCat("technique: auto chose ", chosen->choice.name(), ": ",
                                  chosen->choice.why(), " (",
                                  absl::StrJoin(chosen->choice.settings(), "; "), ")"));
  }
  const loom::v1::JobSpec& admitted = chosen.has_value() ? chosen->spec : spec;
  // What the trainer will read (validation has accepted both configs).
  ASSIGN_OR_RETURN(nlohmann::json model_json,
                   spec::StructToJson(admitted.model().config(), "model.config"));
  ASSIGN_OR_RETURN(spec::LlamaConfig model, spec::ParseLlamaConfigValue(model_json));
  nlohmann::json resolved;
  ASSIGN_OR_RETURN(spec::DeepSpeedConfig ds,
                   spec::ParseJobDeepSpeedConfig(admitted, model.hidden_size,
                                                 admitted.resources().num_ranks(), &resolved));
  answer.set_validated_only(true);
  for (const auto* list : {&ds.resolved, &ds.warnings, &model.warnings}) {
    for (const std::string& note : *list) answer.add_notes(note);
  }
  // nlohmann's text is valid JSON (invalid UTF-8 replaced), which protobuf's parser reads back.
  if (auto s = google::protobuf::util::JsonStringToMessage(
          resolved.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
          answer.mutable_resolved_deepspeed_config());
      !s.ok()) {
    return absl::InternalError(absl::StrCat("resolved deepspeed_config: ", s.ToString()));
  }
  return answer;
}

PathPolicy Scheduler::SubmissionPathPolicy() const {
  PathPolicy policy;
  policy.checkpoint_root = options_.checkpoint_root;
  policy.default_data_roots =
      options_.queues.data_roots.value_or(std::vector<std::string>{options_.validation.fortunes_dir});
  policy.tenant_data_roots = options_.queues.tenant_data_roots;
  policy.default_scratch_roots = options_.queues.scratch_roots;
  policy.tenant_scratch_roots = options_.queues.tenant_scratch_roots;
  return policy;
}

absl::Status Scheduler::ConfineSubmittedPaths(const loom::v1::JobSpec& spec,
                                              const std::string& tenant) {
  const PathPolicy policy = SubmissionPathPolicy();
  return ConfineJobSpecPaths(spec, tenant, policy,
                             [this](const std::string& job_id) -> absl::StatusOr<std::string> {
                               absl::MutexLock lock(&mu_);
                               auto it = jobs_.find(job_id);
                               if (it == jobs_.end()) return absl::NotFoundError(job_id);
                               return it->second.tenant;
                             });
}

void Scheduler::AdoptSubmissions(const std::vector<JobRecord>& batch, const absl::Status& stored) {
  absl::MutexLock lock(&mu_);
  for (const JobRecord& job : batch) {
    if (stored.ok()) jobs_.Add(job);  // before EndSubmission: the id stays taken throughout
    jobs_.EndSubmission(job);
    if (!stored.ok()) continue;
    admission_gate_.NoteJobChanged();
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
  if (metrics_ != nullptr) {
    metrics_->SetJobCounts(jobs_.phase_counts());
    metrics_->SubmissionsCommitted(static_cast<int64_t>(batch.size()));
  }
}

}  // namespace loom

namespace loom {

std::map<loom::v1::AcceleratorKind, int> Scheduler::LargestRegisteredNodes() {
  absl::MutexLock lock(&mu_);
  // Kept where nodes change (RankReconciler's live_nodes_by_slots): no walk over every node
  // under the lock for each submission (issue 16; docs/benchmarks.md "Control plane").
  return reconciler_.capacity().LargestNodeSlots();
}

NodesBySlots Scheduler::RegisteredNodesBySlots() {
  absl::MutexLock lock(&mu_);
  return reconciler_.capacity().live_nodes_by_slots;
}

std::map<NodeShapeKey, int> Scheduler::RegisteredNodeShapes() {
  absl::MutexLock lock(&mu_);
  return reconciler_.capacity().live_node_shapes;
}

}  // namespace loom
