#include "worker/engine/optim/super_offload_setup.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/offload/cpu_adam.h"

namespace loom::engine::optim {
namespace {

// Median seconds of one CpuAdam step over n elements (5 runs after a warm-up).
double TimeStep(offload::CpuAdam& adam, int64_t n) {
  std::vector<float> p(n, 0.01f), g(n, 1e-3f), m(n, 0.f), v(n, 0.f);
  adam.Step(1, 1e-3, p.data(), g.data(), m.data(), v.data(), n);
  std::vector<double> s;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    adam.Step(r + 2, 1e-3, p.data(), g.data(), m.data(), v.data(), n);
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[2];
}

}  // namespace

SuperOffloadChoice ModelSubGroupSize(int threads, int64_t partition_elems) {
  SuperOffloadChoice c;
  c.cpu_threads = std::max(1, threads);
  offload::CpuAdamOptions o;
  o.threads = c.cpu_threads;
  offload::CpuAdam adam(o);
  const int64_t n1 = 1 << 12, n2 = 1 << 18;
  const double t1 = TimeStep(adam, n1), t2 = TimeStep(adam, n2);
  const double b = t2 > t1 ? (n2 - n1) / (t2 - t1) : n2 / std::max(t2, 1e-9);
  const double a = std::max(0.0, t1 - n1 / b);
  c.latency_s = a;
  c.elements_per_s = b;
  int64_t n = static_cast<int64_t>(std::ceil(19.0 * a * b));
  n = std::min<int64_t>(n, (partition_elems + 7) / 8);
  c.sub_group_size = std::max<int64_t>(n, 4096);
  c.sub_group_size_modelled = true;
  return c;
}

SuperOffloadChoice ChooseSuperOffload(const spec::DeepSpeedConfig& ds, int threads_per_rank,
                                      int64_t partition_elems) {
  const spec::OffloadConfig& oo = ds.zero.offload_optimizer;
  const int threads = std::max(
      1, static_cast<int>(std::lround(oo.cpuadam_cores_perc * std::max(1, threads_per_rank))));
  if (!ds.zero.sub_group_size_set) return ModelSubGroupSize(threads, partition_elems);
  SuperOffloadChoice c;
  c.sub_group_size = ds.zero.sub_group_size;
  c.cpu_threads = threads;
  return c;
}

absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> MakeSuperOffloadPipelineForJob(
    const spec::DeepSpeedConfig& ds, int threads_per_rank, const std::vector<int64_t>& numels,
    PartitionSource source, std::function<double()> loss_scale,
    offload::OffloadOptimizer* nvme_state, SuperOffloadChoice* choice) {
  const spec::OffloadConfig& oo = ds.zero.offload_optimizer;
  if ((oo.device == "nvme") != (nvme_state != nullptr)) {
    return absl::InternalError(absl::StrCat(
        "SuperOffload: offload_optimizer.device is \"", oo.device, "\" but the offload "
        "optimizer ", nvme_state != nullptr ? "was" : "was not", " given"));
  }
  if (nvme_state == nullptr) {
    int64_t total = 0;
    for (int64_t n : numels) total += n;
    *choice = ChooseSuperOffload(ds, threads_per_rank, total);
  }
  ASSIGN_OR_RETURN(SubGroupPlan plan,
                   nvme_state != nullptr
                       ? absl::StatusOr<SubGroupPlan>(nvme_state->plan())
                       : SubGroupPlan::Create(numels, choice->sub_group_size));
  SuperOffloadOptions o;
  o.optimizer = ds.optimizer;
  o.ratio = oo.ratio;
  o.cpu_threads = choice->cpu_threads;
  o.loss_scale = std::move(loss_scale);
  o.loss_scaled = ds.fp16.enabled;
  // Only clipping and an fp16 overflow roll a speculative step back; without both, no snapshot.
  o.exact_rollback = ds.gradient_clipping > 0 || ds.fp16.enabled;
  o.adaptive_speculation = !oo.speculate_always;
  o.nvme = nvme_state;
  return SuperOffloadPipeline::Create(o, std::move(plan), std::move(source));
}

}  // namespace loom::engine::optim
