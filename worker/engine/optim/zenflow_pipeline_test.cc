// ZenFlowPipeline against independent references: torch::optim::AdamW (LibTorch's own optimizer)
// with every column selected; the ZeRO-Offload pipeline (OffloadOptimizer) in the two limits
// where ZenFlow must equal it bit for bit; a plain LibTorch-ops AdamW for the CPU updates of the
// unselected columns (sum of the interval's gradients, applied at the boundary, or one interval
// later with overlap); checkpoint state round trip; Zen-auto on a least-squares problem; and two
// Gloo ranks (thread gang) against one rank.
#include "worker/engine/optim/zenflow_pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/offload_pipeline.h"
#include "worker/engine/partition.h"
#include "worker/engine/testing/thread_gang.h"

namespace loom::engine::optim {
namespace {

constexpr double kLr = 1e-3, kWd = 0.01;

struct Shape {
  int64_t rows, cols;  // cols 0: 1-D of `rows` elements
  int64_t numel() const { return cols > 0 ? rows * cols : rows; }
};
const std::vector<Shape> kShapes = {{4, 6}, {10, 0}, {3, 8}};

struct Model {
  std::vector<OptimizerPartition> parts;
  std::vector<ZenFlowParam> params;
};

// World size `world`, rank `rank`: partitions of the same seeded full tensors.
// Rank threads of a gang call these at once, so each draws from its own generator (the global
// one, seeded per call, raced between the threads and made TwoRanksEqualOneRank flaky).
Model MakeModel(int world = 1, int rank = 0) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Model m;
  for (const Shape& s : kShapes) {
    at::Tensor full = at::randn({s.numel()}, gen, at::kFloat) * 0.1;
    PartitionSlice sl = ComputePartition(s.numel(), world, rank);
    OptimizerPartition p;
    p.param = at::zeros({sl.partition_numel}, at::kFloat);
    p.param.narrow(0, 0, sl.valid()).copy_(full.narrow(0, sl.begin, sl.valid()));
    p.grad = at::zeros_like(p.param);
    p.exp_avg = at::zeros_like(p.param);
    p.exp_avg_sq = at::zeros_like(p.param);
    m.parts.push_back(p);
    m.params.push_back({s.rows, s.cols, sl.begin, sl.end});
  }
  return m;
}

// The reduced gradient of step t (1-based), full tensors, the same on every rank.
std::vector<at::Tensor> FullGrads(int64_t t) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + t);
  std::vector<at::Tensor> g;
  for (const Shape& s : kShapes) g.push_back(at::randn({s.numel()}, gen, at::kFloat) * 0.01);
  return g;
}

void SetGrads(Model& m, int64_t t, int world = 1, int rank = 0) {
  std::vector<at::Tensor> g = FullGrads(t);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    PartitionSlice sl = ComputePartition(kShapes[i].numel(), world, rank);
    m.parts[i].grad.zero_();
    m.parts[i].grad.narrow(0, 0, sl.valid()).copy_(g[i].narrow(0, sl.begin, sl.valid()));
  }
}

SubGroupPlan PlanOf(const Model& m) {
  std::vector<int64_t> numels;
  for (const OptimizerPartition& p : m.parts) numels.push_back(p.param.numel());
  return *SubGroupPlan::Create(numels, 1 << 20);
}

ZenFlowOptions Options(double topk, int64_t warm_up, int64_t select_interval, int64_t update,
                       bool overlap) {
  ZenFlowOptions o;
  o.adam.weight_decay = kWd;
  o.adam.threads = 2;
  o.topk_ratio = topk;
  o.schedule = {warm_up, select_interval, update};
  o.overlap_step = overlap;
  return o;
}

absl::Status Step(OptimizerPipeline& pipe, int64_t t, double multiplier = 1.0) {
  if (absl::Status s = pipe.BeginStep(t, kLr); !s.ok()) return s;
  for (int64_t k = 0; k < pipe.plan().num_sub_groups(); ++k) {
    if (absl::Status s = pipe.OnSubGroupReady(k); !s.ok()) return s;
  }
  StepValidation v;
  v.grad_multiplier = multiplier;
  if (absl::Status s = pipe.FinishStep(v); !s.ok()) return s;
  // The callers write the next step's gradients next: as the trainer does before its backward.
  return pipe.ReleaseGradients();
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), 4 * a.numel()) == 0;
}

