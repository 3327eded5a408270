// Percentiles of benchmark samples (latencies in any unit), shared by the control-plane load
// generator (services/scheduler/control_plane_loadgen.cc) and the scheduler benchmark
// (scheduler/scheduler_bench.cc) so their p50/p99 figures mean the same thing.
//
// Percentile(v, p) is an element of `v` (no interpolation): the one at index
// min(n - 1, floor(p * n)) of the sorted samples, n = v.size(); p in [0, 1] (p = 0.5 of an even
// count is the upper median; p = 0.99 of 200 samples is the 199th smallest). 0 for no samples.
// Pure; takes `v` by value (sorts its copy); thread-safe.
#ifndef LOOM_COMMON_PERCENTILE_H_
#define LOOM_COMMON_PERCENTILE_H_

#include <vector>

namespace loom {

double Percentile(std::vector<double> v, double p);

}  // namespace loom

#endif  // LOOM_COMMON_PERCENTILE_H_
