// The Scheduler facade's admission-pass rules (docs/scheduling.md "Admission passes"): whether a
// scheduling cycle runs a placement pass at all, and over how many waiting jobs, is decided by
// admission_pass_gate.h from what the Scheduler tells it (job and node changes, reachability,
// the rank table's generation, the resume answers, the backoff expiries).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/job_state.h"
#include "scheduler/record_helpers.h"
#include "scheduler/scheduler.h"

namespace loom {

Scheduler::AdmissionPassStats::Kind Scheduler::ChooseAdmissionPass(
    const std::map<std::string, absl::StatusOr<CommittedCheckpoint>>& resume, absl::Time now) {
  // What BuildSnapshot makes of each answer: known (a checkpoint, or none) or the error.
  std::map<std::string, std::string> summary;
  for (const auto& [job_id, answer] : resume) {
    summary[job_id] = AdmissionPassGate::ResumeSummary(answer.status());
  }
  return admission_gate_.Choose(reconciler_.generation(), std::move(summary), now);
}

void Scheduler::NoteAdmissionPass(AdmissionPassStats::Kind kind, const ClusterSnapshot& snapshot,
                                  int considered, absl::Time now) {
  std::vector<absl::Time> not_before;
  not_before.reserve(snapshot.waiting.size());
  for (const ClusterSnapshot::WaitingJob& w : snapshot.waiting) {
    const int64_t not_before_us = w.not_before_us;
    if (not_before_us > 0) not_before.push_back(absl::FromUnixMicros(not_before_us));
  }
  admission_gate_.NotePass(kind, considered, static_cast<int>(snapshot.waiting.size()),
                           not_before, now);
}

Scheduler::AdmissionPassStats Scheduler::LastAdmissionPass() {
  absl::MutexLock lock(&mu_);
  return admission_gate_.last_pass();
}

Scheduler::CyclePhases Scheduler::LastCyclePhases() {
  absl::MutexLock lock(&mu_);
  return last_cycle_phases_;
}

}  // namespace loom
