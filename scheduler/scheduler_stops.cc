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

}  // namespace loom
