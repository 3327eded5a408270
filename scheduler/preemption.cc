#include "scheduler/preemption.h"

#include <algorithm>
#include <numeric>

namespace loom {

int64_t LostWork(int64_t step, int64_t checkpoint_step, int world_size) {
  return std::max<int64_t>(0, step - checkpoint_step) * std::max(1, world_size);
}

std::vector<size_t> ChooseVictims(const std::vector<VictimCandidate>& candidates, int pool_size,
                                  const std::function<bool(const std::vector<int>&)>& feasible) {
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const VictimCandidate& x = candidates[a];
    const VictimCandidate& y = candidates[b];
    if (x.lost_work != y.lost_work) return x.lost_work < y.lost_work;
    if (x.priority != y.priority) return x.priority < y.priority;
    return x.sequence > y.sequence;  // newest first
  });
  std::vector<int> extra(pool_size, 0);
  auto apply = [&](size_t c, int sign) {
    for (const auto& [node, slots] : candidates[c].slots) extra[node] += sign * slots;
  };
  std::vector<size_t> chosen;
  bool ok = false;
  for (size_t c : order) {
    chosen.push_back(c);
    apply(c, +1);
    if (feasible(extra)) {
      ok = true;
      break;
    }
  }
  if (!ok) return {};
  // Drop victims that are not needed, last added first.
  for (size_t k = chosen.size(); k-- > 0;) {
    apply(chosen[k], -1);
    if (feasible(extra)) {
      chosen.erase(chosen.begin() + static_cast<long>(k));
    } else {
      apply(chosen[k], +1);
    }
  }
  return chosen;
}

}  // namespace loom
