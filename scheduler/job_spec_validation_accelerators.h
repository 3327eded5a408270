// File: scheduler/job_spec_validation_accelerators.h
//
// Submission-time check of resources.accelerators_per_node (docs/job-spec.md, docs/scheduling.md
// "Device binding") against the cluster: a job asking for more accelerators on one node than any
// registered node of its kind has, or than the kind's largest node allows, could never be
// placed, so it is refused at once instead of waiting forever (Slurm's sbatch refuses
// --gpus-per-node beyond every node's GRES with "Requested node configuration is not
// available").
//
// Thread-safety: pure function.
#ifndef LOOM_SCHEDULER_JOB_SPEC_VALIDATION_ACCELERATORS_H_
#define LOOM_SCHEDULER_JOB_SPEC_VALIDATION_ACCELERATORS_H_

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "proto/common.pb.h"

namespace loom {

// The most accelerators (rank slots) one node of `kind` can have: 8 for h100 and h200 (HGX
// boards), 4 for gh200 (quad-GH200 blades, e.g. HPE Cray EX254n), 256 for cpu.
int MaxAcceleratorsPerNode(loom::v1::AcceleratorKind kind);

// `largest_registered`: per kind, the most slots of any registered (not lost) node; a kind
// without nodes is absent. INVALID_ARGUMENT whose message starts with
// "resources.accelerators_per_node: " when it is negative, does not divide num_ranks, exceeds
// MaxAcceleratorsPerNode, or exceeds the largest registered node of the kind (when there is
// one; with none registered yet the job may wait for one).
absl::Status ValidateAcceleratorsPerNode(
    const loom::v1::ResourceSpec& resources,
    const std::map<loom::v1::AcceleratorKind, int>& largest_registered);

// Registered nodes that are not lost (cordoned ones included: they may come back), counted per
// (accelerator kind, slots) as RankReconciler's CapacityCounts::live_nodes_by_slots keeps them.
using NodesBySlots = std::map<std::pair<loom::v1::AcceleratorKind, int>, int>;

// The most ranks of one gang the registered nodes could ever hold at once: the slots of every
// node of the job's kind, or with accelerators_per_node k, k on each node with >= k slots (a gang
// puts k ranks on a node, at most once: placement.h PlaceGang). An upper bound: node selectors,
// quotas and other jobs are not counted, so a job under it may still wait (ExplainPending says
// why), but a job over it can never run.
int MaxGangRanks(const loom::v1::ResourceSpec& resources, const NodesBySlots& nodes);

// Admission that tells at once (issue 49): FAILED_PRECONDITION starting "resources.num_ranks: "
// when num_ranks > MaxGangRanks, naming what the registered nodes have and the ways out (fewer
// ranks, more nodes, or submitting with wait_for_capacity to queue for capacity that may come).
// OK when no node at all is registered (a cluster starting, or a scheduler whose nodes are
// registering again): that job waits, as before.
absl::Status CheckGangFitsRegisteredNodes(const loom::v1::ResourceSpec& resources,
                                          const NodesBySlots& nodes);

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_SPEC_VALIDATION_ACCELERATORS_H_
