// The Scheduler facade's ResumeJob (issue 49): a FAILED or CANCELLED job continues in place, with
// its id, logs and history, from its newest committed checkpoint. The job only goes back to
// PENDING here; the ordinary placement path (scheduler_admission.cc StartAttempt) then starts
// attempt + 1, which resumes from the newest committed checkpoint as every restarted attempt
// does. See scheduler.h.
#include "scheduler/scheduler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/job_spec_validation_accelerators.h"
#include "scheduler/job_state.h"
#include "scheduler/scheduler_internal.h"

namespace loom {

absl::StatusOr<loom::v1::Job> Scheduler::ResumeJob(const std::string& job_id,
                                                   bool wait_for_capacity) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
  // What the checks off the lock need; the job is checked again under the lock before it moves.
  JobPhase phase;
  int32_t attempt;
  std::string checkpoint_dir;
  loom::v1::JobSpec spec;  // a copy: the memory check reads the model and DeepSpeed configs
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return JobNotFound(job_id);
    const JobRecord& job = it->second;
    if (job.phase == v1::JOB_PHASE_SUCCEEDED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is SUCCEEDED: there is nothing to resume; to train further, submit a "
          "new job (e.g. with more training.steps)"));
    }
    if (job.phase != v1::JOB_PHASE_FAILED && job.phase != v1::JOB_PHASE_CANCELLED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is ", JobPhaseName(job.phase),
          ": only a FAILED or CANCELLED job can be resumed"));
    }
    phase = job.phase;
    attempt = job.attempt;
    checkpoint_dir = job.checkpoint_dir;
    spec = job.spec;
  }
  // Off the lock: the registered nodes (takes mu_ itself) and the checkpoint catalog (possibly a
  // remote service, never called under mu_).
  if (!wait_for_capacity) {
    RETURN_IF_ERROR(CheckGangFitsRegisteredNodes(spec.resources(), RegisteredNodesBySlots()));
    RETURN_IF_ERROR(CheckJobFitsNodeMemory(spec, RegisteredNodeShapes()));
  }
  absl::StatusOr<CommittedCheckpoint> newest = checkpoints_->NewestCommitted(job_id, checkpoint_dir);
  if (absl::IsNotFound(newest.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no committed checkpoint in ", checkpoint_dir,
        ": resuming it would start over from step 0; submit it again instead"));
  }
  if (!newest.ok()) {
    return absl::Status(newest.status().code(),
                        absl::StrCat("cannot look up the checkpoints of job ", job_id, " in ",
                                     checkpoint_dir, ": ", newest.status().message()));
  }

  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  if (it->second.phase != phase || it->second.attempt != attempt) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " changed while it was being resumed (now ",
                                           JobPhaseName(it->second.phase), "); try again"));
  }
  RETURN_IF_ERROR(CheckUnfinishedJobLimit(it->second.tenant));
  JobRecord updated = it->second;
  updated.phase = v1::JOB_PHASE_PENDING;
  updated.reason = "Resumed";
  updated.failure_class = v1::FAILURE_CLASS_UNSPECIFIED;
  updated.end_time = absl::InfinitePast();
  // Both budgets start afresh: the job gets its max_restarts / max_infra_restarts again.
  updated.state.set_user_restarts(0);
  updated.state.set_infra_restarts(0);
  updated.state.set_not_before_us(0);
  updated.state.set_attempt_start_us(0);
  // The job is back at its checkpoint: its step and newest checkpoint say where the next attempt
  // starts (loomctl resume prints it) until that attempt reports.
  updated.progress.set_step(newest->step);
  updated.progress.set_last_checkpoint_step(newest->step);
  updated.message = absl::StrCat("resumed on request (was ", JobPhaseName(phase), ") from step ",
                                 newest->step, " (", newest->path, "); its next attempt (",
                                 attempt + 1, ") starts there");
  // CommitJob checks the edge (FAILED/CANCELLED -> PENDING), records it in the history, keeps
  // the phase and tenant counts, stores the job, indexes it as waiting and tells the admission
  // gate, so the next scheduling cycle looks up its resume point and places it.
  RETURN_IF_ERROR(CommitJob(std::move(updated)));
  logs_->MarkResumed(job_id);  // `loomctl logs --follow` waits for the new attempt's lines
  LOG(INFO) << "job " << job_id << " PENDING: " << jobs_.at(job_id).message;
  UpdateGauges();
  return JobRecordToProto(jobs_.at(job_id));
}

}  // namespace loom
