// CpuAdam against (a) its own scalar kernel, bit for bit, for every instruction set, thread
// count and odd size, and (b) LibTorch's op-by-op torch.optim.Adam/AdamW update that the engine
// runs without offload (a few ulp per step; the bound is asserted).
#include "worker/engine/offload/cpu_adam.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::engine::offload {
namespace {

struct State {
  std::vector<float> p, g, m, v;
};

State Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  State s;
  for (int64_t i = 0; i < n; ++i) {
    s.p.push_back(d(gen) * 0.02f);
    s.g.push_back(d(gen) * 1e-2f);
    s.m.push_back(d(gen) * 1e-3f);
    s.v.push_back(std::abs(d(gen)) * 1e-5f);
  }
  return s;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The engine's non-offloaded update (worker/engine/engine.cc AdamStep), op by op; t_sq >= 0:
// exp_avg_sq's bias correction uses t_sq instead of t.
void TorchStep(const CpuAdamOptions& oc, int64_t t, double lr, at::Tensor param, at::Tensor grad,
               at::Tensor exp_avg, at::Tensor exp_avg_sq, int64_t t_sq = -1) {
  const double bc1 = oc.bias_correction ? 1.0 - std::pow(oc.beta1, t) : 1.0;
  const double bc2 =
      oc.bias_correction ? 1.0 - std::pow(oc.beta2, t_sq >= 0 ? t_sq : t) : 1.0;
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  if (oc.weight_decay != 0) {
    if (oc.decoupled_weight_decay) {
      param.mul_(1.0 - lr * oc.weight_decay);
    } else {
      grad = grad.add(param, oc.weight_decay);
    }
  }
  exp_avg.mul_(oc.beta1).add_(grad, 1.0 - oc.beta1);
  exp_avg_sq.mul_(oc.beta2).addcmul_(grad, grad, 1.0 - oc.beta2);
  at::Tensor denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(oc.eps);
  param.addcdiv_(exp_avg, denom, -step_size);
}

at::Tensor T(std::vector<float>& v) {
  return at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kFloat);
}

class CpuAdamTest : public ::testing::TestWithParam<bool> {};  // decoupled weight decay?

TEST_P(CpuAdamTest, AllKernelsAndThreadCountsAreBitIdenticalToScalar) {
  CpuAdamOptions o;
  o.weight_decay = 0.1;
  o.decoupled_weight_decay = GetParam();
  for (int64_t n : {1, 7, 15, 16, 17, 63, 1000, 16 * 1024 + 5, 100003}) {
    const State init = Random(n, static_cast<uint32_t>(n));
    o.threads = 1;
    CpuAdam ref(o);
    ASSERT_TRUE(ref.ForceIsa(CpuAdam::Isa::kScalar));
    State want = init;
    for (int64_t t = 1; t <= 3; ++t) {
      ref.Step(t, 1e-3, want.p.data(), want.g.data(), want.m.data(), want.v.data(), n);
    }
    for (CpuAdam::Isa isa : {CpuAdam::Isa::kScalar, CpuAdam::Isa::kAvx2, CpuAdam::Isa::kAvx512}) {
      if (!CpuAdam::Supported(isa)) continue;
      for (int threads : {1, 2, 3}) {
        o.threads = threads;
        CpuAdam adam(o);
        ASSERT_TRUE(adam.ForceIsa(isa));
        State got = init;
        for (int64_t t = 1; t <= 3; ++t) {
          adam.Step(t, 1e-3, got.p.data(), got.g.data(), got.m.data(), got.v.data(), n);
        }
        EXPECT_TRUE(BitEqual(got.p, want.p)) << CpuAdam::IsaName(isa) << " n=" << n;
        EXPECT_TRUE(BitEqual(got.m, want.m)) << CpuAdam::IsaName(isa) << " n=" << n;
        EXPECT_TRUE(BitEqual(got.v, want.v)) << CpuAdam::IsaName(isa) << " n=" << n;
      }
    }
  }
}

