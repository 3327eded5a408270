#include "scheduler/device_binding.h"

#include "absl/strings/str_cat.h"

namespace loom {

absl::StatusOr<std::vector<int32_t>> BindDevices(
    const std::vector<std::string>& placement,
    const std::map<std::string, std::vector<int32_t>>& devices,
    const std::map<std::string, std::set<int32_t>>& held) {
  std::vector<int32_t> bound(placement.size(), -1);
  std::map<std::string, std::set<int32_t>> taken = held;
  for (size_t r = 0; r < placement.size(); ++r) {
    auto d = devices.find(placement[r]);
    if (d == devices.end() || d->second.empty()) continue;
    std::set<int32_t>& used = taken[placement[r]];
    for (int32_t index : d->second) {  // in index order
      if (used.insert(index).second) {
        bound[r] = index;
        break;
      }
    }
    if (bound[r] < 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "node ", placement[r], ": no free device for rank ", r, " (", d->second.size(),
          " devices, ", used.size(), " held)"));
    }
  }
  return bound;
}

std::pair<int32_t, int32_t> LocalRank(const std::vector<std::string>& placement, int32_t rank) {
  int32_t local = 0, count = 0;
  for (size_t r = 0; r < placement.size(); ++r) {
    if (placement[r] != placement[rank]) continue;
    if (static_cast<int32_t>(r) < rank) ++local;
    ++count;
  }
  return {local, count};
}

}  // namespace loom
