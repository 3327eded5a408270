#include "scheduler/job_spec_validation_accelerators.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/accelerator_kind.h"

namespace loom {

int MaxAcceleratorsPerNode(loom::v1::AcceleratorKind kind) {
  switch (kind) {
    case loom::v1::ACCELERATOR_KIND_H100:
    case loom::v1::ACCELERATOR_KIND_H200:
      return 8;
    case loom::v1::ACCELERATOR_KIND_GH200:
      return 4;
    default:
      return 256;
  }
}

absl::Status ValidateAcceleratorsPerNode(
    const loom::v1::ResourceSpec& resources,
    const std::map<loom::v1::AcceleratorKind, int>& largest_registered) {
  const int k = resources.accelerators_per_node();
  if (k == 0) return absl::OkStatus();
  constexpr char kField[] = "resources.accelerators_per_node: ";
  if (k < 0) return absl::InvalidArgumentError(absl::StrCat(kField, k, " must be >= 0"));
  const loom::v1::AcceleratorKind kind =
      resources.accelerator() == loom::v1::ACCELERATOR_KIND_UNSPECIFIED
          ? loom::v1::ACCELERATOR_KIND_CPU
          : resources.accelerator();
  const std::string name = AcceleratorKindName(kind);
  if (k > MaxAcceleratorsPerNode(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(kField, k, " ", name,
                                                   " accelerators per node requested, but a ",
                                                   name, " node has at most ",
                                                   MaxAcceleratorsPerNode(kind)));
  }
  auto largest = largest_registered.find(kind);
  if (largest != largest_registered.end() && k > largest->second) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, k, " ", name, " accelerators per node requested, but the largest registered ",
        name, " node has ", largest->second));
  }
  if (resources.num_ranks() % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kField, "resources.num_ranks ",
                                                   resources.num_ranks(),
                                                   " is not a multiple of ", k));
  }
  return absl::OkStatus();
}

namespace {

loom::v1::AcceleratorKind KindOf(const loom::v1::ResourceSpec& resources) {
  return resources.accelerator() == loom::v1::ACCELERATOR_KIND_UNSPECIFIED
             ? loom::v1::ACCELERATOR_KIND_CPU
             : resources.accelerator();
}

}  // namespace

int MaxGangRanks(const loom::v1::ResourceSpec& resources, const NodesBySlots& nodes) {
  const loom::v1::AcceleratorKind kind = KindOf(resources);
  const int k = std::max(0, resources.accelerators_per_node());
  int64_t ranks = 0;
  for (const auto& [kind_slots, count] : nodes) {
    if (kind_slots.first != kind || count <= 0) continue;
    const int slots = kind_slots.second;
    if (k == 0) {
      ranks += int64_t{slots} * count;
    } else if (slots >= k) {
      ranks += int64_t{k} * count;
    }
  }
  return static_cast<int>(std::min<int64_t>(ranks, std::numeric_limits<int>::max()));
}

absl::Status CheckGangFitsRegisteredNodes(const loom::v1::ResourceSpec& resources,
                                          const NodesBySlots& nodes) {
  int registered = 0;
  int of_kind = 0;
  int slots_of_kind = 0;
  const loom::v1::AcceleratorKind kind = KindOf(resources);
  for (const auto& [kind_slots, count] : nodes) {
    if (count <= 0) continue;
    registered += count;
    if (kind_slots.first == kind) {
      of_kind += count;
      slots_of_kind += kind_slots.second * count;
    }
  }
  if (registered == 0) return absl::OkStatus();
  const int fits = MaxGangRanks(resources, nodes);
  if (resources.num_ranks() <= fits) return absl::OkStatus();
  const std::string name = AcceleratorKindName(kind);
  std::string have;
  if (of_kind == 0) {
    have = absl::StrCat("no registered node has ", name, " slots (", registered,
                        " node(s) of other kinds)");
  } else if (resources.accelerators_per_node() > 0) {
    have = absl::StrCat("the registered ", name, " nodes can hold ", fits, " (",
                        resources.accelerators_per_node(), " per node with accelerators_per_node ",
                        resources.accelerators_per_node(), ", ", of_kind, " node(s), ",
                        slots_of_kind, " slots)");
  } else {
    have = absl::StrCat("the registered ", name, " nodes have ", slots_of_kind, " slots (",
                        of_kind, " node(s))");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "resources.num_ranks: ", resources.num_ranks(), " ", name, " ranks can never be placed: ",
      have, ", so the job would wait for nodes that may never come. Lower resources.num_ranks, "
      "add nodes, or submit with wait_for_capacity to queue for capacity that is coming "
      "(loomctl submit --wait_for_capacity; REST \"waitForCapacity\": true)"));
}

}  // namespace loom
