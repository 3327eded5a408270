// Test driver for tests/python/zenflow_adamw_test.py: runs ZenFlowPipeline with every column
// selected (topk_ratio 1, select once, CPU updates every 3 steps that must never reach the
// masters) on parameters and per-step gradients read from a file, and writes the final
// parameters. The Python side compares them with Debian's torch.optim.AdamW.
//
// Usage: zenflow_adamw_tool IN OUT LR WEIGHT_DECAY
//   IN:  int64 P (parameters), then per parameter int64 rows, int64 cols (0: 1-D of rows),
//        int64 steps S, then every parameter's fp32 initial values, then for each step every
//        parameter's fp32 gradient. OUT: every parameter's fp32 final values.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>

#include "worker/engine/optim/zenflow_pipeline.h"
#include "worker/engine/testing/thread_gang.h"

using namespace loom::engine;  // NOLINT: a tool

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: zenflow_adamw_tool IN OUT LR WEIGHT_DECAY\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  auto get = [&](int64_t* v) { return static_cast<bool>(in.read(reinterpret_cast<char*>(v), 8)); };
  int64_t np = 0, steps = 0;
  if (!get(&np) || np <= 0 || np > 64) {
    std::cerr << argv[1] << ": bad parameter count\n";
    return 1;
  }
  std::vector<optim::ZenFlowParam> params(np);
  std::vector<int64_t> numels;
  for (auto& p : params) {
    if (!get(&p.rows) || !get(&p.cols)) return 1;
    p.end = p.cols > 0 ? p.rows * p.cols : p.rows;
    numels.push_back(p.end);
  }
  if (!get(&steps) || steps <= 0) return 1;
  std::vector<OptimizerPartition> parts;
  for (int64_t n : numels) {
    OptimizerPartition p{at::empty({n}), at::zeros({n}), at::zeros({n}), at::zeros({n})};
    in.read(static_cast<char*>(p.param.data_ptr()), 4 * n);
    parts.push_back(p);
  }
  optim::ZenFlowOptions zo;
  zo.adam.weight_decay = std::atof(argv[4]);
  zo.topk_ratio = 1.0;
  zo.schedule = {0, 0, 3};
  const double lr = std::atof(argv[3]);
  absl::Status result;
  auto st = testing::RunGang(1, [&](int, Collectives& coll) -> absl::Status {
    absl::StatusOr<optim::SubGroupPlan> plan = optim::SubGroupPlan::Create(numels, 1 << 30);
    if (!plan.ok()) return plan.status();
    auto pipe = optim::ZenFlowPipeline::Create(zo, *plan, params,
                                               [&](size_t i) { return parts[i]; }, &coll);
    if (!pipe.ok()) return pipe.status();
    for (int64_t t = 1; t <= steps; ++t) {
      for (auto& p : parts) in.read(static_cast<char*>(p.grad.data_ptr()), 4 * p.grad.numel());
      if (!in) return absl::InvalidArgumentError("IN: truncated gradients");
      if (auto s = (*pipe)->BeginStep(t, lr); !s.ok()) return s;
      for (int64_t k = 0; k < (*pipe)->plan().num_sub_groups(); ++k) {
        if (auto s = (*pipe)->OnSubGroupReady(k); !s.ok()) return s;
      }
      if (auto s = (*pipe)->FinishStep({}); !s.ok()) return s;
      if (auto s = (*pipe)->ReleaseGradients(); !s.ok()) return s;  // before the next read
    }
    (*pipe)->Quiesce();
    return absl::OkStatus();
  });
  absl::Status s = testing::FirstFailure(st);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary);
  for (auto& p : parts) out.write(static_cast<const char*>(p.param.data_ptr()), 4 * p.param.numel());
  return out ? 0 : 1;
}
