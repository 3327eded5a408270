#include "scheduler/job_state.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loom {
namespace {

using loom::v1::JobPhase;

// The whole state machine: one row per allowed edge.
const std::set<std::pair<JobPhase, JobPhase>>& AllowedEdges() {
  static const auto* const kEdges = new std::set<std::pair<JobPhase, JobPhase>>{
      {v1::JOB_PHASE_UNSPECIFIED, v1::JOB_PHASE_PENDING},

      {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_ADMITTED},
      {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_STARTING},
      {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_FAILED},
      {v1::JOB_PHASE_PENDING, v1::JOB_PHASE_CANCELLED},

      {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_PENDING},
      {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_STARTING},
      {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_FAILED},
      {v1::JOB_PHASE_ADMITTED, v1::JOB_PHASE_CANCELLED},

      // Requeued without a failure: preempted by a higher-priority job, or its node drained.
      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_PENDING},
      {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_PENDING},

      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_RUNNING},
      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_SUCCEEDED},
      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_RECOVERING},
      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_STOPPING},
      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_FAILED},
      {v1::JOB_PHASE_STARTING, v1::JOB_PHASE_CANCELLED},

      {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_SUCCEEDED},
      {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_RECOVERING},
      {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_STOPPING},
      {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_FAILED},
      {v1::JOB_PHASE_RUNNING, v1::JOB_PHASE_CANCELLED},

      {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_PENDING},
      {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_STARTING},
      {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_STOPPING},
      {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_FAILED},
      {v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_CANCELLED},

      {v1::JOB_PHASE_STOPPING, v1::JOB_PHASE_FAILED},
      {v1::JOB_PHASE_STOPPING, v1::JOB_PHASE_CANCELLED},

      // The only edges out of a terminal phase: an explicit ResumeJob (issue 49) continues a
      // FAILED or CANCELLED job from its newest committed checkpoint. SUCCEEDED stays final.
      {v1::JOB_PHASE_FAILED, v1::JOB_PHASE_PENDING},
      {v1::JOB_PHASE_CANCELLED, v1::JOB_PHASE_PENDING},
  };
  return *kEdges;
}

}  // namespace

absl::Status Transition(JobPhase from, JobPhase to) {
  if (IsTerminal(from) && AllowedEdges().count({from, to}) == 0) {
    return absl::FailedPreconditionError(absl::StrCat("job phase ", JobPhaseName(from),
                                                      " is terminal; cannot move to ",
                                                      JobPhaseName(to),
                                                      " (only ResumeJob moves a FAILED or "
                                                      "CANCELLED job back to PENDING)"));
  }
  if (AllowedEdges().count({from, to}) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job phase transition ", JobPhaseName(from), " -> ", JobPhaseName(to), " is not allowed"));
  }
  return absl::OkStatus();
}

bool IsTerminal(JobPhase phase) {
  return phase == v1::JOB_PHASE_SUCCEEDED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

absl::string_view JobPhaseName(JobPhase phase) {
  switch (phase) {
    case v1::JOB_PHASE_UNSPECIFIED: return "UNSPECIFIED";
    case v1::JOB_PHASE_PENDING: return "PENDING";
    case v1::JOB_PHASE_ADMITTED: return "ADMITTED";
    case v1::JOB_PHASE_STARTING: return "STARTING";
    case v1::JOB_PHASE_RUNNING: return "RUNNING";
    case v1::JOB_PHASE_RECOVERING: return "RECOVERING";
    case v1::JOB_PHASE_STOPPING: return "STOPPING";
    case v1::JOB_PHASE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_PHASE_FAILED: return "FAILED";
    case v1::JOB_PHASE_CANCELLED: return "CANCELLED";
    default: return "UNKNOWN";
  }
}

const std::vector<std::pair<JobPhase, JobPhase>>& AllowedTransitions() {
  static const auto* const kEdges = new std::vector<std::pair<JobPhase, JobPhase>>(
      AllowedEdges().begin(), AllowedEdges().end());
  return *kEdges;
}

const std::vector<JobPhase>& AllJobPhases() {
  static const auto* const kPhases = new std::vector<JobPhase>{
      v1::JOB_PHASE_PENDING,    v1::JOB_PHASE_ADMITTED,  v1::JOB_PHASE_STARTING,
      v1::JOB_PHASE_RUNNING,    v1::JOB_PHASE_RECOVERING, v1::JOB_PHASE_STOPPING,
      v1::JOB_PHASE_SUCCEEDED,  v1::JOB_PHASE_FAILED,    v1::JOB_PHASE_CANCELLED};
  return *kPhases;
}

}  // namespace loom
