// CpuAdam's partial and asynchronous updates (StepRange, StepRows, StepColumns,
// StartStepAsync/Wait) against (a) an independent scalar Adam/AdamW loop written here from the
// formulas in cpu_adam.h, bit for bit, and (b) the plain Step on the same data: updated elements
// equal the full step's, untouched elements keep their old values. Torch-free.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/offload/cpu_adam.h"

namespace loom::engine::offload {
namespace {

using ::loom::testing::StatusIs;

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

// Element i of one step, written from the formulas (fp32 coefficients rounded once, no FMA:
// this file is compiled with -ffp-contract=off).
void ReferenceElement(const CpuAdamOptions& o, int64_t t, double lr, State& s, int64_t i) {
  const double bc1 = o.bias_correction ? 1.0 - std::pow(o.beta1, static_cast<double>(t)) : 1.0;
  const double bc2 = o.bias_correction ? 1.0 - std::pow(o.beta2, static_cast<double>(t)) : 1.0;
  float p = s.p[i], g = s.g.empty() ? 0.f : s.g[i];
  if (o.weight_decay != 0 && o.decoupled_weight_decay) {
    p = p * static_cast<float>(1.0 - lr * o.weight_decay);
  }
  if (o.weight_decay != 0 && !o.decoupled_weight_decay) {
    g = g + static_cast<float>(o.weight_decay) * p;
  }
  const float m = s.m[i] * static_cast<float>(o.beta1) + static_cast<float>(1.0 - o.beta1) * g;
  const float v =
      s.v[i] * static_cast<float>(o.beta2) + static_cast<float>(1.0 - o.beta2) * g * g;
  const float d = std::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(o.eps);
  s.p[i] = p + static_cast<float>(-(lr / bc1)) * m / d;
  s.m[i] = m;
  s.v[i] = v;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void ExpectStateEq(const State& a, const State& b) {
  EXPECT_TRUE(BitEqual(a.p, b.p));
  EXPECT_TRUE(BitEqual(a.m, b.m));
  EXPECT_TRUE(BitEqual(a.v, b.v));
}

std::vector<CpuAdamOptions> Configs() {
  CpuAdamOptions adamw;
  adamw.weight_decay = 0.1;
  adamw.threads = 3;
  CpuAdamOptions adam_l2 = adamw;
  adam_l2.decoupled_weight_decay = false;
  adam_l2.threads = 1;
  CpuAdamOptions no_bc;
  no_bc.bias_correction = false;
  no_bc.threads = 2;
  return {adamw, adam_l2, no_bc};
}

TEST(CpuAdamPartialTest, StepRangeEqualsReferenceAndFullStepInsideLeavesTheRest) {
  constexpr int64_t kN = 40000, kBegin = 1237, kEnd = 35001;  // spans several thread chunks
  for (const CpuAdamOptions& o : Configs()) {
    CpuAdam adam(o);
    State s = Random(kN, 7), full = s, ref = s;
    adam.StepRange(3, 1e-3, s.p.data(), s.g.data(), s.m.data(), s.v.data(), kBegin, kEnd);
    adam.Step(3, 1e-3, full.p.data(), full.g.data(), full.m.data(), full.v.data(), kN);
    for (int64_t i = kBegin; i < kEnd; ++i) ReferenceElement(o, 3, 1e-3, ref, i);
    ExpectStateEq(s, ref);
    const State orig = Random(kN, 7);
    for (int64_t i = 0; i < kN; ++i) {
      const bool inside = i >= kBegin && i < kEnd;
      const State& want = inside ? full : orig;
      ASSERT_EQ(std::memcmp(&s.p[i], &want.p[i], 4), 0) << i;
      ASSERT_EQ(std::memcmp(&s.v[i], &want.v[i], 4), 0) << i;
    }
  }
}

TEST(CpuAdamPartialTest, StepRangeWithZeroGradientAndEmptyRange) {
  CpuAdamOptions o;
  o.weight_decay = 0.01;
  CpuAdam adam(o);
  State s = Random(100, 3), ref = s;
  ref.g.clear();  // reference: zero gradient
  adam.StepRange(1, 1e-2, s.p.data(), nullptr, s.m.data(), s.v.data(), 10, 90);
  for (int64_t i = 10; i < 90; ++i) ReferenceElement(o, 1, 1e-2, ref, i);
  EXPECT_TRUE(BitEqual(s.p, ref.p));
  EXPECT_TRUE(BitEqual(s.m, ref.m));
  const State before = s;
  adam.StepRange(2, 1e-2, s.p.data(), s.g.data(), s.m.data(), s.v.data(), 50, 50);
  ExpectStateEq(s, before);
}

TEST(CpuAdamPartialTest, StepRowsAndColumnsEqualReferenceOnSelectedElements) {
  constexpr int64_t kRows = 37, kCols = 53;
  const std::vector<int64_t> rows = {36, 0, 5, 17}, cols = {52, 1, 2, 30, 11};
  for (const CpuAdamOptions& o : Configs()) {
    CpuAdam adam(o);
    State r = Random(kRows * kCols, 11), c = r, ref_r = r, ref_c = r;
    ASSERT_TRUE(adam.StepRows(4, 3e-4, r.p.data(), r.g.data(), r.m.data(), r.v.data(), kRows,
                              kCols, rows)
                    .ok());
    ASSERT_TRUE(adam.StepColumns(4, 3e-4, c.p.data(), c.g.data(), c.m.data(), c.v.data(), kRows,
                                 kCols, cols)
                    .ok());
    for (int64_t row : rows) {
      for (int64_t j = 0; j < kCols; ++j) ReferenceElement(o, 4, 3e-4, ref_r, row * kCols + j);
    }
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t col : cols) ReferenceElement(o, 4, 3e-4, ref_c, i * kCols + col);
    }
    ExpectStateEq(r, ref_r);
    ExpectStateEq(c, ref_c);
  }
}

TEST(CpuAdamPartialTest, AllColumnsEqualsFullStep) {
  constexpr int64_t kRows = 9, kCols = 2000;
  std::vector<int64_t> all;
  for (int64_t j = kCols; j-- > 0;) all.push_back(j);  // any order
  CpuAdamOptions o;
  o.threads = 2;
  CpuAdam adam(o);
  State c = Random(kRows * kCols, 5), full = c;
  ASSERT_TRUE(
      adam.StepColumns(2, 1e-3, c.p.data(), nullptr, c.m.data(), c.v.data(), kRows, kCols, all)
          .ok());
  adam.Step(2, 1e-3, full.p.data(), nullptr, full.m.data(), full.v.data(), kRows * kCols);
  ExpectStateEq(c, full);
}

TEST(CpuAdamPartialTest, BadIndicesNameTheIndexAndUpdateNothing) {
  CpuAdam adam(CpuAdamOptions{});
  State s = Random(12, 1);
  const State before = s;
  EXPECT_THAT(adam.StepRows(1, 1e-3, s.p.data(), s.g.data(), s.m.data(), s.v.data(), 3, 4,
                            {0, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, "row index 3 (entry 1)"));
  EXPECT_THAT(adam.StepColumns(1, 1e-3, s.p.data(), s.g.data(), s.m.data(), s.v.data(), 3, 4,
                               {-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "column index -1"));
  ExpectStateEq(s, before);
}

TEST(CpuAdamPartialTest, AsyncStepEqualsStepAndWaitReportsMisuse) {
  constexpr int64_t kN = 100000;
  for (const CpuAdamOptions& o : Configs()) {
    CpuAdam adam(o);
    State a = Random(kN, 9), ref = a;
    // Double buffering: step t reads buffer 0 while the "next" gradients land in buffer 1.
    std::vector<float> grad0 = a.g, grad1(kN);
    ASSERT_TRUE(adam.StartStepAsync(1, 1e-3, a.p.data(), grad0.data(), a.m.data(), a.v.data(),
                                    kN)
                    .ok());
    EXPECT_TRUE(adam.step_in_flight());
    EXPECT_THAT(adam.StartStepAsync(2, 1e-3, a.p.data(), grad1.data(), a.m.data(), a.v.data(),
                                    kN),
                StatusIs(absl::StatusCode::kFailedPrecondition, "already in flight"));
    for (int64_t i = 0; i < kN; ++i) grad1[i] = 0.5f * grad0[i];  // overlapped with the step
    ASSERT_TRUE(adam.Wait().ok());
    EXPECT_FALSE(adam.step_in_flight());
    ASSERT_TRUE(adam.StartStepAsync(2, 1e-3, a.p.data(), grad1.data(), a.m.data(), a.v.data(),
                                    kN)
                    .ok());
    ASSERT_TRUE(adam.Wait().ok());
    for (int64_t i = 0; i < kN; ++i) ReferenceElement(o, 1, 1e-3, ref, i);
    ref.g = grad1;
    for (int64_t i = 0; i < kN; ++i) ReferenceElement(o, 2, 1e-3, ref, i);
    ExpectStateEq(a, ref);
    EXPECT_THAT(adam.Wait(), StatusIs(absl::StatusCode::kFailedPrecondition, "no asynchronous"));
  }
}

TEST(CpuAdamPartialTest, SyncStepAfterAsyncAppliesInCallOrder) {
  CpuAdamOptions o;
  o.threads = 2;
  CpuAdam adam(o);
  State a = Random(50000, 4), ref = a;
  ASSERT_TRUE(
      adam.StartStepAsync(1, 1e-3, a.p.data(), a.g.data(), a.m.data(), a.v.data(), 50000).ok());
  adam.Step(2, 1e-3, a.p.data(), a.g.data(), a.m.data(), a.v.data(), 50000);  // waits first
  EXPECT_FALSE(adam.step_in_flight());
  for (int64_t t = 1; t <= 2; ++t) {
    for (int64_t i = 0; i < 50000; ++i) ReferenceElement(o, t, 1e-3, ref, i);
  }
  ExpectStateEq(a, ref);
  EXPECT_THAT(
      adam.StartStepAsync(1, 1e-3, nullptr, a.g.data(), a.m.data(), a.v.data(), 5),
      StatusIs(absl::StatusCode::kInvalidArgument, "null param"));
}

}  // namespace
}  // namespace loom::engine::offload
