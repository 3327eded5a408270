// SuperOffloadPipeline (speculative CPU Adam per sub-group, validated after backward, exact
// rollback and clip-and-replay) against an independent reference: AdamW written here in double-
// precision LibTorch ops from the formulas (Loshchilov & Hutter; torch.optim.AdamW), and, where
// bits must match, the same pipeline or the synchronous ZeRO-Offload pipeline on the same data.
// The acceptance cases of issue 15 (docs/design/TECHNIQUES-TESTS.md §5 items 8-11).
#include "worker/engine/optim/super_offload_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/collectives.h"
#include "worker/engine/loss_scaler.h"
#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/grad_norm.h"
#include "worker/engine/optim/offload_pipeline.h"
#include "worker/engine/optim/step_validation.h"

namespace loom::engine::optim {
namespace {

using ::loom::testing::StatusIs;

// 1389 elements: no sub-group size used below divides it or the partitions.
const std::vector<int64_t> kNumels = {5, 300, 17, 64, 1000, 3};

struct Model {
  std::vector<OptimizerPartition> parts;
};

Model MakeModel(uint64_t seed) {
  at::manual_seed(seed);
  Model m;
  for (int64_t n : kNumels) {
    OptimizerPartition p;
    p.param = at::randn({n}, at::kFloat) * 0.02;
    p.grad = at::zeros({n}, at::kFloat);
    p.exp_avg = at::zeros({n}, at::kFloat);
    p.exp_avg_sq = at::zeros({n}, at::kFloat);
    m.parts.push_back(p);
  }
  return m;
}

Model Clone(const Model& m) {
  Model c;
  for (const OptimizerPartition& p : m.parts) {
    c.parts.push_back({p.param.clone(), p.grad.clone(), p.exp_avg.clone(), p.exp_avg_sq.clone()});
  }
  return c;
}

// The gradients of step t (scaled by `scale`), the same for every model built from the seed.
void SetGrads(Model& m, int64_t t, double scale) {
  at::manual_seed(1000 + t);
  for (OptimizerPartition& p : m.parts) {
    p.grad.copy_(at::randn({p.param.numel()}, at::kFloat) * (1e-2 * scale));
  }
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * 4) == 0;
}

void ExpectStateBitEqual(const Model& a, const Model& b, const std::string& what) {
  for (size_t i = 0; i < a.parts.size(); ++i) {
    EXPECT_TRUE(BitEqual(a.parts[i].param, b.parts[i].param)) << what << ": param " << i;
    EXPECT_TRUE(BitEqual(a.parts[i].exp_avg, b.parts[i].exp_avg)) << what << ": exp_avg " << i;
    EXPECT_TRUE(BitEqual(a.parts[i].exp_avg_sq, b.parts[i].exp_avg_sq))
        << what << ": exp_avg_sq " << i;
  }
}

SubGroupPlan Plan(int64_t sub_group_size) {
  absl::StatusOr<SubGroupPlan> p = SubGroupPlan::Create(kNumels, sub_group_size);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

PartitionSource SourceOf(Model* m) {
  return [m](size_t i) { return m->parts[i]; };
}

spec::OptimizerConfig AdamW(double wd) {
  spec::OptimizerConfig oc;
  oc.weight_decay = wd;
  oc.decoupled_weight_decay = true;
  return oc;
}

std::unique_ptr<SuperOffloadPipeline> Make(Model* m, double wd, double ratio, int64_t sgs,
                                           double* scale = nullptr) {
  SuperOffloadOptions o;
  o.optimizer = AdamW(wd);
  o.ratio = ratio;
  o.cpu_threads = 2;
  if (scale != nullptr) {
    o.loss_scale = [scale] { return *scale; };
    o.loss_scaled = true;
  }
  absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> p =
      SuperOffloadPipeline::Create(o, Plan(sgs), SourceOf(m));
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// Loom's synchronous ZeRO-Offload pipeline over `model`'s tensors (AdamW, weight decay 0.01,
// CpuAdam on `threads` threads, `sgs` elements per sub-group, 0 = the optimizer's default): the
// non-speculative reference. Its optimizer keeps its own moments, so it is handed none.
struct SyncOffload {
  std::unique_ptr<offload::OffloadOptimizer> optimizer;
  Model view;
  std::unique_ptr<OptimizerPipeline> pipe;
};
std::unique_ptr<SyncOffload> MakeSyncOffload(const Model& model, int threads, int64_t sgs) {
  offload::OffloadOptimizerOptions oo;
  oo.adam.weight_decay = 0.01;
  oo.adam.threads = threads;
  if (sgs > 0) oo.sub_group_size = sgs;
  absl::StatusOr<std::unique_ptr<offload::OffloadOptimizer>> opt =
      offload::OffloadOptimizer::Create(oo, kNumels);
  EXPECT_TRUE(opt.ok()) << opt.status();
  auto s = std::make_unique<SyncOffload>();
  s->optimizer = std::move(*opt);
  s->view = model;  // the same tensors
  for (OptimizerPartition& p : s->view.parts) p.exp_avg = p.exp_avg_sq = at::Tensor();
  s->pipe = MakeOffloadPipeline(s->optimizer.get(), SourceOf(&s->view));
  return s;
}

// Raises the sub-groups in `order` (all of them when empty: reverse order, as backward does).
absl::Status RaiseSubGroups(OptimizerPipeline& pipe, std::vector<int64_t> order = {}) {
  if (order.empty()) {
    for (int64_t k = pipe.plan().num_sub_groups() - 1; k >= 0; --k) order.push_back(k);
  }
  for (int64_t k : order) {
    if (absl::Status s = pipe.OnSubGroupReady(k); !s.ok()) return s;
  }
  return absl::OkStatus();
}

StepValidation NoClip(double scale = 1.0) {
  StepValidation v;
  v.grad_multiplier = scale == 1.0 ? 1.0 : 1.0 / scale;
  return v;
}

// One committed step t of `pipe` on step t's gradients.
void CommitStep(OptimizerPipeline& pipe, Model& m, int64_t t, double lr) {
  SetGrads(m, t, 1.0);
  ASSERT_TRUE(pipe.BeginStep(t, lr).ok());
  ASSERT_TRUE(RaiseSubGroups(pipe).ok());
  ASSERT_TRUE(pipe.FinishStep(NoClip()).ok());
}

// AdamW in double precision from the formulas (torch.optim.AdamW, single tensor).
struct Reference {
  std::vector<at::Tensor> p, m, v;
  explicit Reference(const Model& model) {
    for (const OptimizerPartition& q : model.parts) {
      p.push_back(q.param.to(at::kDouble));
      m.push_back(at::zeros_like(p.back()));
      v.push_back(at::zeros_like(p.back()));
    }
  }
  void Step(const Model& grads, int64_t t, double lr, double wd, double multiplier) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (size_t i = 0; i < p.size(); ++i) {
      at::Tensor g = grads.parts[i].grad.to(at::kDouble) * multiplier;
      p[i] = p[i] * (1 - lr * wd);
      m[i] = m[i] * b1 + g * (1 - b1);
      v[i] = v[i] * b2 + g * g * (1 - b2);
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      p[i] = p[i] - (lr / bc1) * m[i] / (v[i].sqrt() / std::sqrt(bc2) + eps);
    }
  }
  void ExpectNear(const Model& model, const std::string& what, bool moments = true) const {
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_TRUE(at::allclose(model.parts[i].param.to(at::kDouble), p[i], 1e-5, 1e-7))
          << what << ": param " << i << " max diff "
          << (model.parts[i].param.to(at::kDouble) - p[i]).abs().max().item<double>();
      if (!moments) continue;
      EXPECT_TRUE(at::allclose(model.parts[i].exp_avg.to(at::kDouble), m[i], 1e-5, 1e-9))
          << what << ": exp_avg " << i;
      EXPECT_TRUE(at::allclose(model.parts[i].exp_avg_sq.to(at::kDouble), v[i], 1e-5, 1e-12))
          << what << ": exp_avg_sq " << i;
    }
  }
};

// Acceptance 1: a rolled-back step leaves params, moments and the step count as before, bit for
// bit, after t - 1 = 0, 1 and 4 committed steps, with and without weight decay, for sub-group
// sizes that divide neither the 1389 elements nor the partitions. "Step count": step t is then
// taken again and equals a run that never saw the rolled-back step.
TEST(SuperOffloadPipelineTest, RollbackRestoresParamsMomentsAndStepCountBitForBit) {
  for (double wd : {0.0, 0.01}) {
    for (int64_t sgs : {7, 250, 333}) {
      for (int64_t t : {1, 2, 5}) {
        const std::string what =
            "wd " + std::to_string(wd) + " sgs " + std::to_string(sgs) + " t " + std::to_string(t);
        Model m = MakeModel(7);
        Model ref = Clone(m);
        auto pipe = Make(&m, wd, /*ratio=*/1.0, sgs);
        auto ref_pipe = Make(&ref, wd, 1.0, sgs);
        for (int64_t s = 1; s < t; ++s) {
          CommitStep(*pipe, m, s, 1e-3);
          CommitStep(*ref_pipe, ref, s, 1e-3);
        }
        const Model before = Clone(m);
        // Speculate step t on gradients that differ from the replayed ones, then roll back.
        SetGrads(m, 100 + t, 1.0);
        ASSERT_TRUE(pipe->BeginStep(t, 1e-3).ok());
        ASSERT_TRUE(RaiseSubGroups(*pipe).ok());
        StepValidation overflow;
        overflow.overflow = true;
        ASSERT_TRUE(pipe->FinishStep(overflow).ok());
        ExpectStateBitEqual(m, before, what + " after rollback");
        EXPECT_EQ(pipe->stats().rollbacks_overflow, pipe->plan().num_sub_groups()) << what;
        // The step count did not advance: step t again equals the run without the rollback.
        CommitStep(*pipe, m, t, 1e-3);
        CommitStep(*ref_pipe, ref, t, 1e-3);
        ExpectStateBitEqual(m, ref, what + " after the retaken step");
      }
    }
  }
}

// Acceptance 2: fp16 with loss scale 1024 and an inf in one CPU sub-group's gradient. Every
// sub-group (CPU and device) keeps its params and moments, the step is skipped, and the scale
// is halved (hysteresis 1). DeepSpeed's closed-form inverse zeroes weights here
// (docs/design/TECHNIQUES-TESTS.md §2.2.4).
TEST(SuperOffloadPipelineTest, InjectedInfInOneSubGroupSkipsTheStepAndHalvesTheScale) {
  spec::Fp16Config fc;
  fc.enabled = true;
  fc.initial_scale_power = 10;
  fc.hysteresis = 1;
  LossScaler scaler(fc);
  double scale = scaler.scale();
  ASSERT_EQ(scale, 1024.0);
  Model m = MakeModel(3);
  auto pipe = Make(&m, 0.01, /*ratio=*/0.5, /*sgs=*/250, &scale);
  // Runs of at most 250 elements: {5} {300} {17 64} {1000} {3}; CPU: the last three.
  ASSERT_EQ(pipe->plan().num_sub_groups(), 5);
  ASSERT_EQ(pipe->first_cpu_sub_group(), 2);
  // Two committed fp16 steps first, so the moments are non-zero.
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  auto step = [&](int64_t t, bool inject) -> StepValidation {
    SetGrads(m, t, scale);
    if (inject) m.parts[4].grad[10].fill_(std::numeric_limits<float>::infinity());  // sub-group 3
    EXPECT_TRUE(pipe->BeginStep(t, 1e-3).ok());
    EXPECT_TRUE(RaiseSubGroups(*pipe).ok());
    ValidationInputs in;
    in.check_overflow = true;
    in.loss_scale = scale;
    auto nonfinite = [&] {
      for (const OptimizerPartition& p : m.parts) {
        if (!at::isfinite(p.grad).all().item<bool>()) return true;
      }
      return false;
    };
    auto sq = [&] {
      double s = 0;
      for (const OptimizerPartition& p : m.parts) s += p.grad.to(at::kDouble).pow(2).sum().item<double>();
      return s;
    };
    absl::StatusOr<StepValidation> v = ValidateStep(*coll, in, nonfinite, sq);
    EXPECT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(pipe->FinishStep(*v).ok());
    scaler.Update(v->overflow);
    scale = scaler.scale();
    return *v;
  };
  Reference ref(m);
  Model grads = Clone(m);  // the reference's gradients (the pipeline unscales m's in place)
  for (int64_t t : {1, 2}) {
    ASSERT_FALSE(step(t, false).overflow);
    SetGrads(grads, t, 1024);
    ref.Step(grads, t, 1e-3, 0.01, 1.0 / 1024);
  }
  // The speculative steps used the unscaled gradient (DeepSpeed's used the scaled one).
  ref.ExpectNear(m, "fp16 steps 1-2");
  const Model before = Clone(m);
  ASSERT_EQ(scale, 1024.0);
  ASSERT_TRUE(step(3, true).overflow);
  ExpectStateBitEqual(m, before, "after the overflowed step");
  for (const OptimizerPartition& p : m.parts) {
    EXPECT_TRUE(at::isfinite(p.param).all().item<bool>());
    EXPECT_TRUE(at::isfinite(p.exp_avg_sq).all().item<bool>());
  }
  EXPECT_EQ(scale, 512.0);
  const SuperOffloadStats st = pipe->stats();
  EXPECT_EQ(st.not_speculated_nonfinite, 1);  // sub-group 3 never stepped
  EXPECT_EQ(st.rollbacks_overflow, 2);        // sub-groups 2 and 4 were, and are restored
  EXPECT_EQ(st.hits, 6);                      // steps 1 and 2, three CPU sub-groups each
}

// Acceptance 3: clipping active (clip_coef > 1). Speculate-then-replay equals the non-
// speculative clipped step (the reference, within fp32 tolerance; the synchronous ZeRO-Offload
// pipeline, bit for bit), whatever order the sub-groups completed in.
TEST(SuperOffloadPipelineTest, ClipReplayEqualsClippedStepInAnyCompletionOrder) {
  const int64_t sgs = 120;
  Model base = MakeModel(11);
  const int64_t n_groups = Plan(sgs).num_sub_groups();
  std::vector<std::vector<int64_t>> orders;
  std::vector<int64_t> fwd(n_groups);
  for (int64_t k = 0; k < n_groups; ++k) fwd[k] = k;
  orders.push_back(fwd);
  orders.push_back(std::vector<int64_t>(fwd.rbegin(), fwd.rend()));
  std::mt19937 rng(5);
  for (int i = 0; i < 3; ++i) {
    std::shuffle(fwd.begin(), fwd.end(), rng);
    orders.push_back(fwd);
  }
  // Synchronous ZeRO-Offload on the same data: the non-speculative clipped step.
  Model sync = Clone(base);
  std::unique_ptr<SyncOffload> sync_off = MakeSyncOffload(sync, 2, sgs);
  OptimizerPipeline* sync_pipe = sync_off->pipe.get();
  Reference ref(base);
  StepValidation clip;
  clip.clip_coef = 3.5;
  clip.grad_multiplier = 1.0 / 3.5;
  for (int64_t t = 1; t <= 3; ++t) {
    SetGrads(sync, t, 1.0);
    ref.Step(sync, t, 1e-3, 0.01, 1.0 / 3.5);
    ASSERT_TRUE(sync_pipe->BeginStep(t, 1e-3).ok());
    ASSERT_TRUE(RaiseSubGroups(*sync_pipe).ok());
    ASSERT_TRUE(sync_pipe->FinishStep(clip).ok());
  }
  ref.ExpectNear(sync, "synchronous offload vs reference", /*moments=*/false);
  for (size_t o = 0; o < orders.size(); ++o) {
    Model m = Clone(base);
    auto pipe = Make(&m, 0.01, /*ratio=*/1.0, sgs);
    for (int64_t t = 1; t <= 3; ++t) {
      SetGrads(m, t, 1.0);
      ASSERT_TRUE(pipe->BeginStep(t, 1e-3).ok());
      ASSERT_TRUE(RaiseSubGroups(*pipe, orders[o]).ok());
      ASSERT_TRUE(pipe->FinishStep(clip).ok());
    }
    const std::string what = "completion order " + std::to_string(o);
    for (size_t i = 0; i < m.parts.size(); ++i) {
      EXPECT_TRUE(BitEqual(m.parts[i].param, sync.parts[i].param)) << what << ": param " << i;
    }
    // The moments: the reference's (the offload optimizer keeps its own copy).
    ref.ExpectNear(m, what);
    const SuperOffloadStats st = pipe->stats();
    EXPECT_EQ(st.rollbacks_clip, 3 * n_groups) << what;
    EXPECT_EQ(st.replays, 3 * n_groups) << what;
    EXPECT_EQ(st.hits, 0) << what;
    EXPECT_EQ(st.step_rollbacks, 3) << what;
  }
}

// Adaptive speculation: a step is speculated only after a step whose clipping was inactive (the
// first step always is). Clip pattern over 6 steps: off, on, on, off, on, off -> speculated at
// steps 1, 2 and 5 (after steps -, 1 and 4 ran unclipped), paused at 3, 4 and 6; rolled back at
// 2 and 5 (speculated, then clipped). The state equals the synchronous ZeRO-Offload pipeline
// bit for bit at every step.
TEST(SuperOffloadPipelineTest, AdaptiveSpeculationFollowsTheLastStepsClipping) {
  const int64_t sgs = 120;
  const int64_t n_groups = Plan(sgs).num_sub_groups();
  Model base = MakeModel(21);
  Model m = Clone(base), sync = Clone(base);
  SuperOffloadOptions o;
  o.optimizer = AdamW(0.01);
  o.cpu_threads = 2;
  o.adaptive_speculation = true;
  auto pipe = SuperOffloadPipeline::Create(o, Plan(sgs), SourceOf(&m));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  std::unique_ptr<SyncOffload> sync_off = MakeSyncOffload(sync, 2, sgs);
  OptimizerPipeline* sync_pipe = sync_off->pipe.get();
  const bool clipped[6] = {false, true, true, false, true, false};
  const bool speculated[6] = {true, true, false, false, true, false};
  int64_t want_spec = 0, want_paused = 0, want_rolled = 0;
  for (int64_t t = 1; t <= 6; ++t) {
    StepValidation v;
    if (clipped[t - 1]) {
      v.clip_coef = 2.5;
      v.grad_multiplier = 1.0 / 2.5;
    }
    for (Model* model : {&m, &sync}) SetGrads(*model, t, 1.0);
    ASSERT_TRUE(sync_pipe->BeginStep(t, 1e-3).ok());
    ASSERT_TRUE(RaiseSubGroups(*sync_pipe).ok());
    ASSERT_TRUE(sync_pipe->FinishStep(v).ok());
    ASSERT_TRUE((*pipe)->BeginStep(t, 1e-3).ok());
    ASSERT_TRUE(RaiseSubGroups(**pipe).ok());
    ASSERT_TRUE((*pipe)->FinishStep(v).ok());
    (speculated[t - 1] ? want_spec : want_paused) += n_groups;
    if (speculated[t - 1] && clipped[t - 1]) want_rolled += n_groups;
    const SuperOffloadStats st = (*pipe)->stats();
    const std::string what = "step " + std::to_string(t);
    EXPECT_EQ(st.speculated, want_spec) << what;
    EXPECT_EQ(st.not_speculated_paused, want_paused) << what;
    EXPECT_EQ(st.rollbacks_clip, want_rolled) << what;
    for (size_t i = 0; i < m.parts.size(); ++i) {
      EXPECT_TRUE(BitEqual(m.parts[i].param, sync.parts[i].param)) << what << ": param " << i;
    }
  }
}

// No overflow, clipping off: ratio 0 (all in-memory Adam), 0.5 and 1 (all speculative CPU Adam)
// follow the reference within fp32 tolerance over 5 steps with a changing learning rate, and
// ratio 1 equals the synchronous ZeRO-Offload pipeline bit for bit.
TEST(SuperOffloadPipelineTest, RatioSplitFollowsTheReferenceAndEqualsZeroOffload) {
  const int64_t sgs = 250;
  Model base = MakeModel(21);
  Model sync = Clone(base);
  std::unique_ptr<SyncOffload> sync_off = MakeSyncOffload(sync, offload::CpuAdamOptions().threads, sgs);
  OptimizerPipeline* sync_pipe = sync_off->pipe.get();
  Reference ref(base);
  auto lr = [](int64_t t) { return 1e-3 * t / 5.0; };  // a warm-up: both sides follow it
  for (int64_t t = 1; t <= 5; ++t) {
    SetGrads(sync, t, 1.0);
    ref.Step(sync, t, lr(t), 0.01, 1.0);
    ASSERT_TRUE(sync_pipe->BeginStep(t, lr(t)).ok());
    ASSERT_TRUE(RaiseSubGroups(*sync_pipe).ok());
    ASSERT_TRUE(sync_pipe->FinishStep(NoClip()).ok());
  }
  for (double ratio : {0.0, 0.5, 1.0}) {
    Model m = Clone(base);
    auto pipe = Make(&m, 0.01, ratio, sgs);
    for (int64_t t = 1; t <= 5; ++t) CommitStep(*pipe, m, t, lr(t));
    ref.ExpectNear(m, "ratio " + std::to_string(ratio));
    const int64_t n_cpu = pipe->plan().num_sub_groups() - pipe->first_cpu_sub_group();
    EXPECT_EQ(pipe->stats().hits, 5 * n_cpu);
    EXPECT_EQ(pipe->stats().speculated, 5 * n_cpu);
    EXPECT_EQ(pipe->stats().hit_rate(), 1.0);
    if (ratio == 1.0) {
      for (size_t i = 0; i < m.parts.size(); ++i) {
        EXPECT_TRUE(BitEqual(m.parts[i].param, sync.parts[i].param)) << "param " << i;
      }
    }
  }
}

// The thread in FinishStep runs what is still queued. The speculation thread is held inside its
// first task until FinishStep's thread has run every other one (no sleeps: a condition on the
// count), so all but one sub-group step on the FinishStep thread's own CpuAdam. The result must
// be the synchronous ZeRO-Offload step bit for bit, and the squared norms the tasks published
// must be each gradient's, bit for bit as the trainer would compute them itself
// (SumOfSquares) and within fp64 rounding of a double-precision reference; their sum in
// parameter order is LocalSquaredNorm's value exactly.
TEST(SuperOffloadPipelineTest, FinishStepRunsQueuedStepsAndTasksPublishTheGradientNorms) {
  const int64_t sgs = 1;  // one sub-group per partition: 6
  Model base = MakeModel(31);
  Model sync = Clone(base);
  std::unique_ptr<SyncOffload> sync_off = MakeSyncOffload(sync, 1, sgs);
  Model m = Clone(base);

  std::mutex mu;
  std::condition_variable cv;
  int in_finish = 0, on_worker = 0;
  int64_t n_groups = 0;
  SuperOffloadOptions o;
  o.optimizer = AdamW(0.01);
  o.ratio = 1.0;
  o.cpu_threads = 2;
  o.wait_deadline = std::chrono::seconds(60);
  o.test_on_task = [&](int64_t, bool in_finish_step) {
    std::unique_lock<std::mutex> l(mu);
    if (in_finish_step) {
      ++in_finish;
      cv.notify_all();
      return;
    }
    ++on_worker;
    // The speculation thread's task waits until the others ran on FinishStep's thread. The
    // bound only turns a regression (FinishStep not running queued steps) into a failure
    // instead of a hang: FinishStep's wait_deadline below is longer, so it then fails.
    cv.wait_for(l, std::chrono::seconds(20), [&] { return in_finish + on_worker >= n_groups; });
  };
  absl::StatusOr<std::unique_ptr<SuperOffloadPipeline>> made =
      SuperOffloadPipeline::Create(o, Plan(sgs), SourceOf(&m));
  ASSERT_TRUE(made.ok()) << made.status();
  SuperOffloadPipeline& pipe = **made;
  n_groups = pipe.plan().num_sub_groups();
  ASSERT_EQ(n_groups, 6);

  for (int64_t t = 1; t <= 3; ++t) {
    {
      std::lock_guard<std::mutex> l(mu);
      in_finish = on_worker = 0;
    }
    SetGrads(sync, t, 1.0);
    ASSERT_TRUE(sync_off->pipe->BeginStep(t, 1e-3).ok());
    ASSERT_TRUE(RaiseSubGroups(*sync_off->pipe).ok());
    ASSERT_TRUE(sync_off->pipe->FinishStep(NoClip()).ok());

    SetGrads(m, t, 1.0);
    ASSERT_TRUE(pipe.BeginStep(t, 1e-3).ok());
    double sq = 0;
    EXPECT_FALSE(pipe.ComputedSquaredNorm(0, &sq)) << "step " << t << ": before any task ran";
    ASSERT_TRUE(RaiseSubGroups(pipe).ok());
    // The gradients are final and untouched by the step: keep them to check the norms.
    std::vector<at::Tensor> grads;
    for (const OptimizerPartition& p : m.parts) grads.push_back(p.grad.clone());
    ASSERT_TRUE(pipe.FinishStep(NoClip()).ok());
    {
      std::lock_guard<std::mutex> l(mu);
      EXPECT_GE(in_finish, n_groups - 1) << "step " << t;
      EXPECT_EQ(in_finish + on_worker, n_groups) << "step " << t;
    }
    double total = 0;
    for (size_t i = 0; i < m.parts.size(); ++i) {
      double part = -1;
      ASSERT_TRUE(pipe.ComputedSquaredNorm(i, &part)) << "step " << t << " param " << i;
      const double own = SumOfSquares(grads[i].data_ptr<float>(), grads[i].numel());
      EXPECT_EQ(std::memcmp(&part, &own, sizeof(double)), 0) << "step " << t << " param " << i;
      const double ref = grads[i].to(at::kDouble).pow(2).sum().item<double>();
      EXPECT_NEAR(part, ref, 1e-12 * ref) << "step " << t << " param " << i;
      total += part;
    }
    const double local = LocalSquaredNorm(grads);
    EXPECT_EQ(std::memcmp(&total, &local, sizeof(double)), 0) << "step " << t;
    for (size_t i = 0; i < m.parts.size(); ++i) {  // the offload optimizer owns its moments
      EXPECT_TRUE(BitEqual(m.parts[i].param, sync.parts[i].param)) << "step " << t << " param "
                                                                    << i;
    }
  }
  EXPECT_EQ(pipe.stats().hits, 3 * n_groups);
  EXPECT_FALSE(pipe.ComputedSquaredNorm(m.parts.size(), nullptr));  // out of range
}

TEST(SuperOffloadPipelineTest, CopyBytesAndSplit) {
  Model m = MakeModel(1);
  auto pipe = Make(&m, 0.0, 0.5, 250);
  // Runs of at most 250 elements: {5} {300} {17 64} {1000} {3}.
  ASSERT_EQ(pipe->plan().num_sub_groups(), 5);
  EXPECT_EQ(pipe->first_cpu_sub_group(), 2);  // floor(0.5 * 5)
  EXPECT_EQ(pipe->copy_bytes(), 3 * 4 * (17 + 64 + 1000 + 3));
  double scale = 8;
  auto scaled = Make(&m, 0.0, 0.5, 250, &scale);
  EXPECT_EQ(scaled->copy_bytes(), 4 * 4 * (17 + 64 + 1000 + 3));
  SuperOffloadOptions o;
  o.ratio = 1.5;
  EXPECT_THAT(SuperOffloadPipeline::Create(o, Plan(250), SourceOf(&m)),
              StatusIs(absl::StatusCode::kInvalidArgument, "offload_optimizer.ratio"));
}

}  // namespace
}  // namespace loom::engine::optim

