// SumOfSquares / LocalSquaredNorm against LibTorch's fp64 reduction written here
// (g.to(kDouble).pow(2).sum(), what ZeroProvider::LocalGradSquaredNorm computes): lengths that
// are and are not multiples of the 8 accumulators, empty and undefined tensors, a 2-D tensor, a
// bf16 gradient, an inf (the overflow path reads an infinite norm).
#include "worker/engine/optim/grad_norm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace loom::engine::optim {
namespace {

double Reference(const at::Tensor& g) { return g.to(at::kDouble).pow(2).sum().item<double>(); }

at::Tensor Values(int64_t n, double seed) {
  return (at::sin(at::arange(n, at::kDouble) * seed + 0.25) * 3.0).to(at::kFloat);
}

TEST(GradNormTest, SumOfSquaresMatchesFp64PowSum) {
  for (int64_t n : {0, 1, 7, 8, 9, 63, 1000, 100003}) {
    const at::Tensor g = Values(n, 0.37);
    const double want = Reference(g);
    const double got = SumOfSquares(g.data_ptr<float>(), n);
    EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, want)) << "n " << n;
    if (n > 0) {
      EXPECT_GT(got, 0) << n;
    }
  }
}

TEST(GradNormTest, LocalSquaredNormSumsDefinedTensors) {
  const at::Tensor a = Values(4097, 0.11).reshape({17, 241});
  const at::Tensor b = Values(5, 1.7);
  const at::Tensor half = Values(999, 0.05).to(at::kBFloat16);
  const double want = Reference(a) + Reference(b) + Reference(half.to(at::kFloat));
  const double got =
      LocalSquaredNorm({a, at::Tensor(), b, at::zeros({0}, at::kFloat), half});
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_EQ(LocalSquaredNorm({}), 0.0);
}

TEST(GradNormTest, NonFiniteGradientGivesANonFiniteNorm) {
  at::Tensor g = Values(100, 0.3);
  g[42] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(LocalSquaredNorm({g})));
  g[42] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(LocalSquaredNorm({g})));
}

}  // namespace
}  // namespace loom::engine::optim
