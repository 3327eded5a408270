// File: scheduler/job_state.h
//
// The job lifecycle state machine (docs/design/DESIGN.md "Job model"). A job's user-facing phase is
// the proto enum loom::v1::JobPhase; every phase change in the scheduler goes through Transition(),
// whose allowed edges live in one table (job_state.cc). Terminal phases (SUCCEEDED, FAILED,
// CANCELLED) are final except for an explicit ResumeJob (issue 49): FAILED and CANCELLED may go
// back to PENDING (Scheduler::ResumeJob, the only caller that makes that change); SUCCEEDED is
// final.
//
//   UNSPECIFIED --submit--> PENDING
//   PENDING    -> ADMITTED | STARTING | FAILED | CANCELLED
//   ADMITTED   -> PENDING | STARTING | FAILED | CANCELLED
//   STARTING   -> PENDING | RUNNING | SUCCEEDED | RECOVERING | STOPPING | FAILED | CANCELLED
//   RUNNING    -> PENDING | SUCCEEDED | RECOVERING | STOPPING | FAILED | CANCELLED
//   RECOVERING -> PENDING | STARTING | STOPPING | FAILED | CANCELLED
//   STOPPING   -> FAILED | CANCELLED
//   FAILED     -> PENDING   (ResumeJob only)
//   CANCELLED  -> PENDING   (ResumeJob only)
//
// STARTING/RUNNING -> PENDING requeue a job that did not fail (preemption, node drain).
// STARTING -> SUCCEEDED exists because a short job's ranks may finish before the scheduler has
// seen all of them RUNNING. Self-edges are not transitions and are refused.
#ifndef LOOM_SCHEDULER_JOB_STATE_H_
#define LOOM_SCHEDULER_JOB_STATE_H_

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/common.pb.h"

namespace loom {

// OK if `from` -> `to` is an allowed edge; FAILED_PRECONDITION naming both phases otherwise
// (including every self-edge and every edge out of a terminal phase but FAILED/CANCELLED ->
// PENDING). Thread-safe (pure).
absl::Status Transition(loom::v1::JobPhase from, loom::v1::JobPhase to);

// True for SUCCEEDED, FAILED and CANCELLED (a FAILED or CANCELLED job stays terminal until a
// ResumeJob moves it back to PENDING).
bool IsTerminal(loom::v1::JobPhase phase);

// Short upper-case name without the prefix: "PENDING", "RUNNING", ... ("UNKNOWN" for values
// outside the enum). Also used as the `phase` label of metrics.
absl::string_view JobPhaseName(loom::v1::JobPhase phase);

// Every allowed edge (from, to), including UNSPECIFIED -> PENDING (submit), in table order. The
// closed label set of loom_job_phase_transitions_total (scheduler_metrics.h).
const std::vector<std::pair<loom::v1::JobPhase, loom::v1::JobPhase>>& AllowedTransitions();

// Every phase of the enum except UNSPECIFIED, in enum order.
const std::vector<loom::v1::JobPhase>& AllJobPhases();

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_STATE_H_