namespace loom::engine::optim {
namespace {

// Without clipping or loss scaling no step can be rolled back: exact_rollback false keeps no
// snapshot (copy_bytes 0), the speculative steps still equal the synchronous ZeRO-Offload steps
// bit for bit, and a clip coefficient > 1 or an overflow that would need a snapshot is refused
// with FAILED_PRECONDITION instead of leaving a speculative step applied.
TEST(SuperOffloadPipelineTest, NoSnapshotWhenNoRollbackCanHappen) {
  Model m = MakeModel(11);
  Model sync = Clone(m);
  SuperOffloadOptions o;
  o.optimizer = AdamW(0.01);
  o.ratio = 1.0;
  o.cpu_threads = 2;
  o.exact_rollback = false;
  auto pipe = *SuperOffloadPipeline::Create(o, Plan(250), SourceOf(&m));
  EXPECT_EQ(pipe->copy_bytes(), 0);
  std::unique_ptr<SyncOffload> sync_off = MakeSyncOffload(sync, 2, 0);
  OptimizerPipeline* sync_pipe = sync_off->pipe.get();
  for (int64_t t = 1; t <= 3; ++t) {
    CommitStep(*pipe, m, t, 1e-3);
    CommitStep(*sync_pipe, sync, t, 1e-3);
  }
  for (size_t i = 0; i < m.parts.size(); ++i) {
    EXPECT_TRUE(BitEqual(m.parts[i].param, sync.parts[i].param)) << "param " << i;
  }
  EXPECT_EQ(pipe->stats().hits, pipe->stats().speculated);
  SetGrads(m, 4, 1.0);
  ASSERT_TRUE(pipe->BeginStep(4, 1e-3).ok());
  ASSERT_TRUE(RaiseSubGroups(*pipe).ok());
  StepValidation clip;
  clip.clip_coef = 2.0;
  clip.grad_multiplier = 0.5;
  EXPECT_THAT(pipe->FinishStep(clip),
              StatusIs(absl::StatusCode::kFailedPrecondition, "without rollback snapshots"));
  SetGrads(m, 5, 1.0);
  ASSERT_TRUE(pipe->BeginStep(5, 1e-3).ok());
  ASSERT_TRUE(RaiseSubGroups(*pipe).ok());
  StepValidation overflow;
  overflow.overflow = true;
  EXPECT_THAT(pipe->FinishStep(overflow),
              StatusIs(absl::StatusCode::kFailedPrecondition, "without rollback snapshots"));
}

}  // namespace
}  // namespace loom::engine::optim