// Runs `body` with a real single-rank Gloo group.
void WithRank(const std::function<void(Collectives&)>& body) {
  auto st = testing::RunGang(1, [&](int, Collectives& c) {
    body(c);
    return absl::OkStatus();
  });
  ASSERT_TRUE(testing::FirstFailure(st).ok()) << testing::FirstFailure(st);
}

TEST(ZenFlowPipelineTest, AllColumnsSelectedEqualsTorchAdamW) {
  WithRank([](Collectives& coll) {
    Model m = MakeModel();
    std::vector<torch::Tensor> ref;
    for (const OptimizerPartition& p : m.parts) ref.push_back(p.param.clone().requires_grad_());
    torch::optim::AdamW torch_opt(ref, torch::optim::AdamWOptions(kLr).weight_decay(kWd));
    // topk 1, select once, CPU updates every 3 steps: CPU results must never reach the masters.
    auto pipe = *ZenFlowPipeline::Create(Options(1.0, 0, 0, 3, false), PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    for (int64_t t = 1; t <= 10; ++t) {
      SetGrads(m, t);
      for (size_t i = 0; i < ref.size(); ++i) ref[i].mutable_grad() = m.parts[i].grad.clone();
      ASSERT_TRUE(Step(*pipe, t).ok());
      torch_opt.step();
    }
    EXPECT_EQ(pipe->metrics().cpu_updates, 3);  // steps 3, 6, 9 ran and were discarded
    for (size_t i = 0; i < ref.size(); ++i) {
      const double diff = (m.parts[i].param - ref[i].detach()).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6) << "param " << i;
    }
  });
}

// ZeRO-Offload: the OffloadOptimizer pipeline on a copy of the model.
struct Offload {
  Model m;
  std::unique_ptr<offload::OffloadOptimizer> opt;
  std::unique_ptr<OptimizerPipeline> pipe;
};
std::unique_ptr<Offload> MakeOffload() {
  auto o = std::make_unique<Offload>();
  o->m = MakeModel();
  offload::OffloadOptimizerOptions oo;
  oo.adam.weight_decay = kWd;
  oo.adam.threads = 2;
  std::vector<int64_t> numels;
  for (const OptimizerPartition& p : o->m.parts) numels.push_back(p.param.numel());
  o->opt = *offload::OffloadOptimizer::Create(oo, numels);
  Offload* raw = o.get();
  o->pipe = MakeOffloadPipeline(o->opt.get(), [raw](size_t i) { return raw->m.parts[i]; });
  return o;
}

void ExpectEqualsOffload(const ZenFlowOptions& zo, int64_t steps) {
  WithRank([&](Collectives& coll) {
    Model m = MakeModel();
    auto pipe = *ZenFlowPipeline::Create(zo, PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    std::unique_ptr<Offload> off = MakeOffload();
    for (int64_t t = 1; t <= steps; ++t) {
      SetGrads(m, t);
      SetGrads(off->m, t);
      const double mult = t % 2 == 0 ? 0.5 : 1.0;  // clipping on some steps
      ASSERT_TRUE(Step(*pipe, t, mult).ok());
      ASSERT_TRUE(Step(*off->pipe, t, mult).ok());
    }
    for (size_t i = 0; i < m.parts.size(); ++i) {
      EXPECT_TRUE(BitEqual(m.parts[i].param, off->m.parts[i].param)) << "param " << i;
    }
  });
}

TEST(ZenFlowPipelineTest, WarmUpCoveringEveryStepIsZeroOffloadBitForBit) {
  ExpectEqualsOffload(Options(0.5, 8, 2, 2, true), 8);
}

TEST(ZenFlowPipelineTest, TopKZeroUpdateEveryStepNoOverlapIsZeroOffloadBitForBit) {
  ExpectEqualsOffload(Options(0.0, 0, 1, 1, false), 8);
  ExpectEqualsOffload(Options(0.0, 3, 1, 1, false), 8);  // warm-up, then ZenFlow
}

// Plain-ops AdamW step t on p (decoupled decay), moments updated in place.
at::Tensor AdamW(at::Tensor p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, int64_t t) {
  p = p * (1 - kLr * kWd);
  m = m * 0.9 + g * 0.1;
  v = v * 0.999 + g * g * 0.001;
  const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
  return p - (kLr / bc1) * m / (v.sqrt() / std::sqrt(bc2) + 1e-8);
}

// Elements of partition i (world 1) in the columns not selected.
at::Tensor UnselectedMask(const ZenFlowPipeline& pipe, size_t i) {
  const Shape& s = kShapes[i];
  at::Tensor mask = at::ones({s.rows, s.cols}, at::kBool);
  for (int64_t j : pipe.selection()[i]) mask.select(1, j).fill_(false);
  return mask.reshape({-1});
}

void ExpectClose(const at::Tensor& a, const at::Tensor& b, const char* what) {
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-6) << what;
}

