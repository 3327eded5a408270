#include "worker/engine/optim/grad_norm.h"

#include <ATen/ATen.h>

namespace loom::engine::optim {

double SumOfSquares(const float* g, int64_t n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double x = g[j + l];
      acc[l] += x * x;
    }
  }
  for (int l = 0; j < n; ++j, ++l) {
    const double x = g[j];
    acc[l] += x * x;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double LocalSquaredNorm(const std::vector<at::Tensor>& grads) {
  double sq = 0;
  for (const at::Tensor& t : grads) {
    if (!t.defined() || t.numel() == 0) continue;
    const at::Tensor g =
        t.scalar_type() == at::kFloat ? t.contiguous() : t.to(at::kFloat).contiguous();
    sq += SumOfSquares(g.data_ptr<float>(), g.numel());
  }
  return sq;
}

}  // namespace loom::engine::optim
