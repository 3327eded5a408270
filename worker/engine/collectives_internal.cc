// The checks and the completed handle shared by the Collectives implementations
// (collectives_internal.h).
#include "worker/engine/collectives_internal.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::engine::collectives_internal {
namespace {

class DonePending : public PendingCollective {
 public:
  explicit DonePending(absl::Status s) : status_(std::move(s)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

absl::Status CheckShapes(const at::Tensor& part, const at::Tensor& full, int world) {
  if (!part.is_contiguous() || !full.is_contiguous() || part.dim() != 1 || full.dim() != 1 ||
      full.numel() != part.numel() * world || part.scalar_type() != full.scalar_type()) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective: expected contiguous 1-d part [p] and full [", world,
                     "*p] of one dtype, got ", part.numel(), " and ", full.numel()));
  }
  return absl::OkStatus();
}

absl::Status CheckCoalesced(const std::vector<at::Tensor>& fulls,
                            const std::vector<at::Tensor>& parts, int world) {
  if (fulls.size() != parts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("collective: ", fulls.size(), " inputs but ",
                                                   parts.size(), " outputs"));
  }
  for (size_t k = 0; k < fulls.size(); ++k) {
    if (absl::Status s = CheckShapes(parts[k], fulls[k], world); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckAllToAll(const at::Tensor& input, const at::Tensor& output, int world) {
  if (!input.is_contiguous() || !output.is_contiguous() || input.dim() != 1 ||
      output.dim() != 1 || input.numel() != output.numel() || input.numel() % world != 0 ||
      input.scalar_type() != output.scalar_type()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all-to-all: expected contiguous 1-d input and output [", world,
        "*c] of one dtype, got ", input.numel(), " and ", output.numel()));
  }
  if (input.numel() > 0 && input.data_ptr() == output.data_ptr()) {
    return absl::InvalidArgumentError("all-to-all: output must not alias input");
  }
  return absl::OkStatus();
}

absl::Status CheckSubgroup(const std::vector<int>& ranks, absl::string_view name, int world) {
  if (name.empty() || absl::StrContains(name, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("subgroup name: \"", name, "\" must be non-empty without '/'"));
  }
  if (ranks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("subgroup ", name, ": ranks is empty"));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "subgroup ", name, ": ranks[", i, "] = ", ranks[i],
          " (ranks must be strictly increasing, in [0, world size ", world, "))"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<PendingCollective> Done(absl::Status s) {
  return std::make_unique<DonePending>(std::move(s));
}

}  // namespace loom::engine::collectives_internal
