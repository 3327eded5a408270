#include "worker/engine/optim/zenflow_step_pass.h"

#include <algorithm>
#include <vector>

namespace loom::engine::optim {
namespace {

// How many selected elements ahead the gather prefetches. The selected columns of a row-major W
// are an irregular ascending pattern (~1.6 elements per 64-byte line at topk 0.1) that the
// hardware prefetchers follow poorly: zenflow_step_pass_bench's selective pass read 0.60-0.72
// of a full CpuAdam step without the prefetch and 0.48-0.65 with it (topk 0.05-0.1).
constexpr int64_t kPrefetch = 128;

// The accumulation of one block [0, m). Four loops so that each one vectorises (-O3).
void Accumulate(const float* __restrict grad, float mult, float* __restrict acc, int64_t m,
                bool first, float scale) {
  if (grad == nullptr) {
    if (first) {
      std::fill(acc, acc + m, 0.0f);
    } else if (scale != 1.0f) {
      for (int64_t e = 0; e < m; ++e) acc[e] = acc[e] * scale;
    }
    return;
  }
  if (first) {
    if (scale != 1.0f) {
      for (int64_t e = 0; e < m; ++e) acc[e] = (0.0f + grad[e] * mult) * scale;
    } else {
      for (int64_t e = 0; e < m; ++e) acc[e] = 0.0f + grad[e] * mult;
    }
  } else if (scale != 1.0f) {
    for (int64_t e = 0; e < m; ++e) acc[e] = (acc[e] + grad[e] * mult) * scale;
  } else {
    for (int64_t e = 0; e < m; ++e) acc[e] = acc[e] + grad[e] * mult;
  }
}

}  // namespace

ZenFlowStepPass::ZenFlowStepPass(const offload::CpuAdamOptions& adam, int threads)
    : pool_(std::max(1, threads)) {
  offload::CpuAdamOptions one = adam;
  one.threads = 1;
  for (int q = 0; q < pool_.threads(); ++q) {
    adam_.push_back(std::make_unique<offload::CpuAdam>(one));
    w_.emplace_back(kBlock);
    g_.emplace_back(kBlock);
  }
}

void ZenFlowStepPass::AccumulateAll(const ZenFlowPassArgs& a) {
  if (a.n > 0) Accumulate(a.grad, a.grad_multiplier, a.acc, a.n, a.first, a.mean_scale);
}

void ZenFlowStepPass::Run(const ZenFlowPassArgs& a) {
  if (a.n <= 0) return;
  const int64_t blocks = (a.n + kBlock - 1) / kBlock;
  const int64_t tasks = std::min<int64_t>(pool_.threads(), blocks);
  const int nc = std::max(0, a.num_cohorts);
  pool_.ParallelFor(tasks, 1, [&](int64_t tb, int64_t te) {
    std::vector<const int64_t*> cursor(nc);  // per cohort: its next element at or past the block
    for (int64_t task = tb; task < te; ++task) {
      const int64_t b0 = blocks * task / tasks, b1 = blocks * (task + 1) / tasks;
      float* w = w_[task].data();
      float* g = g_[task].data();
      offload::CpuAdam& adam = *adam_[task];
      for (int c = 0; c < nc; ++c) {
        const ZenFlowCohortArgs& h = a.cohorts[c];
        cursor[c] = std::lower_bound(h.selected, h.selected + h.k, b0 * kBlock);
      }
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t e0 = blk * kBlock, e1 = std::min(a.n, e0 + kBlock);
        if (a.accumulate) {
          Accumulate(a.grad != nullptr ? a.grad + e0 : nullptr, a.grad_multiplier, a.acc + e0,
                     e1 - e0, a.first, a.mean_scale);
        }
        for (int c = 0; c < nc; ++c) {
          const ZenFlowCohortArgs& h = a.cohorts[c];
          const int64_t* sel_end = h.selected + h.k;
          const int64_t* s = cursor[c];
          const int64_t q0 = s - h.selected;
          int64_t m = 0;
          for (; s != sel_end && *s < e1; ++s, ++m) {
            if (sel_end - s > kPrefetch) {
              __builtin_prefetch(a.master + s[kPrefetch], 1);
              if (a.grad != nullptr) __builtin_prefetch(a.grad + s[kPrefetch], 0);
            }
            w[m] = a.master[*s];
            g[m] = a.grad != nullptr ? a.grad[*s] * a.grad_multiplier : 0.0f;
          }
          cursor[c] = s;
          if (m == 0) continue;
          adam.StepWithMomentCounts(h.t_exp_avg, h.t_exp_avg_sq, a.lr, w, g, h.exp_avg + q0,
                                    h.exp_avg_sq + q0, m);
          const int64_t* idx = h.selected + q0;
          for (int64_t e = 0; e < m; ++e) a.master[idx[e]] = w[e];
        }
      }
    }
  });
}

}  // namespace loom::engine::optim
