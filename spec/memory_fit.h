// File: spec/memory_fit.h
//
// Admission by memory (issue 48): whether a job's ranks, as spec/memory_plan.h predicts them,
// fit the memory of the nodes that could run them, and if not, the cheapest change of the job
// that would. Torch-free and pure: the scheduler calls it at submission with the registered
// nodes' shapes (scheduler/scheduler_submit.cc), `loomctl plan` can call it with nodes given on
// its command line.
//
// The rule. A node of `slots` slots holds at most min(slots, floor(room / need)) ranks of the job,
// where `need` is a rank's predicted bytes times (1 + kAdmissionMargin) and `room` the node's
// host memory (CPU ranks: device memory is host memory) or, for accelerator ranks, each
// accelerator's memory for the device terms (a rank per accelerator) and the node's host memory
// shared by its ranks for the host terms. With resources.accelerators_per_node k a node holds k
// ranks or none, as gang placement puts them. The job fits when the nodes of its kind hold
// num_ranks in all. Memory 0 on a node means "not reported": it never refuses.
//
// This is an upper bound in the way scheduler/job_spec_validation_accelerators.h's slot check
// is: a job under it may still wait, and gang placement does not yet pack ranks by memory (two
// ranks may land on one node that holds one); a job over it would run out of memory on every
// registered node, so it is refused at submission rather than OOM-killed after it started.
//
// The margin: the plan's whole-process prediction was within -11% .. +7% of the measured VmHWM
// on worker/trainer:memory_plan_trainer_test's grid (docs/benchmarks.md "Memory planner
// accuracy"); admitting only with 15% headroom keeps a rank the plan under-predicts by 11% within
// its node's memory.
//
// Suggestions, cheapest first (each re-planned; the first whose plan fits is returned, so
// applying it as written gets the job admitted): ZeRO stage 2, then 3 (when N > 1: shards
// gradients and optimizer states, then parameters too; DeepSpeed's first answer), activation
// checkpointing (recompute
// ~1/3 more forward work), half the micro-batch with twice the gradient accumulation steps (same
// global batch, more steps' overhead), both of the first two, then more ranks (with stage 3) up to
// what the nodes hold, then on accelerator ranks optimizer and then parameter offload to the host.
//
// Units: bytes. Thread-safety: pure functions.
#ifndef LOOM_SPEC_MEMORY_FIT_H_
#define LOOM_SPEC_MEMORY_FIT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/common.pb.h"
#include "spec/memory_plan.h"

namespace loom::spec {

// Headroom over the plan before a rank is admitted (see the file comment).
inline constexpr double kAdmissionMargin = 0.15;
// ceil(bytes x (1 + kAdmissionMargin)): what a rank of `bytes` needs of a node to be admitted.
int64_t WithAdmissionMargin(int64_t bytes);

// Nodes of one shape that could run the job's ranks (not lost; cordoned ones included: they may
// come back).
struct NodeShape {
  loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU;
  int slots = 0;
  int64_t host_memory_bytes = 0;         // per node; 0 = not reported
  int64_t accelerator_memory_bytes = 0;  // per accelerator; 0 = not reported (CPU nodes)
  int count = 1;                         // nodes of this shape
};

// What FitOnNodes found.
struct MemoryFit {
  bool fits = true;
  int ranks_held = 0;  // ranks of the job the nodes of its kind could hold, memory counted
  // When it does not fit: the place that binds ("host" or "device"), one rank's need there with
  // the margin, the largest room one rank gets there (host memory of the roomiest node, or the
  // largest accelerator), and the largest term of that place.
  std::string place;
  int64_t need_bytes = 0;
  int64_t room_bytes = 0;
  MemoryTerm largest;
};

// `plan` for `num_ranks` ranks of `kind`, `accelerators_per_node` (0 = any) against `nodes`
// (other kinds are skipped). Fits trivially when no node of the kind is given (the slot check
// speaks for that case).
MemoryFit FitOnNodes(const RankMemoryPlan& plan, int num_ranks, loom::v1::AcceleratorKind kind,
                     int accelerators_per_node, const std::vector<NodeShape>& nodes);

// A change of the job that fits, in the job spec's own keys.
struct MemorySuggestion {
  std::string change;  // e.g. "deepspeed_config.zero_optimization.stage: 3"
  RankMemoryPlan plan;
  int num_ranks = 0;
  // The same change as settings that spec/job_spec_settings.h writes into a spec ("PATH: VALUE";
  // `change` says it for people, these apply it: the deepspeed_config keys replace the user's at
  // those paths, the rest of the config kept).
  std::vector<std::string> settings;
};

// The cheapest change (see the file comment) whose plan fits `nodes`; nullopt when none does.
std::optional<MemorySuggestion> SuggestMemoryFit(const MemoryPlanInput& in,
                                                 loom::v1::AcceleratorKind kind,
                                                 int accelerators_per_node,
                                                 const std::vector<NodeShape>& nodes);

// Admission: OK when the job fits (or nothing is known of the nodes' memory), else
// FAILED_PRECONDITION starting "memory: " naming the place, one rank's need with its largest
// term, the room, and the suggestion (or that no single change found fits, with the smallest
// per-rank need found). Errors of PlanRankMemory as returned.
absl::Status CheckJobFitsMemory(const MemoryPlanInput& in, loom::v1::AcceleratorKind kind,
                                int accelerators_per_node, const std::vector<NodeShape>& nodes);

}  // namespace loom::spec

#endif  // LOOM_SPEC_MEMORY_FIT_H_
