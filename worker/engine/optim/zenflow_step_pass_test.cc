// ZenFlowStepPass against plain LibTorch ops written here (no shared code): the accumulation
// (first step, add, interval mean, clip multiplier on read, absent gradient) bit for bit, and the
// selective AdamW of the selected elements within fp32 rounding, two interleaved cohorts with
// their own update counts in one pass, with the other master elements untouched; over several
// blocks (n not a multiple of kBlock) and 1 and 3 threads.
#include "worker/engine/optim/zenflow_step_pass.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace loom::engine::optim {
namespace {

constexpr double kLr = 1e-2, kWd = 0.1;

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), 4 * a.numel()) == 0;
}

offload::CpuAdamOptions Adam() {
  offload::CpuAdamOptions o;
  o.weight_decay = kWd;
  return o;
}

// Plain-ops AdamW step (decoupled decay); m and v bias-corrected by their own update counts.
at::Tensor AdamW(at::Tensor p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, int64_t t,
                 int64_t t_sq) {
  p = p * (1 - kLr * kWd);
  m = m * 0.9 + g * 0.1;
  v = v * 0.999 + g * g * 0.001;
  const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t_sq);
  return p - (kLr / bc1) * m / (v.sqrt() / std::sqrt(bc2) + 1e-8);
}

class ZenFlowStepPassTest : public ::testing::TestWithParam<int> {};

TEST_P(ZenFlowStepPassTest, MatchesPlainOps) {
  at::manual_seed(7);
  const int64_t n = 3 * ZenFlowStepPass::kBlock + 1237;
  // Selected: every 7th element plus a run across a block border, dealt alternately to two
  // cohorts; cohort 1 entered later (m from zero at step 1) with a v of 5 earlier updates.
  std::vector<int64_t> sel[2];
  for (int64_t e = 0; e < n; ++e) {
    if (e % 7 == 3 || (e >= ZenFlowStepPass::kBlock - 5 && e < ZenFlowStepPass::kBlock + 5)) {
      sel[(sel[0].size() + sel[1].size()) % 2].push_back(e);
    }
  }
  const int64_t t0[2] = {10, 0}, t0_sq[2] = {10, 5};
  at::Tensor idx[2], m[2], v[2], ref_m[2], ref_v[2];
  for (int c = 0; c < 2; ++c) {
    const int64_t k = static_cast<int64_t>(sel[c].size());
    idx[c] = at::tensor(sel[c], at::kLong);
    m[c] = at::rand({k}) * 0.01;
    v[c] = c == 0 ? at::rand({k}) * 1e-4 : at::zeros({k});
    if (c == 1) m[c].zero_();
    ref_m[c] = m[c].clone();
    ref_v[c] = v[c].clone();
  }
  at::Tensor master = at::randn({n});
  at::Tensor acc = at::full({n}, 123.0f);  // stale values: the first step must not read them
  at::Tensor ref_master = master.clone();
  at::Tensor ref_acc;
  ZenFlowStepPass pass(Adam(), GetParam());
  const float mults[] = {1.0f, 0.37f, 1.0f};
  for (int64_t t = 1; t <= 3; ++t) {
    const at::Tensor grad = at::randn({n}) * 0.01;
    const at::Tensor g = grad * static_cast<double>(mults[t - 1]);
    const bool last = t == 3;
    ref_acc = t == 1 ? 0.0f + g : ref_acc + g;
    if (last) ref_acc = ref_acc * (1.0 / 3.0);
    const at::Tensor untouched = master.clone();
    ZenFlowCohortArgs ca[2];
    for (int c = 0; c < 2; ++c) {
      ca[c] = {sel[c].data(), static_cast<int64_t>(sel[c].size()), m[c].data_ptr<float>(),
               v[c].data_ptr<float>(), t0[c] + t, t0_sq[c] + t};
    }
    ZenFlowPassArgs a;
    a.grad = grad.data_ptr<float>();
    a.grad_multiplier = mults[t - 1];
    a.acc = acc.data_ptr<float>();
    a.n = n;
    a.first = t == 1;
    a.mean_scale = last ? static_cast<float>(1.0 / 3.0) : 1.0f;
    a.master = master.data_ptr<float>();
    a.cohorts = ca;
    a.num_cohorts = 2;
    a.lr = kLr;
    pass.Run(a);
    EXPECT_TRUE(BitEqual(acc, ref_acc)) << "step " << t;
    at::Tensor other = at::ones({n}, at::kBool);
    for (int c = 0; c < 2; ++c) {
      const at::Tensor want = AdamW(ref_master.index_select(0, idx[c]),
                                    g.index_select(0, idx[c]), ref_m[c], ref_v[c], t0[c] + t,
                                    t0_sq[c] + t);
      ref_master.index_copy_(0, idx[c], want);
      EXPECT_LE((master.index_select(0, idx[c]) - want).abs().max().item<double>(), 1e-6)
          << "step " << t << " cohort " << c;
      EXPECT_LE((m[c] - ref_m[c]).abs().max().item<double>(), 1e-7) << t << " cohort " << c;
      EXPECT_LE((v[c] - ref_v[c]).abs().max().item<double>(), 1e-9) << t << " cohort " << c;
      other.index_fill_(0, idx[c], false);
    }
    // Every other element of the master is left as it was.
    EXPECT_TRUE(BitEqual(master.masked_select(other), untouched.masked_select(other))) << t;
  }
}

TEST_P(ZenFlowStepPassTest, AbsentGradientIsZero) {
  const int64_t n = 2 * ZenFlowStepPass::kBlock + 5;
  std::vector<int64_t> sel = {0, 9, n - 1};
  at::Tensor master = at::ones({n}), acc = at::full({n}, 5.0f);
  at::Tensor m = at::zeros({3}), v = at::zeros({3});
  ZenFlowStepPass pass(Adam(), GetParam());
  ZenFlowPassArgs a;
  a.acc = acc.data_ptr<float>();
  a.n = n;
  a.first = true;
  const ZenFlowCohortArgs cohort{sel.data(), 3, m.data_ptr<float>(), v.data_ptr<float>(), 1, 1};
  a.cohorts = &cohort;
  a.num_cohorts = 1;
  a.master = master.data_ptr<float>();
  a.lr = kLr;
  pass.Run(a);
  EXPECT_EQ(acc.abs().sum().item<double>(), 0.0);
  // A zero gradient still decays the selected weights (AdamW), and only those.
  EXPECT_FLOAT_EQ(master[9].item<float>(), static_cast<float>(1 - kLr * kWd));
  EXPECT_EQ(master[1].item<float>(), 1.0f);
  a.first = false;
  a.mean_scale = 0.5f;
  acc.fill_(4.0f);
  pass.Run(a);
  EXPECT_EQ(acc.sum().item<double>(), 2.0 * n);
}

INSTANTIATE_TEST_SUITE_P(Threads, ZenFlowStepPassTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace loom::engine::optim
