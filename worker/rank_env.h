// File: worker/rank_env.h
//
// The environment of one rank's process (docs/scheduling.md "Device binding"): the variables
// PyTorch's launcher torchrun sets (torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), CUDA_VISIBLE_DEVICES naming only the devices the
// scheduler bound this rank to (RankAssignment.device_indices, as Slurm's gres/gpu plugin and
// Kubernetes' NVIDIA device plugin expose only the allocated GPUs), LOOM_ACCELERATOR_INDEX (the
// trainer's slot on the node), and NCCL_SOCKET_IFNAME / NCCL_IB_HCA when the worker was given
// them (NCCL's environment variables, NCCL user guide "Environment Variables").
//
// Thread-safety: pure function.
#ifndef LOOM_WORKER_RANK_ENV_H_
#define LOOM_WORKER_RANK_ENV_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/worker_service.pb.h"

namespace loom::worker {

struct NcclEnvOptions {
  std::string socket_ifname;  // NCCL_SOCKET_IFNAME, e.g. "eth0" or "^lo,docker" ("" = unset)
  std::string ib_hca;         // NCCL_IB_HCA, e.g. "mlx5_0,mlx5_1" ("" = unset)
};

// "KEY=VALUE" entries for the rank's process (RankProcessOptions.extra_env).
//
// `fallback_index` is the node slot the worker chose itself, used when the assignment carries
// no device_indices (a CPU node, or a scheduler without device binding). On a node with
// devices (node.devices() non-empty) CUDA_VISIBLE_DEVICES is always set: to the assignment's
// device indices, or to `fallback_index` when it has none. On a CPU node it is not set.
// LOCAL_RANK / LOCAL_WORLD_SIZE default to 0 / 1 when the assignment has local_world_size 0.
//
// Errors: FAILED_PRECONDITION "device_indices: ..." when an index is not a device of this node
// (the scheduler's view and the node's disagree), or on a CPU node given device indices.
absl::StatusOr<std::vector<std::string>> RankEnvironment(const loom::v1::RankAssignment& a,
                                                         const loom::v1::NodeInventory& node,
                                                         int fallback_index,
                                                         const NcclEnvOptions& nccl);

}  // namespace loom::worker

#endif  // LOOM_WORKER_RANK_ENV_H_
