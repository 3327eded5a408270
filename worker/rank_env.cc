#include "worker/rank_env.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::worker {

absl::StatusOr<std::vector<std::string>> RankEnvironment(const loom::v1::RankAssignment& a,
                                                         const loom::v1::NodeInventory& node,
                                                         int fallback_index,
                                                         const NcclEnvOptions& nccl) {
  std::vector<int> devices(a.device_indices().begin(), a.device_indices().end());
  if (!devices.empty()) {
    if (node.devices().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device_indices: rank ", a.rank(), " of ", a.job_id(),
          " was bound to devices, but this node registered none (a CPU node)"));
    }
    std::set<int> known;
    for (const auto& d : node.devices()) known.insert(d.index());
    for (int index : devices) {
      if (known.count(index) == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device_indices: rank ", a.rank(), " of ", a.job_id(), " was bound to device ", index,
            ", which this node does not have (", node.devices_size(), " devices)"));
      }
    }
  } else if (!node.devices().empty()) {
    devices.push_back(fallback_index);
  }
  const int local_world_size = a.local_world_size() > 0 ? a.local_world_size() : 1;
  std::vector<std::string> env = {
      absl::StrCat("RANK=", a.rank()),
      absl::StrCat("WORLD_SIZE=", a.world_size()),
      absl::StrCat("LOCAL_RANK=", a.local_world_size() > 0 ? a.local_rank() : 0),
      absl::StrCat("LOCAL_WORLD_SIZE=", local_world_size),
      absl::StrCat("MASTER_ADDR=", a.master_addr().empty() ? "127.0.0.1" : a.master_addr()),
      absl::StrCat("MASTER_PORT=", a.master_port()),
      absl::StrCat("LOOM_ACCELERATOR_INDEX=", devices.empty() ? fallback_index : devices[0]),
  };
  if (!node.devices().empty()) {
    env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", absl::StrJoin(devices, ",")));
  }
  if (!nccl.socket_ifname.empty()) {
    env.push_back(absl::StrCat("NCCL_SOCKET_IFNAME=", nccl.socket_ifname));
  }
  if (!nccl.ib_hca.empty()) env.push_back(absl::StrCat("NCCL_IB_HCA=", nccl.ib_hca));
  return env;
}

}  // namespace loom::worker
