// The Scheduler facade's admission-pass rules (docs/scheduling.md "Admission passes"): whether a
// scheduling cycle runs a placement pass at all, and over how many waiting jobs; and the job
// indexes the cycle walks instead of every job ever submitted.
//
//   * Skip: a pass reads the job records (job_changes_: CommitJob, submissions), the rank table
//     (RankReconciler::generation: ranks added, erased, ended, asked to stop; nodes changed),
//     the nodes (node_changes_: registration, cordon, drain, loss, reachability), the resume
//     answers of jobs placed before, and the clock (backoff expiries). When none of them changed
//     since the last pass and no backoff expired, the pass would decide exactly what the last
//     one did: it is skipped (no snapshot, no ordering, no placement).
//   * Depth: a pass that runs decides about the first admission_queue_depth waiting jobs in
//     queue order (Slurm's default_queue_depth); a full pass over every waiting job runs at most
//     every admission_full_interval (Slurm's sched_interval), and also without a change when the
//     last pass left jobs unconsidered, so a job deep in the queue that could backfill is
//     considered within that interval.
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "scheduler/job_state.h"
#include "scheduler/record_helpers.h"
#include "scheduler/scheduler.h"

namespace loom {

void Scheduler::IndexJob(JobRecord* job) {
  const bool terminal = IsTerminal(job->phase);
  const bool fresh = job->phase == v1::JOB_PHASE_PENDING && job->attempt == 0;
  if (!terminal && !fresh) {
    active_jobs_[job->id] = job;
  } else {
    active_jobs_.erase(job->id);
  }
  if (Waiting(*job)) {
    waiting_jobs_[job->id] = job;
  } else {
    waiting_jobs_.erase(job->id);
  }
}

Scheduler::AdmissionPassStats::Kind Scheduler::ChooseAdmissionPass(
    const std::map<std::string, absl::StatusOr<CommittedCheckpoint>>& resume, absl::Time now) {
  PassInputs in;
  in.jobs = job_changes_;
  in.nodes = node_changes_;
  in.ranks = reconciler_.generation();
  // What BuildSnapshot makes of each answer: known (a checkpoint, or none) or the error.
  for (const auto& [job_id, answer] : resume) {
    in.resume[job_id] = answer.ok() || absl::IsNotFound(answer.status())
                            ? std::string()
                            : std::string(answer.status().message());
  }
  const bool changed =
      !last_pass_inputs_.has_value() || !(in == *last_pass_inputs_) || now >= next_pass_wake_;
  const bool full_due = options_.admission_queue_depth == 0 ||
                        now - last_full_pass_ >= options_.admission_full_interval;
  next_pass_inputs_ = std::move(in);
  if (!changed && !(last_pass_cut_off_ && full_due)) return AdmissionPassStats::Kind::kSkipped;
  return full_due ? AdmissionPassStats::Kind::kFull : AdmissionPassStats::Kind::kPartial;
}

void Scheduler::NoteAdmissionPass(AdmissionPassStats::Kind kind, const ClusterSnapshot& snapshot,
                                  int considered, absl::Time now) {
  last_pass_inputs_ = next_pass_inputs_;
  last_pass_.kind = kind;
  last_pass_.considered = considered;
  last_pass_.waiting = static_cast<int>(snapshot.waiting.size());
  last_pass_cut_off_ = considered < last_pass_.waiting;
  if (kind == AdmissionPassStats::Kind::kFull) last_full_pass_ = now;
  // The earliest backoff expiry still ahead: the pass must run again then.
  next_pass_wake_ = absl::InfiniteFuture();
  for (const ClusterSnapshot::WaitingJob& w : snapshot.waiting) {
    const int64_t not_before_us = w.job->state.not_before_us();
    if (not_before_us <= 0) continue;
    const absl::Time not_before = absl::FromUnixMicros(not_before_us);
    if (not_before > now && not_before < next_pass_wake_) next_pass_wake_ = not_before;
  }
}

Scheduler::AdmissionPassStats Scheduler::LastAdmissionPass() {
  absl::MutexLock lock(&mu_);
  return last_pass_;
}

}  // namespace loom
