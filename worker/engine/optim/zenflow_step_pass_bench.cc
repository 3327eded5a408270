// Micro-benchmark (not a test): ZenFlow's per-step work on a CPU rank against the CpuAdam step of
// synchronous ZeRO-Offload, over the 2-D weights of bench/zenflow_bench.py's shape B (4 Llama
// layers, hidden 512, intermediate 1376: 28 matrices, 12.4M elements, row-major W[out, in]).
//   bazel run //worker/engine/optim:zenflow_step_pass_bench -- [topk ...]
// Per topk_ratio (default 0.05 0.1 0.2): the median of 7 repetitions of
//   adam:       CpuAdam::Step over every element (what offload's training thread does);
//   selective:  ZenFlowStepPass::Run with accumulate = false (the training thread's part with
//               overlap_step: AdamW of the selected columns, random columns of each W);
//   accumulate: ZenFlowStepPass::AccumulateAll (the host thread's per-step part);
//   both fused: Run with accumulate = true (the training thread's pass without overlap_step).
// The selected columns of a row-major W touch 1 - (1 - topk)^16 of its 64-byte lines, so the
// selective pass costs far more than topk of the Adam step (docs/benchmarks.md, ZenFlow).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "worker/engine/offload/cpu_adam.h"
#include "worker/engine/optim/zenflow_step_pass.h"

namespace {

using loom::engine::offload::CpuAdam;
using loom::engine::offload::CpuAdamOptions;
using loom::engine::optim::ZenFlowCohortArgs;
using loom::engine::optim::ZenFlowPassArgs;
using loom::engine::optim::ZenFlowStepPass;

struct Matrix {
  int64_t rows, cols;
  std::vector<float> w, g, m, v, acc;
  std::vector<int64_t> selected;     // local element indices of the selected columns
  std::vector<float> sel_m, sel_v;   // [selected]
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double TimeMs(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> topks;
  for (int i = 1; i < argc; ++i) topks.push_back(std::atof(argv[i]));
  if (topks.empty()) topks = {0.05, 0.1, 0.2};
  const int64_t h = 512, f = 1376;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int l = 0; l < 4; ++l) {
    for (int q = 0; q < 4; ++q) shapes.push_back({h, h});  // q, k, v, o
    shapes.push_back({f, h});                              // gate
    shapes.push_back({f, h});                              // up
    shapes.push_back({h, f});                              // down
  }
  std::vector<Matrix> ms;
  int64_t total = 0;
  for (auto [r, c] : shapes) {
    Matrix m{r, c};
    m.w.assign(r * c, 0.01f);
    m.g.assign(r * c, 1e-3f);
    m.m.assign(r * c, 0.0f);
    m.v.assign(r * c, 0.0f);
    m.acc.assign(r * c, 0.0f);
    total += r * c;
    ms.push_back(std::move(m));
  }
  CpuAdamOptions o;
  o.threads = 1;
  o.weight_decay = 0.01;
  CpuAdam adam(o);
  ZenFlowStepPass pass(o, 1);
  std::mt19937 rng(1);
  std::printf("%lld elements in %zu matrices, 1 thread\n", static_cast<long long>(total),
              ms.size());
  for (double topk : topks) {
    for (Matrix& m : ms) {
      std::vector<int64_t> cols(m.cols);
      for (int64_t j = 0; j < m.cols; ++j) cols[j] = j;
      std::shuffle(cols.begin(), cols.end(), rng);
      cols.resize(std::max<int64_t>(1, static_cast<int64_t>(topk * m.cols)));
      std::sort(cols.begin(), cols.end());
      m.selected.clear();
      for (int64_t r = 0; r < m.rows; ++r) {
        for (int64_t j : cols) m.selected.push_back(r * m.cols + j);
      }
      m.sel_m.assign(m.selected.size(), 0.0f);
      m.sel_v.assign(m.selected.size(), 0.0f);
    }
    std::vector<double> t_adam, t_sel, t_acc, t_fused;
    for (int rep = 0; rep < 7; ++rep) {
      t_adam.push_back(TimeMs([&] {
        for (Matrix& m : ms) {
          adam.Step(rep + 1, 1e-3, m.w.data(), m.g.data(), m.m.data(), m.v.data(), m.rows * m.cols);
        }
      }));
      // The selective pass over every matrix, with (fused) or without the accumulation.
      auto selective = [&](bool accumulate) {
        for (Matrix& m : ms) {
          ZenFlowPassArgs a;
          a.grad = m.g.data();
          a.acc = m.acc.data();
          a.n = m.rows * m.cols;
          const ZenFlowCohortArgs cohort{m.selected.data(),
                                         static_cast<int64_t>(m.selected.size()),
                                         m.sel_m.data(), m.sel_v.data(), rep + 1, rep + 1};
          a.cohorts = &cohort;
          a.num_cohorts = 1;
          a.master = m.w.data();
          a.lr = 1e-3;
          a.accumulate = accumulate;
          pass.Run(a);
        }
      };
      t_sel.push_back(TimeMs([&] { selective(false); }));
      t_acc.push_back(TimeMs([&] {
        for (Matrix& m : ms) {
          ZenFlowPassArgs a;
          a.grad = m.g.data();
          a.acc = m.acc.data();
          a.n = m.rows * m.cols;
          a.first = rep == 0;
          ZenFlowStepPass::AccumulateAll(a);
        }
      }));
      t_fused.push_back(TimeMs([&] { selective(true); }));  // the gradient read once
    }
    const double ad = Median(t_adam), se = Median(t_sel), ac = Median(t_acc);
    const double fu = Median(t_fused);
    std::printf("topk %.2f: adam %.2f ms, selective %.2f ms (%.2f of adam), accumulate %.2f ms "
                "(%.2f of adam), both fused %.2f ms (%.2f of adam)\n",
                topk, ad, se, se / ad, ac, ac / ad, fu, fu / ad);
  }
  return 0;
}