TEST_P(CpuAdamTest, MatchesLibTorchOpByOpUpdate) {
  at::set_num_threads(1);
  CpuAdamOptions o;
  o.weight_decay = 0.05;
  o.decoupled_weight_decay = GetParam();
  o.threads = 2;
  for (bool bias_correction : {true, false}) {
    o.bias_correction = bias_correction;
    const int64_t n = 50001;  // odd: exercises vector tails
    State a = Random(n, 42), b = a;
    CpuAdam adam(o);
    std::vector<float> grad_copy = b.g;
    double worst_rel = 0;
    for (int64_t t = 1; t <= 10; ++t) {
      // New gradients each step, identical for both.
      std::mt19937 gen(static_cast<uint32_t>(t));
      std::normal_distribution<float> d(0.f, 1e-2f);
      for (int64_t i = 0; i < n; ++i) a.g[i] = b.g[i] = d(gen);
      adam.Step(t, 2e-3, a.p.data(), a.g.data(), a.m.data(), a.v.data(), n);
      TorchStep(o, t, 2e-3, T(b.p), T(b.g).clone(), T(b.m), T(b.v));
    }
    // The moments differ by about one ulp of their terms per step (LibTorch's vector add fuses
    // the multiply-add); where m*b1 and (1-b1)*g cancel, that is large relative to m itself, so
    // the bound is relative to the largest moment. Parameters: a few ulp, far below 1e-6.
    double max_m = 0, max_v = 0, worst_m = 0, worst_v = 0;
    for (int64_t i = 0; i < n; ++i) {
      max_m = std::max(max_m, std::abs(double(b.m[i])));
      max_v = std::max(max_v, std::abs(double(b.v[i])));
    }
    for (int64_t i = 0; i < n; ++i) {
      // Adam moves a parameter by at most ~lr per step: measure the error in units of lr.
      worst_rel = std::max(worst_rel, std::abs(double(a.p[i]) - b.p[i]) / 2e-3);
      worst_m = std::max(worst_m, std::abs(double(a.m[i]) - b.m[i]) / max_m);
      worst_v = std::max(worst_v, std::abs(double(a.v[i]) - b.v[i]) / max_v);
    }
    EXPECT_LE(worst_m, 1e-6);
    EXPECT_LE(worst_v, 1e-6);
    std::cout << "max |m - m_torch| / max|m| = " << worst_m
              << ", max |v - v_torch| / max|v| = " << worst_v << "\n";
    EXPECT_LE(worst_rel, 1e-4) << "bias_correction=" << bias_correction;
    std::cout << "max |p - p_torch| / lr after 10 steps: " << worst_rel
              << "\n";
  }
}

TEST_P(CpuAdamTest, NullGradientMeansZeroGradient) {
  CpuAdamOptions o;
  o.weight_decay = 0.1;
  o.decoupled_weight_decay = GetParam();
  const int64_t n = 1031;
  State a = Random(n, 7), b = a;
  std::fill(b.g.begin(), b.g.end(), 0.f);
  CpuAdam adam(o);
  adam.Step(4, 1e-2, a.p.data(), nullptr, a.m.data(), a.v.data(), n);
  adam.Step(4, 1e-2, b.p.data(), b.g.data(), b.m.data(), b.v.data(), n);
  EXPECT_TRUE(BitEqual(a.p, b.p));
  EXPECT_TRUE(BitEqual(a.m, b.m));
  EXPECT_TRUE(BitEqual(a.v, b.v));
}

// Separate bias-correction counts for the two moments (ZenFlow's newly selected columns):
// against the op-by-op update with those counts, and equal to Step when they agree.
TEST_P(CpuAdamTest, StepWithMomentCountsCorrectsEachMomentByItsOwnCount) {
  at::set_num_threads(1);
  CpuAdamOptions o;
  o.weight_decay = 0.05;
  o.decoupled_weight_decay = GetParam();
  const int64_t n = 4099;
  State a = Random(n, 11), b = a, c = a, d = a;
  CpuAdam adam(o);
  adam.StepWithMomentCounts(2, 40, 2e-3, a.p.data(), a.g.data(), a.m.data(), a.v.data(), n);
  TorchStep(o, 2, 2e-3, T(b.p), T(b.g).clone(), T(b.m), T(b.v), 40);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(a.p[i]) - b.p[i]));
  EXPECT_LE(worst / 2e-3, 1e-4);
  // Not Step(2): the counts matter (bc2 at 40 vs at 2 differs ~20x here).
  adam.Step(2, 2e-3, c.p.data(), c.g.data(), c.m.data(), c.v.data(), n);
  EXPECT_FALSE(BitEqual(a.p, c.p));
  adam.StepWithMomentCounts(2, 2, 2e-3, d.p.data(), d.g.data(), d.m.data(), d.v.data(), n);
  EXPECT_TRUE(BitEqual(c.p, d.p));
}

INSTANTIATE_TEST_SUITE_P(WeightDecay, CpuAdamTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "AdamW" : "AdamL2"; });

TEST(ThreadPoolTest, CoversTheRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 64, 1000, 4097}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, 64, [&](int64_t b, int64_t e) {
      EXPECT_EQ(b % 64, 0);
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << i;
  }
}

}  // namespace
}  // namespace loom::engine::offload
