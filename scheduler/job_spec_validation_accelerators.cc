#include "scheduler/job_spec_validation_accelerators.h"

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

}  // namespace loom
