// File: scheduler/placement.h
//
// Gang placement over a snapshot of the cluster's nodes (docs/scheduling.md "Placement"). Pure
// functions over plain data, so the policy is tested without a scheduler:
//
//   * A node is eligible for a job when it is schedulable (live, not cordoned) and matches the
//     job's ResourceSpec: accelerator kind, accelerator memory per accelerator >= the request,
//     host memory >= the request (on a superchip node the Grace memory, reported as host
//     memory, is the offload capacity), cpu_arch equal when requested, and every node_selector
//     label equal.
//   * A gang is placed all at once or not at all. Nodes are grouped by topology domain (a node
//     without one is its own domain). If one domain has enough free slots, the gang goes to the
//     one with the fewest free slots that still fit (best fit; ties by domain name). Otherwise,
//     unless the job requires a single domain, domains are taken by most free slots first
//     (fewest domains; ties by name) until the gang fits. Ranks are spread round-robin, one per
//     node per round, over the chosen nodes in id order. With accelerators_per_node k, each
//     node used gets exactly k consecutive ranks (nodes with fewer than k slots, or fewer than
//     k free, are not used).
//   * Which device of a node each rank gets is device_binding.h's job.
//   * Nodes to avoid (suspects of the job's earlier failures) are left out when the gang fits
//     without them.
//
// Thread-safety: pure functions; NodePool is immutable after construction.
#ifndef LOOM_SCHEDULER_PLACEMENT_H_
#define LOOM_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "proto/common.pb.h"
#include "proto/worker_service.pb.h"

namespace loom {

struct PoolNode {
  std::string id;
  loom::v1::NodeInventory inventory;
  bool schedulable = true;  // live and not cordoned
  bool live = true;
  bool cordoned = false;
};

// Nodes in id order with dense topology-domain indices. Immutable.
class NodePool {
 public:
  explicit NodePool(std::vector<PoolNode> nodes);  // must be sorted by id
  int size() const { return static_cast<int>(nodes_.size()); }
  const PoolNode& node(int i) const { return nodes_[i]; }
  int domain(int i) const { return domain_of_[i]; }
  const std::string& domain_name(int d) const { return domain_names_[d]; }
  int num_domains() const { return static_cast<int>(domain_names_.size()); }
  // Index of the node with this id, or -1.
  int Find(const std::string& id) const;

 private:
  std::vector<PoolNode> nodes_;
  std::vector<int> domain_of_;
  std::vector<std::string> domain_names_;  // sorted
  absl::flat_hash_map<std::string, int> index_;
};

// The nodes a ResourceSpec may use, grouped by domain (both in order), with capacities.
struct Eligibility {
  loom::v1::AcceleratorKind kind = loom::v1::ACCELERATOR_KIND_CPU;
  bool require_single_domain = false;
  // ResourceSpec.accelerators_per_node (0 = any packing): nodes with fewer slots are not
  // eligible, and PlaceGang gives each node it uses exactly this many consecutive ranks.
  int per_node = 0;
  std::vector<std::pair<int, std::vector<int>>> groups;  // (domain, node indices)
  std::vector<char> member;  // per pool node: 1 if eligible
  int64_t capacity = 0;      // slots over eligible nodes
  int64_t max_domain_capacity = 0;
  // Why fewer nodes are eligible than there are live nodes of the kind, e.g. "node_selector
  // zone=b matches no node", "2 of 4 h100 nodes are cordoned" ("" when all qualify).
  std::string narrowed_by;
  int live_nodes_of_kind = 0;
  int64_t live_slots_of_kind = 0;
  // Per pool node: the most of the job's ranks its memory holds (RankMemoryNeed; empty when the
  // job has no predicted need). PlaceGang puts no more there; `capacity` counts no more.
  std::vector<int> memory_ranks;
};

// One rank's predicted memory (JobSchedulingState.planned_rank_*_bytes, issue 48; bytes, 0 =
// none). A node that reports its memory holds floor(host_memory_bytes / host) of the job's ranks
// and none if an accelerator has less than `device`; one that reports 0 is not limited.
struct RankMemoryNeed {
  int64_t host = 0;
  int64_t device = 0;
};

// Accelerator kind of a spec (UNSPECIFIED means CPU).
loom::v1::AcceleratorKind KindOf(const loom::v1::ResourceSpec& resources);

// Whether node `n` satisfies `resources` (see the file comment); ignores free slots.
bool NodeMatches(const PoolNode& n, const loom::v1::ResourceSpec& resources);

Eligibility ComputeEligibility(const NodePool& pool, const loom::v1::ResourceSpec& resources,
                               RankMemoryNeed memory = {});

// A key equal for specs with the same eligibility (everything but num_ranks).
std::string EligibilityKey(const loom::v1::ResourceSpec& resources, RankMemoryNeed memory = {});

// Places `need` ranks on eligible nodes with free[i] free slots each. Returns the node index
// of each rank, or an empty vector when the gang does not fit. `avoid` (per node, may be empty)
// marks nodes to leave out if possible. Does not modify `free`.
std::vector<int> PlaceGang(const NodePool& pool, const Eligibility& eligibility,
                           const std::vector<int>& free, int need,
                           const std::vector<char>& avoid = {});

// Free slots over eligible nodes, and the largest per-domain sum.
int64_t EligibleFree(const Eligibility& eligibility, const std::vector<int>& free,
                     int64_t* max_domain_free = nullptr);

}  // namespace loom

#endif  // LOOM_SCHEDULER_PLACEMENT_H_
