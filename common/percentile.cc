#include "common/percentile.h"

#include <algorithm>
#include <cstddef>

namespace loom {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = std::max(0.0, p) * static_cast<double>(v.size());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(at));
  return v[i];
}

}  // namespace loom
