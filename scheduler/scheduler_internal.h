// File: scheduler/scheduler_internal.h
//
// Helpers shared by the files of the Scheduler facade (scheduler*.cc); not part of its API.
// Thread-safety: pure functions.
#ifndef LOOM_SCHEDULER_SCHEDULER_INTERNAL_H_
#define LOOM_SCHEDULER_SCHEDULER_INTERNAL_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "proto/common.pb.h"
#include "scheduler/rank_reconciler.h"
#include "storage/job_store.h"

namespace loom {

using loom::v1::AcceleratorKind;
using loom::v1::JobPhase;
using loom::v1::RankState;

// The job's progress once rank 0 of its current attempt reports `reported` (a new attempt keeps
// the job's initial eval loss, last evaluation, checkpoint and step until it reports newer).
loom::v1::Progress MergeProgress(const loom::v1::Progress& job,
                                 const loom::v1::Progress& reported);
AcceleratorKind KindOf(const loom::v1::JobSpec& spec);
std::string KindName(AcceleratorKind kind);
// INFRA or SETUP: charged to the infra restart budget.
bool IsInfraClass(loom::v1::FailureClass c);
// "infra restart 2 of 3" / "user restart 1 of 2": the budget a restart is charged to, as a
// RECOVERING job's message states it. One spelling for FailAttempt, which charges the restart,
// and ReconsiderBlame, which moves it to the other budget and must rewrite the note (issue 42
// defect 7: the message said "infra restart 1 of 3" after the record moved it to user_restarts).
std::string RestartNote(bool infra, int32_t restart, int32_t max_restarts);
// "; `loomctl resume <id>` continues it from step N", appended to the message of a job that
// ends FAILED with its restart budget spent, when rank 0 reported a checkpoint (N = its
// progress.last_checkpoint_step; already in memory, no catalog call). "" when none was reported.
std::string ResumeHint(const JobRecord& job);
// Adds `node_id` (if non-empty and new) to the job's suspect nodes.
void AddSuspect(JobRecord* job, const std::string& node_id);
void SetTimestamp(absl::Time t, google::protobuf::Timestamp* ts);
// INVALID_ARGUMENT for an id too long to be real (and to be echoed back in an error).
absl::Status CheckIdLength(absl::string_view field, const std::string& id);
// As CheckIdLength, and INVALID_ARGUMENT "<field>: required" for an empty id (issue 52: GetJob("")
// answered NOT_FOUND, as if a job of that id could exist).
absl::Status CheckRequiredId(absl::string_view field, const std::string& id);
// Issue 48: `spec`'s ranks as spec/memory_plan.h predicts them against the memory of the
// registered nodes `shapes` (spec/memory_fit.h CheckJobFitsMemory): FAILED_PRECONDITION
// "memory: ..." naming the need, the room and the cheapest change that fits. OK when they fit,
// when no node of the job's kind reports its memory, or when the spec gives the planner nothing
// to go on (a model config it cannot read: validation has spoken for the spec).
absl::Status CheckJobFitsNodeMemory(const loom::v1::JobSpec& spec,
                                    const std::map<NodeShapeKey, int>& shapes);
// JobSpec.technique "auto" (issue 48): spec/technique_choice.h's choice for `spec` on the
// registered nodes `shapes` of its kind, written into a copy of the spec
// (spec/job_spec_settings.h) and recorded as Job.technique. FAILED_PRECONDITION when no node of
// the kind reports its memory (nothing to choose against) or nothing fits them (naming the
// smallest need found); INVALID_ARGUMENT when the planner cannot read the spec.
struct AutoTechnique {
  loom::v1::JobSpec spec;
  loom::v1::ChosenTechnique choice;
};
absl::StatusOr<AutoTechnique> ChooseTechniqueOnNodes(const loom::v1::JobSpec& spec,
                                                     const std::map<NodeShapeKey, int>& shapes);
// Whether `spec` is what was submitted for `earlier` (a retry with its request id): equal, or,
// when `earlier` chose its technique, equal once that choice's settings are written into it.
bool SameSubmittedSpec(const JobRecord& earlier, const loom::v1::JobSpec& spec);
// Records one rank's predicted host and device bytes, with the admission margin, in `state`
// (planned_rank_*_bytes: placement's memory limits); leaves them 0 when the planner cannot
// read the spec.
void RecordPlannedRankMemory(const loom::v1::JobSpec& spec,
                             loom::internal::JobSchedulingState* state);
// The address ranks use to reach the node: inventory address, else hostname, else its id.
std::string NodeAddress(const NodeRecord& node);

// Wall time in consecutive phases (Scheduler::CyclePhases): Lap() is the time since the last
// Lap() (or construction, or Restart()). Not thread-safe (one cycle's own).
class PhaseClock {
 public:
  PhaseClock() : mark_(absl::Now()) {}
  absl::Duration Lap() {
    const absl::Time t = absl::Now();
    const absl::Duration d = t - mark_;
    mark_ = t;
    return d;
  }
  void Restart() { mark_ = absl::Now(); }  // the time until now belongs to no phase

 private:
  absl::Time mark_;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_SCHEDULER_INTERNAL_H_
