// File: scheduler/preemption.h
//
// Checkpoint-aware choice of preemption victims (docs/scheduling.md "Preemption";
// docs/design/CONTROL-PLANE.md §4 gap 3, Kueue #477). Pure: the caller supplies the candidates
// (running jobs of the preemptor's accelerator kind with strictly lower priority) and a feasibility
// test.
//
//   * Work a victim loses = (progress.step - last_checkpoint_step) x world size: the rank-steps
//     since its last committed checkpoint, which it recomputes after resuming from it.
//   * Candidates are ordered by lost work (least first), then lower priority first, then newest
//     (highest submission sequence) first. Victims are added in that order until the gang is
//     feasible; then each chosen victim is dropped again, last added first, if the gang stays
//     feasible without it. The result is minimal (no victim can be removed) and deterministic.
//
// Thread-safety: pure function.
#ifndef LOOM_SCHEDULER_PREEMPTION_H_
#define LOOM_SCHEDULER_PREEMPTION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct VictimCandidate {
  std::string job_id;
  int32_t priority = 0;
  int64_t sequence = 0;
  int64_t lost_work = 0;  // rank-steps since the last committed checkpoint
  // Slots the job frees: (pool node index, slots).
  std::vector<std::pair<int, int>> slots;
};

// Rank-steps lost when a job at `step` with its last committed checkpoint at `checkpoint_step`
// and `world_size` ranks is stopped now.
int64_t LostWork(int64_t step, int64_t checkpoint_step, int world_size);

// Indices into `candidates` of the victims to preempt (in the order chosen), or empty when even
// preempting every candidate does not make the gang feasible. `feasible(extra)` answers whether
// the gang fits when extra[i] more slots are free on pool node i.
std::vector<size_t> ChooseVictims(const std::vector<VictimCandidate>& candidates, int pool_size,
                                  const std::function<bool(const std::vector<int>&)>& feasible);

}  // namespace loom

#endif  // LOOM_SCHEDULER_PREEMPTION_H_
