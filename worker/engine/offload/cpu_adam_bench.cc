// Micro-benchmark (not a test): CpuAdam vs LibTorch's op-by-op Adam update over n fp32 elements.
//   bazel run -c opt //worker/engine/offload:cpu_adam_bench -- [n] [threads] [reps]
// Prints GB/s counting 28 bytes per element (read p, g, m, v; write p, m, v).
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "worker/engine/offload/cpu_adam.h"

using loom::engine::offload::CpuAdam;
using loom::engine::offload::CpuAdamOptions;

namespace {

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16 * 1024 * 1024;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 10;
  at::set_num_threads(threads);
  at::Tensor p = at::randn({n}) * 0.02, g = at::randn({n}) * 0.01, m = at::zeros({n}),
             v = at::zeros({n});
  const double bytes = 28.0 * n * reps;
  CpuAdamOptions o;
  o.weight_decay = 0.01;
  o.threads = threads;
  CpuAdam adam(o);
  for (CpuAdam::Isa isa : {CpuAdam::Isa::kScalar, CpuAdam::Isa::kAvx2, CpuAdam::Isa::kAvx512}) {
    if (!adam.ForceIsa(isa)) continue;
    adam.Step(1, 1e-3, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
              v.data_ptr<float>(), n);  // warm-up
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      adam.Step(r + 2, 1e-3, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                v.data_ptr<float>(), n);
    }
    const double s = Seconds(t0);
    std::printf("cpu_adam %-7s n=%lld threads=%d: %.3f ms/step, %.2f GB/s\n",
                CpuAdam::IsaName(isa).c_str(), static_cast<long long>(n), threads,
                1e3 * s / reps, bytes / s / 1e9);
  }
  // LibTorch op by op (the engine's non-offloaded AdamStep).
  auto torch_step = [&](int64_t t) {
    const double lr = 1e-3, bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
    p.mul_(1.0 - lr * 0.01);
    m.mul_(0.9).add_(g, 0.1);
    v.mul_(0.999).addcmul_(g, g, 0.001);
    at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(1e-8);
    p.addcdiv_(m, denom, -lr / bc1);
  };
  torch_step(1);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) torch_step(r + 2);
  const double s = Seconds(t0);
  std::printf("libtorch op-by-op   n=%lld threads=%d: %.3f ms/step, %.2f GB/s\n",
              static_cast<long long>(n), threads, 1e3 * s / reps, bytes / s / 1e9);
  return 0;
}
