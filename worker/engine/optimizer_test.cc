// ApplyOptimizerStep (optimizer.h) on fp32 CPU partitions runs offload::CpuAdam's fused kernel:
// checked against an independent op-by-op torch.optim.AdamW / Adam formula written here with
// ATen over whole tensors (within a few ulp per step: ATen contracts to FMA, the kernel does
// not), against CpuAdam::Step itself bit for bit (the dispatch reaches the kernel, the unscale
// multiply happens first), and for thread-count independence (bit for bit at 1 and 2 intra-op
// threads). Partition sizes straddle the 65,536-element slice.
#include "worker/engine/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "worker/engine/offload/cpu_adam.h"

namespace loom::engine {
namespace {

const std::vector<int64_t> kSizes = {5, 65536, 65536 * 2 + 37};

spec::OptimizerConfig Config(bool decoupled, double wd, bool bias_correction) {
  spec::OptimizerConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.weight_decay = wd;
  c.decoupled_weight_decay = decoupled;
  c.bias_correction = bias_correction;
  return c;
}

struct State {
  std::vector<OptimizerPartition> parts;
};

State MakeState(uint64_t seed, bool with_grad = true) {
  at::manual_seed(seed);
  State s;
  for (int64_t n : kSizes) {
    OptimizerPartition p;
    p.param = at::randn({n});
    p.grad = with_grad ? at::randn({n}) * 1e-2 : at::Tensor();
    p.exp_avg = at::zeros({n});
    p.exp_avg_sq = at::zeros({n});
    s.parts.push_back(p);
  }
  return s;
}

State Clone(const State& s) {
  State c;
  for (const OptimizerPartition& p : s.parts) {
    c.parts.push_back({p.param.clone(), p.grad.defined() ? p.grad.clone() : at::Tensor(),
                       p.exp_avg.clone(), p.exp_avg_sq.clone()});
  }
  return c;
}

// torch.optim.Adam(W) single-tensor step (PyTorch 1.13 _single_tensor_adam), op by op in fp32.
void ReferenceStep(const spec::OptimizerConfig& c, int64_t t, double lr, double mult,
                   OptimizerPartition& p) {
  at::Tensor g = p.grad.defined() ? p.grad * mult : at::zeros_like(p.param);
  if (c.weight_decay != 0) {
    if (c.decoupled_weight_decay) {
      p.param.mul_(1 - lr * c.weight_decay);
    } else {
      g = g.add(p.param, c.weight_decay);
    }
  }
  p.exp_avg.mul_(c.beta1).add_(g, 1 - c.beta1);
  p.exp_avg_sq.mul_(c.beta2).addcmul_(g, g, 1 - c.beta2);
  const double bc1 = c.bias_correction ? 1 - std::pow(c.beta1, t) : 1.0;
  const double bc2 = c.bias_correction ? 1 - std::pow(c.beta2, t) : 1.0;
  at::Tensor denom = (p.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(c.eps);
  p.param.addcdiv_(p.exp_avg, denom, -lr / bc1);
}

void ExpectBitEqual(const State& a, const State& b) {
  ASSERT_EQ(a.parts.size(), b.parts.size());
  for (size_t i = 0; i < a.parts.size(); ++i) {
    EXPECT_TRUE(at::equal(a.parts[i].param, b.parts[i].param)) << "partition " << i;
    EXPECT_TRUE(at::equal(a.parts[i].exp_avg, b.parts[i].exp_avg)) << "partition " << i;
    EXPECT_TRUE(at::equal(a.parts[i].exp_avg_sq, b.parts[i].exp_avg_sq)) << "partition " << i;
  }
}

struct Case {
  bool decoupled;
  double wd;
  bool bias_correction;
  double mult;
};

class ApplyOptimizerStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(ApplyOptimizerStepTest, MatchesOpByOpTorchAdamOverTenSteps) {
  const Case k = GetParam();
  const spec::OptimizerConfig c = Config(k.decoupled, k.wd, k.bias_correction);
  State fused = MakeState(1), ref = Clone(fused);
  for (int64_t t = 1; t <= 10; ++t) {
    const double lr = 1e-3 * t;
    // Fresh gradients each step (the engine's gradients are rewritten every step).
    at::manual_seed(100 + t);
    for (size_t i = 0; i < fused.parts.size(); ++i) {
      at::Tensor g = at::randn({kSizes[i]}) * 1e-2;
      fused.parts[i].grad.copy_(g);
      ref.parts[i].grad.copy_(g);
    }
    OptimizerStepArgs args;
    args.step = t;
    args.lr = lr;
    args.grad_multiplier = k.mult;
    ApplyOptimizerStep(c, args, fused.parts);
    for (OptimizerPartition& p : ref.parts) ReferenceStep(c, t, lr, k.mult, p);
  }
  for (size_t i = 0; i < fused.parts.size(); ++i) {
    // A few ulp per step over 10 steps, relative to the weights' scale (~1).
    EXPECT_LE((fused.parts[i].param - ref.parts[i].param).abs().max().item<float>(), 1e-6)
        << "partition " << i;
    EXPECT_TRUE(at::allclose(fused.parts[i].exp_avg, ref.parts[i].exp_avg, 1e-5, 1e-9));
    EXPECT_TRUE(at::allclose(fused.parts[i].exp_avg_sq, ref.parts[i].exp_avg_sq, 1e-5, 1e-12));
    EXPECT_FALSE(at::equal(fused.parts[i].param, MakeState(1).parts[i].param))
        << "the step changed nothing";
  }
}

TEST_P(ApplyOptimizerStepTest, EqualsCpuAdamStepAfterTheUnscaleMultiply) {
  const Case k = GetParam();
  const spec::OptimizerConfig c = Config(k.decoupled, k.wd, k.bias_correction);
  State fused = MakeState(2), ref = Clone(fused);
  offload::CpuAdamOptions ao;
  ao.beta1 = c.beta1;
  ao.beta2 = c.beta2;
  ao.eps = c.eps;
  ao.weight_decay = c.weight_decay;
  ao.decoupled_weight_decay = c.decoupled_weight_decay;
  ao.bias_correction = c.bias_correction;
  offload::CpuAdam adam(ao);
  for (int64_t t = 1; t <= 3; ++t) {
    OptimizerStepArgs args;
    args.step = t;
    args.lr = 2e-3;
    args.grad_multiplier = k.mult;
    ApplyOptimizerStep(c, args, fused.parts);
    for (OptimizerPartition& p : ref.parts) {
      if (k.mult != 1.0) p.grad.mul_(k.mult);  // the pipeline's unscale, as offload does it
      adam.Step(t, args.lr, p.param.data_ptr<float>(), p.grad.data_ptr<float>(),
                p.exp_avg.data_ptr<float>(), p.exp_avg_sq.data_ptr<float>(), p.param.numel());
    }
  }
  ExpectBitEqual(fused, ref);
  for (size_t i = 0; i < fused.parts.size(); ++i) {
    EXPECT_TRUE(at::equal(fused.parts[i].grad, ref.parts[i].grad)) << "partition " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ApplyOptimizerStepTest,
                         ::testing::Values(Case{true, 0.0, true, 1.0},   // AdamW, no decay
                                           Case{true, 0.1, true, 0.5},   // AdamW + unscale
                                           Case{false, 0.01, true, 1.0},  // Adam, L2
                                           Case{false, 0.0, false, 0.25}));

TEST(ApplyOptimizerStep, ThreadCountDoesNotChangeBits) {
  const spec::OptimizerConfig c = Config(true, 0.1, true);
  State one = MakeState(3), two = Clone(one);
  OptimizerStepArgs args;
  args.lr = 1e-3;
  args.grad_multiplier = 0.5;
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  ApplyOptimizerStep(c, args, one.parts);
  at::set_num_threads(2);
  ApplyOptimizerStep(c, args, two.parts);
  at::set_num_threads(before);
  ExpectBitEqual(one, two);
}

TEST(ApplyOptimizerStep, UndefinedGradientIsAZeroGradient) {
  const spec::OptimizerConfig c = Config(false, 0.01, true);
  State none = MakeState(4, /*with_grad=*/false), zeros = Clone(none);
  for (OptimizerPartition& p : zeros.parts) p.grad = at::zeros_like(p.param);
  OptimizerStepArgs args;
  args.lr = 1e-3;
  args.grad_multiplier = 0.5;
  ApplyOptimizerStep(c, args, none.parts);
  ApplyOptimizerStep(c, args, zeros.parts);
  ExpectBitEqual(none, zeros);
}

}  // namespace
}  // namespace loom::engine
