// The Scheduler facade's stop coordinator: graceful stops (CancelJob), kills (KillJob), a
// stopping rank's final report, escalation to kill after cancel_grace, and the end of a stop
// once no rank of the job is left. Runs under the facade's lock (scheduler.h).
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

absl::StatusOr<loom::v1::Job> Scheduler::CancelJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
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
  stop_coordinator_.Begin(job_id, clock_->Now(), options_.cancel_grace);
  reconciler_.SetGracefulStop(job_id, /*graceful=*/true, /*request_stop=*/true);
  LOG(INFO) << "job " << job_id << " STOPPING: " << jobs_.at(job_id).message;
  UpdateGauges();
  return JobRecordToProto(jobs_.at(job_id));
}

absl::StatusOr<loom::v1::Job> Scheduler::KillJob(const std::string& job_id) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", job_id));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const JobRecord* found, FindUnendedJob(job_id));
  const JobRecord& job = *found;
  const int64_t newest = job.progress.last_checkpoint_step();
  std::string message;
  const StopCoordinator::StopRequest* stop =
      job.phase == v1::JOB_PHASE_STOPPING ? stop_coordinator_.Find(job_id) : nullptr;
  if (stop != nullptr && !stop->escalated && stop->final_checkpoint_step >= 0) {
    message = absl::StrCat("killed by request while STOPPING, after rank 0 had confirmed the final "
                           "checkpoint at step ", stop->final_checkpoint_step);
  } else if (stop != nullptr && !stop->escalated) {
    // The ranks may have committed their final checkpoint already, with the report still on its
    // way (a kill right after the trainers' "stopped"): do not claim there is none.
    message = absl::StrCat(
        "killed by request while STOPPING: the ranks were writing a final checkpoint and may "
        "have committed it before they were killed (newest confirmed: ",
        newest > 0 ? absl::StrCat("step ", newest) : std::string("none"),
        "; `loomctl checkpoints ", job_id, "` lists the committed steps)");
  } else {
    message = absl::StrCat("killed by request while ", JobPhaseName(job.phase),
                           ": ranks stopped without a final checkpoint");
    if (newest > 0) absl::StrAppend(&message, " (newest checkpoint at step ", newest, ")");
  }
  RETURN_IF_ERROR(EndJob(job_id, v1::JOB_PHASE_CANCELLED, v1::FAILURE_CLASS_UNSPECIFIED,
                         "Killed", message));
  UpdateGauges();
  return JobRecordToProto(jobs_.at(job_id));
}

void Scheduler::RecordStoppingRank(const loom::v1::RankStatus& st, const std::string& node_id) {
  std::optional<std::string> escalate =
      stop_coordinator_.RecordRankEnd(st, RankExitMessage(st.rank(), node_id, st));
  if (escalate.has_value()) (void)EscalateStop(st.job_id(), *escalate);
}

absl::Status Scheduler::EscalateStop(const std::string& job_id, const std::string& why) {
  if (!stop_coordinator_.Escalate(job_id, why)) return absl::OkStatus();
  reconciler_.SetGracefulStop(job_id, /*graceful=*/false, /*request_stop=*/false);
  JobRecord updated = jobs_.at(job_id);
  updated.message = absl::StrCat("cancel requested; graceful stop abandoned (", why,
                                 "): killing the ranks");
  LOG(WARNING) << "job " << job_id << ": " << updated.message;
  return CommitJob(std::move(updated));
}

absl::Status Scheduler::FinishStops() {
  std::vector<std::string> done;
  for (const std::string& job_id : stop_coordinator_.Jobs()) {
    if (!reconciler_.HasRanks(job_id)) done.push_back(job_id);
  }
  for (const std::string& job_id : done) {
    const JobRecord& job = jobs_.at(job_id);
    if (job.phase != v1::JOB_PHASE_STOPPING) {
      stop_coordinator_.Forget(job_id);
      continue;
    }
    const std::string message =
        stop_coordinator_.FinalMessage(job_id, job.progress.last_checkpoint_step());
    RETURN_IF_ERROR(EndJob(job_id, v1::JOB_PHASE_CANCELLED, v1::FAILURE_CLASS_UNSPECIFIED,
                           "Cancelled", message));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::CheckStops() {
  for (const std::string& job_id : stop_coordinator_.Late(clock_->Now())) {
    RETURN_IF_ERROR(EscalateStop(
        job_id, absl::StrCat("the ranks did not stop within ",
                             absl::FormatDuration(options_.cancel_grace))));
  }
  return FinishStops();
}

}  // namespace loom
