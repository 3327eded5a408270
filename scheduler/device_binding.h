// File: scheduler/device_binding.h
//
// Which accelerator of a node each rank of a gang uses (docs/scheduling.md "Device binding").
// Placement (placement.h) decides how many ranks go to each node; binding then gives every rank
// the lowest device index of its node that no live rank of any other job holds. A node that
// registered no devices (NodeInventory.devices empty: a CPU node, or a worker started with a
// fixed --accelerator kind) binds nothing (index -1) and its worker picks a slot itself. As with
// Slurm's gres/gpu and Kubernetes' device plugins, a bound device is the rank's alone until the
// rank ends (job end, preemption, failure), when it is free for the next placement.
//
// Thread-safety: pure functions.
#ifndef LOOM_SCHEDULER_DEVICE_BINDING_H_
#define LOOM_SCHEDULER_DEVICE_BINDING_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/worker_service.pb.h"

namespace loom {

// For rank r placed on node placement[r]: the device index it is bound to, or -1 when that node
// has no devices. `devices` are each node's device indices (AcceleratorDevice.index; missing =
// none); `held` the indices live ranks of other jobs hold per node. Ranks on one node get
// increasing indices in rank order. RESOURCE_EXHAUSTED naming the node if it has fewer free
// devices than ranks placed on it (placement and binding disagree; the attempt is not started).
absl::StatusOr<std::vector<int32_t>> BindDevices(
    const std::vector<std::string>& placement,
    const std::map<std::string, std::vector<int32_t>>& devices,
    const std::map<std::string, std::set<int32_t>>& held);

// For rank r: (its position among the ranks on the same node, their count): torchrun's
// LOCAL_RANK and LOCAL_WORLD_SIZE.
std::pair<int32_t, int32_t> LocalRank(const std::vector<std::string>& placement, int32_t rank);

}  // namespace loom

#endif  // LOOM_SCHEDULER_DEVICE_BINDING_H_