TEST(ZenFlowPipelineTest, AccumulationSumsTheIntervalAndCarriesNothing) {
  WithRank([](Collectives& coll) {
    Model m = MakeModel();
    const at::Tensor w0 = m.parts[0].param.clone();
    auto pipe = *ZenFlowPipeline::Create(Options(0.34, 0, 0, 3, false), PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    at::Tensor sum = at::zeros_like(w0);
    for (int64_t t = 1; t <= 2; ++t) {
      SetGrads(m, t);
      sum = sum + m.parts[0].grad;
      ASSERT_TRUE(Step(*pipe, t).ok());
      EXPECT_TRUE(BitEqual(pipe->accumulator(0), sum)) << "step " << t;
      EXPECT_EQ(pipe->accumulated_steps(), t);
    }
    ASSERT_EQ(pipe->selection()[0].size(), 2u);  // floor(0.34 * 6)
    const at::Tensor un = UnselectedMask(*pipe, 0);
    // Unselected columns untouched between boundaries.
    EXPECT_TRUE(BitEqual(m.parts[0].param.masked_select(un), w0.masked_select(un)));
    SetGrads(m, 3);
    sum = sum + m.parts[0].grad;
    ASSERT_TRUE(Step(*pipe, 3).ok());
    // Boundary 3: nothing carried into the next interval.
    EXPECT_EQ(pipe->accumulated_steps(), 0);
    EXPECT_EQ(pipe->accumulator(0).abs().sum().item<double>(), 0.0);
    // The unselected columns took one CPU AdamW step (t = 3) on the interval's mean gradient.
    at::Tensor mo = at::zeros_like(w0), vo = at::zeros_like(w0);
    at::Tensor want = AdamW(w0, sum / 3.0, mo, vo, 3);
    ExpectClose(m.parts[0].param.masked_select(un), want.masked_select(un), "after boundary");
  });
}

// Adam is scale-invariant only up to eps: with eps comparable to the gradients, the CPU step
// must see the interval's mean (sum / steps), not the sum (the explicit loss normalisation).
TEST(ZenFlowPipelineTest, CpuStepSeesTheIntervalMeanNotTheSum) {
  WithRank([](Collectives& coll) {
    Model m = MakeModel();
    const at::Tensor w0 = m.parts[0].param.clone();
    ZenFlowOptions zo = Options(0.34, 0, 0, 3, false);
    zo.adam.eps = 1e-2;
    auto pipe = *ZenFlowPipeline::Create(zo, PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    at::Tensor sum = at::zeros_like(w0);
    for (int64_t t = 1; t <= 3; ++t) {
      SetGrads(m, t);
      sum = sum + m.parts[0].grad;
      ASSERT_TRUE(Step(*pipe, t).ok());
    }
    const at::Tensor un = UnselectedMask(*pipe, 0);
    const at::Tensor g = sum / 3.0;
    at::Tensor p = w0 * (1 - kLr * kWd);
    const at::Tensor mo = g * 0.1, vo = g * g * 0.001;
    const double bc1 = 1 - std::pow(0.9, 3), bc2 = 1 - std::pow(0.999, 3);
    const at::Tensor want = p - (kLr / bc1) * mo / (vo.sqrt() / std::sqrt(bc2) + 1e-2);
    ExpectClose(m.parts[0].param.masked_select(un), want.masked_select(un), "mean gradient");
  });
}

TEST(ZenFlowPipelineTest, WithOverlapIntervalKLandsAtBoundaryKPlusOne) {
  WithRank([](Collectives& coll) {
    Model m = MakeModel();
    const at::Tensor w0 = m.parts[2].param.clone();
    auto pipe = *ZenFlowPipeline::Create(Options(0.25, 0, 0, 2, true), PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    at::Tensor sum1 = at::zeros_like(w0), sum2 = at::zeros_like(w0);
    for (int64_t t = 1; t <= 4; ++t) {
      SetGrads(m, t);
      (t <= 2 ? sum1 : sum2).add_(m.parts[2].grad);
      ASSERT_TRUE(Step(*pipe, t).ok());
      const at::Tensor un = UnselectedMask(*pipe, 2);
      if (t <= 3) {  // interval 1's CPU step runs in the background until boundary 4
        EXPECT_TRUE(BitEqual(m.parts[2].param.masked_select(un), w0.masked_select(un)))
            << "step " << t;
      }
      if (t == 2) {
        EXPECT_TRUE(pipe->cpu_step_in_flight());
      }
    }
    const at::Tensor un = UnselectedMask(*pipe, 2);
    at::Tensor mo = at::zeros_like(w0), vo = at::zeros_like(w0);
    at::Tensor want = AdamW(w0, sum1 / 2.0, mo, vo, 2);  // interval 1 only, at step 4
    ExpectClose(m.parts[2].param.masked_select(un), want.masked_select(un), "boundary 2");
    pipe->Quiesce();
  });
}

TEST(ZenFlowPipelineTest, SelectedColumnsAreNeverOverwrittenByCpuValues) {
  WithRank([](Collectives& coll) {
    Model m = MakeModel();
    const at::Tensor w0 = m.parts[0].param.clone();
    auto pipe = *ZenFlowPipeline::Create(Options(0.5, 0, 0, 1, true), PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    at::Tensor mo = at::zeros_like(w0), vo = at::zeros_like(w0), w = w0.clone();
    for (int64_t t = 1; t <= 6; ++t) {
      SetGrads(m, t);
      w = AdamW(w, m.parts[0].grad, mo, vo, t);  // the device update of the selected columns
      ASSERT_TRUE(Step(*pipe, t).ok());
    }
    const at::Tensor sel = UnselectedMask(*pipe, 0).logical_not();
    ExpectClose(m.parts[0].param.masked_select(sel), w.masked_select(sel), "selected");
    pipe->Quiesce();
  });
}

// Re-selection: a column that stays selected keeps its moments and step count; a newly
// selected one starts with a zero first moment and the CPU optimizer's second moment, each
// bias-corrected by its own update count (the reference: plain-ops AdamW per column, the CPU
// step's result as the new column's starting value and second moment).
TEST(ZenFlowPipelineTest, ReselectionKeepsAStayingColumnsMomentsAndStartsANewOnesVFromTheCpu) {
  WithRank([](Collectives& coll) {
    Model m = MakeModel();
    const at::Tensor w0 = m.parts[0].param.clone().reshape({4, 6});
    // topk 0.34 of 6 columns: 2; select at steps 1 and 3, CPU step at 2 and 4, no overlap.
    auto pipe = *ZenFlowPipeline::Create(Options(0.34, 0, 2, 2, false), PlanOf(m), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    std::vector<at::Tensor> g;
    for (int64_t t = 1; t <= 4; ++t) {
      SetGrads(m, t);
      at::Tensor gt = m.parts[0].grad.reshape({4, 6});
      // Columns {0, 1} dominate steps 1-2 and {1, 2} steps 3-4.
      for (int64_t j : t <= 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 2}) {
        gt.select(1, j).mul_(100);
      }
      g.push_back(gt.clone());
      ASSERT_TRUE(Step(*pipe, t).ok());
      EXPECT_THAT(pipe->selection()[0],
                  ::testing::ElementsAreArray(t <= 2 ? std::vector<int64_t>{0, 1}
                                                     : std::vector<int64_t>{1, 2}))
          << "step " << t;
    }
    EXPECT_EQ(pipe->selective_steps(0, 0), 0);
    EXPECT_EQ(pipe->selective_steps(0, 1), 4);
    EXPECT_EQ(pipe->selective_steps(0, 2), 2);
    const at::Tensor w = m.parts[0].param.reshape({4, 6});
    // Column 1: one AdamW run over the four steps.
    at::Tensor p1 = w0.select(1, 1), m1 = at::zeros({4}), v1 = at::zeros({4});
    for (int64_t t = 1; t <= 4; ++t) p1 = AdamW(p1, g[t - 1].select(1, 1), m1, v1, t);
    ExpectClose(w.select(1, 1), p1, "staying column");
    // Column 2: the CPU step at 2 (t = 2, the mean of steps 1-2), then AdamW on steps 3-4 with
    // m from zero (t = 1, 2) and v continuing the CPU's (one update before: t = 2, 3).
    at::Tensor mc = at::zeros({4}), vc = at::zeros({4});
    at::Tensor p2 = AdamW(w0.select(1, 2), (g[0] + g[1]).select(1, 2) / 2.0, mc, vc, 2);
    at::Tensor m2 = at::zeros({4});
    for (int64_t t = 3; t <= 4; ++t) {
      const at::Tensor gt = g[t - 1].select(1, 2);
      p2 = p2 * (1 - kLr * kWd);
      m2 = m2 * 0.9 + gt * 0.1;
      vc = vc * 0.999 + gt * gt * 0.001;
      const double bc1 = 1 - std::pow(0.9, t - 2), bc2 = 1 - std::pow(0.999, t - 1);
      p2 = p2 - (kLr / bc1) * m2 / (vc.sqrt() / std::sqrt(bc2) + 1e-8);
    }
    ExpectClose(w.select(1, 2), p2, "new column");
    // The saved cohorts round-trip, and a bad cohort number is rejected.
    auto state = pipe->ExportState();
    ASSERT_TRUE(pipe->ImportState(state).ok());
    EXPECT_EQ(pipe->selective_steps(0, 1), 4);
    EXPECT_EQ(pipe->selective_steps(0, 2), 2);
    for (auto& [name, t] : state) {
      if (name == "param0.sel_cohort") t.fill_(7);
    }
    absl::Status bad = pipe->ImportState(state);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.message(), ::testing::HasSubstr("param0.sel_cohort"));
    // More cohorts than the pipeline ever keeps (8; a forged file had 16 and was accepted).
    state = pipe->ExportState();
    for (auto& [name, t] : state) {
      if (name == "param0.sel_cohort_t") t = at::ones({2 * 9}, at::kLong);
    }
    bad = pipe->ImportState(state);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.message(), ::testing::HasSubstr("param0.sel_cohort_t: 9 cohorts, at most 8"));
  });
}

// Cohorts past kMaxCohorts (8): a sliding window of 9 important columns out of 20, re-selected
// every step, adds a cohort per step; from step 9 on the two oldest merge at the younger's
// count, so at most 8 counts remain and the merged column's count is the younger one's.
TEST(ZenFlowPipelineTest, MoreThanEightCohortsMergeTheOldestTwoAtTheYoungersCount) {
  WithRank([](Collectives& coll) {
    const int64_t rows = 2, cols = 20;
    OptimizerPartition part;
    part.param = at::zeros({rows * cols}, at::kFloat);
    part.grad = at::zeros_like(part.param);
    part.exp_avg = at::zeros_like(part.param);
    part.exp_avg_sq = at::zeros_like(part.param);
    auto pipe = *ZenFlowPipeline::Create(Options(0.45, 0, 1, 1, false),
                                         *SubGroupPlan::Create({rows * cols}, 1 << 20),
                                         {{rows, cols, 0, rows * cols}},
                                         [&part](size_t) { return part; }, &coll);
    for (int64_t t = 1; t <= 11; ++t) {
      // Step t's window: columns t-1 .. t+7 (floor(0.45 * 20) = 9 selected).
      at::Tensor g = at::full({rows, cols}, 1e-3f);
      g.narrow(1, t - 1, 9).fill_(1.0f);
      part.grad.copy_(g.reshape({-1}));
      ASSERT_TRUE(Step(*pipe, t).ok());
      ASSERT_EQ(pipe->selection()[0].size(), 9u);
      std::set<int64_t> counts;
      for (int64_t j = t - 1; j <= t + 7; ++j) {
        const int64_t age = t - std::max<int64_t>(1, j - 7) + 1;  // without merges
        const int64_t got = pipe->selective_steps(0, j);
        EXPECT_GE(got, 1) << "step " << t << " column " << j;
        EXPECT_LE(got, age) << "step " << t << " column " << j;
        counts.insert(got);
      }
      EXPECT_LE(counts.size(), 8u) << "step " << t;
      EXPECT_EQ(pipe->selective_steps(0, t + 7), 1) << "step " << t;  // the newest column
    }
    // Step 11 merged column 10 (entered at step 3: 8 steps before it) into column 11's cohort
    // (7): after step 11 both read 8, where column 10 alone would read 9.
    EXPECT_EQ(pipe->selective_steps(0, 10), 8);
    EXPECT_EQ(pipe->selective_steps(0, 11), 8);
    EXPECT_EQ(pipe->selective_steps(0, 12), 7);
    EXPECT_EQ(pipe->selective_steps(0, 9), 0);  // left the selection at step 11
    EXPECT_TRUE(part.param.isfinite().all().item<bool>());
  });
}

// Runs steps [from, to] of a ZenFlow job on m.
void RunSteps(ZenFlowPipeline& pipe, Model& m, int64_t from, int64_t to) {
  for (int64_t t = from; t <= to; ++t) {
    SetGrads(m, t);
    ASSERT_TRUE(Step(pipe, t, t % 3 == 0 ? 0.7 : 1.0).ok());
  }
}

TEST(ZenFlowPipelineTest, ResumeFromExportedStateIsBitForBit) {
  for (bool overlap : {false, true}) {
    for (int64_t update : {int64_t{2}, int64_t{0}}) {  // fixed, and Zen-auto
      WithRank([&](Collectives& coll) {
        // Select every 2 steps: the state saved at step 5 holds two cohorts' worth of columns.
        const ZenFlowOptions zo = Options(0.34, 1, 2, update, overlap);
        Model a = MakeModel();
        auto pa = *ZenFlowPipeline::Create(zo, PlanOf(a), a.params,
                                           [&a](size_t i) { return a.parts[i]; }, &coll);
        RunSteps(*pa, a, 1, 9);
        pa->Quiesce();
        Model b = MakeModel();
        auto pb = *ZenFlowPipeline::Create(zo, PlanOf(b), b.params,
                                           [&b](size_t i) { return b.parts[i]; }, &coll);
        RunSteps(*pb, b, 1, 5);
        auto state = pb->ExportState();
        // "Restart": a fresh model and pipeline from the checkpointed tensors.
        Model c = MakeModel();
        for (size_t i = 0; i < c.parts.size(); ++i) {
          c.parts[i].param.copy_(b.parts[i].param);
          c.parts[i].exp_avg.copy_(b.parts[i].exp_avg);
          c.parts[i].exp_avg_sq.copy_(b.parts[i].exp_avg_sq);
        }
        pb.reset();
        auto pc = *ZenFlowPipeline::Create(zo, PlanOf(c), c.params,
                                           [&c](size_t i) { return c.parts[i]; }, &coll);
        ASSERT_TRUE(pc->ImportState(state, /*max_steps=*/5).ok());  // saved after step 5
        RunSteps(*pc, c, 6, 9);
        pc->Quiesce();
        for (size_t i = 0; i < a.parts.size(); ++i) {
          EXPECT_TRUE(BitEqual(a.parts[i].param, c.parts[i].param))
              << "overlap " << overlap << " update " << update << " param " << i;
          EXPECT_TRUE(BitEqual(a.parts[i].exp_avg, c.parts[i].exp_avg)) << i;
        }
        state[0].second = at::zeros({3}, at::kFloat);
        EXPECT_FALSE(pc->ImportState(state).ok());
        // A state rejected at its last parameter changes nothing (every check runs before
        // anything is applied): the first parameter's valid new CPU copy and counters are not
        // taken either. Counters out of range are rejected by name.
        const auto before = pc->ExportState();
        auto Copy = [&before] {
          auto s = before;
          for (auto& [name, t] : s) t = t.clone();
          return s;
        };
        auto bad = Copy();
        int last = -1;
        for (size_t q = 0; q < bad.size(); ++q) {
          if (bad[q].first.find(".sel_cohort") != std::string::npos &&
              bad[q].first.find("_t") == std::string::npos && bad[q].second.numel() > 0) {
            last = static_cast<int>(q);
          }
        }
        ASSERT_GT(last, 10) << "the last selection must not be the first parameter's";
        bad[last].second.fill_(99);
        bad[0].second[4] += 1;        // interval_steps
        bad[2].second.add_(1.0f);     // the first 2-D parameter's CPU copy
        absl::Status rejected = pc->ImportState(bad);
        EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(rejected.message(), ::testing::HasSubstr(".sel_cohort"));
        const auto after = pc->ExportState();
        ASSERT_EQ(after.size(), before.size());
        for (size_t q = 0; q < before.size(); ++q) {
          EXPECT_TRUE(at::equal(after[q].second, before[q].second)) << before[q].first;
        }
        auto counters = Copy();
        counters[0].second[2] = 5;  // the buffer index: 0 or 1
        rejected = pc->ImportState(counters);
        EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(rejected.message(), ::testing::HasSubstr("counters"));
        // A count beyond the checkpoint's step (a forged file with a valid CRC: 2^62 CPU
        // steps) is refused; the same state is taken with no bound.
        auto forged = Copy();
        forged[0].second[5] = int64_t{1} << 62;
        rejected = pc->ImportState(forged, /*max_steps=*/9);
        EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(rejected.message(), ::testing::HasSubstr("step counts in [0, 9]"));
        auto forged_cohort = Copy();
        for (auto& [name, t] : forged_cohort) {
          if (name.find(".sel_cohort_t") != std::string::npos && t.numel() >= 2) {
            t[1] = int64_t{1} << 62;  // the first cohort's v count
            break;
          }
        }
        rejected = pc->ImportState(forged_cohort, /*max_steps=*/9);
        EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(rejected.message(), ::testing::HasSubstr("bad step counts"));
        EXPECT_TRUE(pc->ImportState(before, /*max_steps=*/9).ok());
      });
    }
  }
}

// ReleaseGradients (called before the next backward writes a gradient buffer) waits for exactly
// the host-thread accumulation that reads the buffer about to be written: with one buffer the
// last step's, with two the step's before it, so that step t's accumulation overlaps step t+1's
// backward. Each FinishStep posts one urgent task here (no deferred selective updates), so step
// t's accumulation is ticket t. host_worker_test checks that waiting for ticket n waits for it.
TEST(ZenFlowPipelineTest, ReleaseWaitsForTheAccumulationOfTheBufferItFrees) {
  for (int buffers : {1, 2}) {
    WithRank([&](Collectives& coll) {
      ZenFlowOptions zo = Options(0.34, 0, 2, 2, true);
      zo.gradient_buffers = buffers;
      Model m = MakeModel();
      auto pipe = *ZenFlowPipeline::Create(zo, PlanOf(m), m.params,
                                           [&m](size_t i) { return m.parts[i]; }, &coll);
      for (int64_t t = 1; t <= 6; ++t) {
        SetGrads(m, t);
        ASSERT_TRUE(Step(*pipe, t).ok());  // FinishStep, then ReleaseGradients
        EXPECT_EQ(pipe->last_release_wait(), buffers == 1 ? t : t - 1)
            << buffers << " buffer(s), step " << t;
      }
      pipe->Quiesce();
    });
  }
}

TEST(ZenFlowPipelineTest, ZenAutoTrainsALeastSquaresProblemWithFiniteLoss) {
  WithRank([](Collectives& coll) {
    // W [4, 16] fitting Y = X Wt^T: gradients from LibTorch autograd in the test.
    at::manual_seed(3);
    const at::Tensor x = at::randn({64, 16}), wt = at::randn({4, 16});
    const at::Tensor y = at::matmul(x, wt.t());
    Model m;
    OptimizerPartition p{at::zeros({64}), at::zeros({64}), at::zeros({64}), at::zeros({64})};
    m.parts.push_back(p);
    m.params.push_back({4, 16, 0, 64});
    ZenFlowOptions zo = Options(0.25, 0, 0, 0, true);  // update_interval "auto"
    zo.adam.weight_decay = 0;
    std::vector<int64_t> numels = {64};
    auto pipe = *ZenFlowPipeline::Create(zo, *SubGroupPlan::Create(numels, 1 << 20), m.params,
                                         [&m](size_t i) { return m.parts[i]; }, &coll);
    auto loss_of = [&](bool grad) {
      torch::Tensor w = m.parts[0].param.view({4, 16}).clone().requires_grad_(grad);
      torch::Tensor l = (at::matmul(x, w.t()) - y).pow(2).mean();
      if (grad) {
        l.backward();
        m.parts[0].grad.copy_(w.grad().reshape({-1}));
      }
      return l.item<double>();
    };
    const double l0 = loss_of(false);
    std::set<int64_t> intervals;
    for (int64_t t = 1; t <= 200; ++t) {
      loss_of(true);
      if (absl::Status s = pipe->BeginStep(t, 0.05); !s.ok()) FAIL() << s;
      ASSERT_TRUE(pipe->OnSubGroupReady(0).ok());
      ASSERT_TRUE(pipe->FinishStep({}).ok());
      ASSERT_TRUE(pipe->ReleaseGradients().ok());
      if (pipe->metrics().update_interval > 0) intervals.insert(pipe->metrics().update_interval);
    }
    pipe->Quiesce();
    const double l1 = loss_of(false);
    EXPECT_TRUE(std::isfinite(l1));
    EXPECT_LT(l1, 0.5 * l0) << l0 << " -> " << l1;
    EXPECT_GT(pipe->metrics().cpu_updates, 0);
    EXPECT_FALSE(intervals.empty());
  });
}

TEST(ZenFlowPipelineTest, TwoRanksEqualOneRank) {
  const ZenFlowOptions zo = Options(0.34, 1, 3, 2, true);
  Model one = MakeModel();
  WithRank([&](Collectives& coll) {
    auto p = *ZenFlowPipeline::Create(zo, PlanOf(one), one.params,
                                      [&one](size_t i) { return one.parts[i]; }, &coll);
    RunSteps(*p, one, 1, 7);
    p->Quiesce();
  });
  std::vector<Model> two(2);
  std::vector<std::vector<std::vector<int64_t>>> sel(2);
  auto st = testing::RunGang(2, [&](int rank, Collectives& coll) -> absl::Status {
    two[rank] = MakeModel(2, rank);
    Model& m = two[rank];
    auto p = *ZenFlowPipeline::Create(zo, PlanOf(m), m.params,
                                      [&m](size_t i) { return m.parts[i]; }, &coll);
    for (int64_t t = 1; t <= 7; ++t) {
      SetGrads(m, t, 2, rank);
      if (absl::Status s = Step(*p, t, t % 3 == 0 ? 0.7 : 1.0); !s.ok()) return s;
    }
    p->Quiesce();
    sel[rank] = p->selection();
    return absl::OkStatus();
  });
  ASSERT_TRUE(testing::FirstFailure(st).ok()) << testing::FirstFailure(st);
  EXPECT_EQ(sel[0], sel[1]);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const int64_t n = kShapes[i].numel();
    at::Tensor joined =
        at::cat({two[0].parts[i].param, two[1].parts[i].param}).narrow(0, 0, n);
    EXPECT_TRUE(BitEqual(joined.contiguous(), one.parts[i].param.narrow(0, 0, n).contiguous()))
        << "param " << i;
  }
}

}  // namespace
}  // namespace loom::engine::optim
