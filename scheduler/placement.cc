#include "scheduler/placement.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scheduler/queues.h"

namespace loom {

NodePool::NodePool(std::vector<PoolNode> nodes) : nodes_(std::move(nodes)) {
  std::set<std::string> names;
  for (const PoolNode& n : nodes_) {
    names.insert(n.inventory.topology_domain().empty() ? "node:" + n.id
                                                       : n.inventory.topology_domain());
  }
  domain_names_.assign(names.begin(), names.end());
  std::map<std::string, int> dense;
  for (int d = 0; d < static_cast<int>(domain_names_.size()); ++d) dense[domain_names_[d]] = d;
  domain_of_.reserve(nodes_.size());
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    const PoolNode& n = nodes_[i];
    domain_of_.push_back(dense.at(n.inventory.topology_domain().empty()
                                      ? "node:" + n.id
                                      : n.inventory.topology_domain()));
    index_[n.id] = i;
  }
}

int NodePool::Find(const std::string& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second;
}

loom::v1::AcceleratorKind KindOf(const loom::v1::ResourceSpec& resources) {
  return resources.accelerator() == v1::ACCELERATOR_KIND_UNSPECIFIED ? v1::ACCELERATOR_KIND_CPU
                                                                      : resources.accelerator();
}

namespace {

bool SelectorMatches(const loom::v1::NodeInventory& inv, const loom::v1::ResourceSpec& r) {
  for (const auto& [key, value] : r.node_selector()) {
    auto it = inv.labels().find(key);
    if (it == inv.labels().end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

bool NodeMatches(const PoolNode& n, const loom::v1::ResourceSpec& r) {
  const loom::v1::NodeInventory& inv = n.inventory;
  return n.schedulable && inv.accelerator() == KindOf(r) &&
         inv.accelerator_memory_bytes() >= r.accelerator_memory_bytes() &&
         inv.host_memory_bytes() >= r.host_memory_bytes() &&
         (r.cpu_arch().empty() || inv.cpu_arch() == r.cpu_arch()) && SelectorMatches(inv, r);
}

std::string EligibilityKey(const loom::v1::ResourceSpec& resources, RankMemoryNeed memory) {
  const std::string need =
      memory.host > 0 || memory.device > 0 ? absl::StrCat("|m", memory.host, "|", memory.device)
                                           : "";
  if (resources.node_selector().empty()) {  // the common case, without serializing
    return absl::StrCat(static_cast<int>(KindOf(resources)), "|",
                        resources.require_single_domain() ? 1 : 0, "|",
                        resources.accelerator_memory_bytes(), "|", resources.host_memory_bytes(),
                        "|", resources.cpu_arch(), "|", resources.accelerators_per_node(), need);
  }
  loom::v1::ResourceSpec key = resources;
  key.set_num_ranks(0);
  key.set_accelerator(KindOf(resources));
  // Protobuf's deterministic serialization writes map entries in key order, so equal specs
  // give equal bytes and different selectors never collide.
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    key.SerializeToCodedStream(&coded);
  }
  return absl::StrCat("s|", out, need);
}

Eligibility ComputeEligibility(const NodePool& pool, const loom::v1::ResourceSpec& r,
                               RankMemoryNeed memory) {
  Eligibility e;
  const bool planned = memory.host > 0 || memory.device > 0;
  if (planned) e.memory_ranks.assign(pool.size(), 0);
  e.kind = KindOf(r);
  e.require_single_domain = r.require_single_domain();
  e.per_node = std::max(0, r.accelerators_per_node());
  e.member.assign(pool.size(), 0);
  std::map<int, std::vector<int>> by_domain;
  std::map<int, int64_t> domain_capacity;
  // Funnel counts for the explanation.
  int live = 0, uncordoned = 0, accel_mem = 0, host_mem = 0, arch = 0, selector = 0, per_node = 0;
  int fits_memory = 0;
  for (int i = 0; i < pool.size(); ++i) {
    const PoolNode& n = pool.node(i);
    const loom::v1::NodeInventory& inv = n.inventory;
    if (!n.live || inv.accelerator() != e.kind) continue;
    ++live;
    e.live_slots_of_kind += inv.slots();
    if (n.cordoned) continue;
    ++uncordoned;
    if (inv.accelerator_memory_bytes() < r.accelerator_memory_bytes()) continue;
    ++accel_mem;
    if (inv.host_memory_bytes() < r.host_memory_bytes()) continue;
    ++host_mem;
    if (!r.cpu_arch().empty() && inv.cpu_arch() != r.cpu_arch()) continue;
    ++arch;
    if (!SelectorMatches(inv, r)) continue;
    ++selector;
    if (!NodeMatches(n, r)) continue;
    if (inv.slots() < e.per_node) continue;  // cannot hold accelerators_per_node ranks
    ++per_node;
    int64_t held = inv.slots();
    if (planned) {
      if (memory.device > 0 && inv.accelerator_memory_bytes() > 0 &&
          inv.accelerator_memory_bytes() < memory.device) {
        held = 0;
      }
      if (memory.host > 0 && inv.host_memory_bytes() > 0) {
        held = std::min(held, inv.host_memory_bytes() / memory.host);
      }
      if (held < std::max(1, e.per_node)) continue;  // its memory holds no rank (or no k)
      e.memory_ranks[i] = static_cast<int>(held);
    }
    ++fits_memory;
    // With accelerators_per_node k a node holds exactly k of the gang's ranks.
    const int64_t slots = e.per_node > 0 ? e.per_node : held;
    e.member[i] = 1;
    by_domain[pool.domain(i)].push_back(i);
    domain_capacity[pool.domain(i)] += slots;
    e.capacity += slots;
  }
  for (auto& [d, nodes] : by_domain) {
    e.max_domain_capacity = std::max(e.max_domain_capacity, domain_capacity[d]);
    e.groups.emplace_back(d, std::move(nodes));
  }
  e.live_nodes_of_kind = live;
  const std::string kind = AcceleratorKindName(e.kind);
  if (uncordoned < live) {
    e.narrowed_by = absl::StrCat(live - uncordoned, " of ", live, " live ", kind,
                                 " nodes are cordoned");
  }
  auto note = [&](int before, int after, const std::string& what) {
    if (after == before) return;
    absl::StrAppend(&e.narrowed_by, e.narrowed_by.empty() ? "" : "; ",
                    after == 0 ? absl::StrCat(what, " matches no node")
                               : absl::StrCat(what, " matches ", after, " of ", before, " nodes"));
  };
  note(uncordoned, accel_mem, absl::StrCat("accelerator_memory_bytes >= ", r.accelerator_memory_bytes()));
  note(accel_mem, host_mem, absl::StrCat("host_memory_bytes >= ", r.host_memory_bytes()));
  note(host_mem, arch, absl::StrCat("cpu_arch ", r.cpu_arch()));
  if (selector < arch) {
    std::vector<std::string> labels;
    for (const auto& [k, v] : r.node_selector()) labels.push_back(absl::StrCat(k, "=", v));
    std::sort(labels.begin(), labels.end());
    note(arch, selector, absl::StrCat("node_selector ", absl::StrJoin(labels, ",")));
  }
  // Counted after NodeMatches (schedulable), so only when the key is set.
  if (e.per_node > 0) note(selector, per_node, absl::StrCat("accelerators_per_node ", e.per_node));
  if (planned) {
    note(per_node, fits_memory,
         absl::StrFormat("the predicted memory of a rank (host %.2f GiB%s)",
                         static_cast<double>(memory.host) / (1 << 30),
                         memory.device > 0
                             ? absl::StrFormat(", device %.2f GiB",
                                               static_cast<double>(memory.device) / (1 << 30))
                             : std::string()));
  }
  return e;
}

int64_t EligibleFree(const Eligibility& e, const std::vector<int>& free, int64_t* max_domain_free) {
  int64_t total = 0, best = 0;
  for (const auto& [d, nodes] : e.groups) {
    int64_t sum = 0;
    for (int i : nodes) {
      sum += std::max(0, e.memory_ranks.empty() ? free[i] : std::min(free[i], e.memory_ranks[i]));
    }
    total += sum;
    best = std::max(best, sum);
  }
  if (max_domain_free != nullptr) *max_domain_free = best;
  return total;
}

namespace {

std::vector<int> PlaceOnce(const NodePool& pool, const Eligibility& e, const std::vector<int>& free,
                           int need, const std::vector<char>& avoid) {
  auto usable = [&](int i) {
    return free[i] > 0 && (avoid.empty() || avoid[i] == 0);
  };
  struct Group {
    int domain;
    int64_t free;
    const std::vector<int>* nodes;
  };
  std::vector<Group> groups;
  int64_t total = 0;
  for (const auto& [d, nodes] : e.groups) {
    int64_t sum = 0;
    for (int i : nodes) {
      if (usable(i)) sum += free[i];
    }
    if (sum > 0) groups.push_back({d, sum, &nodes});
    total += sum;
  }
  if (total < need) return {};
  // groups are in domain-name order (dense indices are assigned in sorted name order).
  std::vector<const Group*> chosen;
  const Group* best = nullptr;
  for (const Group& g : groups) {
    if (g.free >= need && (best == nullptr || g.free < best->free)) best = &g;
  }
  if (best != nullptr) {
    chosen.push_back(best);
  } else {
    if (e.require_single_domain) return {};
    std::vector<const Group*> order;
    for (const Group& g : groups) order.push_back(&g);
    std::stable_sort(order.begin(), order.end(),
                     [](const Group* a, const Group* b) { return a->free > b->free; });
    int64_t sum = 0;
    for (const Group* g : order) {
      chosen.push_back(g);
      sum += g->free;
      if (sum >= need) break;
    }
  }
  std::vector<int> nodes;
  for (const Group* g : chosen) {
    for (int i : *g->nodes) {
      if (usable(i)) nodes.push_back(i);
    }
  }
  std::sort(nodes.begin(), nodes.end());  // id order
  std::vector<int> left(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) left[k] = free[nodes[k]];
  std::vector<int> placement;
  placement.reserve(need);
  while (static_cast<int>(placement.size()) < need) {
    for (size_t k = 0; k < nodes.size() && static_cast<int>(placement.size()) < need; ++k) {
      if (left[k] == 0) continue;
      --left[k];
      placement.push_back(nodes[k]);
    }
  }
  return placement;
}

}  // namespace

std::vector<int> PlaceGang(const NodePool& pool, const Eligibility& e, const std::vector<int>& free,
                           int need, const std::vector<char>& avoid) {
  if (need <= 0) return {};
  if (!e.memory_ranks.empty()) {
    // No more of the job's ranks on a node than its memory holds (issue 48).
    std::vector<int> held(free.size());
    for (size_t i = 0; i < free.size(); ++i) held[i] = std::min(free[i], e.memory_ranks[i]);
    Eligibility unlimited = e;
    unlimited.memory_ranks.clear();
    return PlaceGang(pool, unlimited, held, need, avoid);
  }
  if (e.per_node > 0) {
    // accelerators_per_node k: place need / k units of k ranks, at most one per node, then
    // give each chosen node k consecutive ranks (torchrun's node_rank * k + local_rank).
    const int k = e.per_node;
    if (need % k != 0) return {};
    std::vector<int> units(free.size());
    for (size_t i = 0; i < free.size(); ++i) units[i] = free[i] >= k ? 1 : 0;
    Eligibility unit_e = e;
    unit_e.per_node = 0;
    std::vector<int> nodes = PlaceGang(pool, unit_e, units, need / k, avoid);
    std::sort(nodes.begin(), nodes.end());
    std::vector<int> placement;
    placement.reserve(need);
    for (int i : nodes) placement.insert(placement.end(), k, i);
    return placement;
  }
  if (!avoid.empty()) {
    std::vector<int> p = PlaceOnce(pool, e, free, need, avoid);
    if (!p.empty()) return p;
  }
  return PlaceOnce(pool, e, free, need, {});
}

}  // namespace loom
