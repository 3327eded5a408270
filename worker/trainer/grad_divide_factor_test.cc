// The trainer's ZeRO gradient divide factor comes from its ProcessGroups (trainer_zero_options.h;
// DeepSpeed issue #5248's caveat, docs/design/TECHNIQUES.md §3.2), end to end with real
// loom-trainer ranks: a data-parallel job (2 ranks, GAS 1) and a sequence-parallel one (2 ranks,
// sequence_parallel_size 2, so D = 1, GAS 2) train on the same samples in their first step
// (docs/engine.md, "Ulysses": (D, P=1, GAS) and (D/k, P=k, GAS*k) see the same samples), so with
// the right factors (2 and 1) their step loss and pre-clipping gradient norm agree to fp32
// reduction order. Dividing the SP job's gradients by the world size (D*P = 2, the factor before
// the ProcessGroups carried the loss convention) halves its gradient norm.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/trainer/gang_test_util.h"

namespace loom::trainer_test {
namespace {

TEST(GradDivideFactorTest, SequenceParallelJobMatchesTheDataParallelJob) {
  const std::string dp =
      WriteSpec("gdf_dp", /*micro=*/2, /*steps=*/1, R"({"gradient_accumulation_steps": 1})");
  const std::string sp = WriteSpec("gdf_sp", /*micro=*/2, /*steps=*/1,
                                   R"({"gradient_accumulation_steps": 2,
                                       "sequence_parallel_size": 2})");
  GangResult a = RunGang("gdf_dp", dp, 2, {});
  GangResult b = RunGang("gdf_sp", sp, 2, {});
  ASSERT_EQ(a.exit_codes, (std::vector<int>{0, 0}));
  ASSERT_EQ(b.exit_codes, (std::vector<int>{0, 0}));
  const std::vector<json> da = a.Of(0, "step"), db = b.Of(0, "step");
  ASSERT_EQ(da.size(), 1u);
  ASSERT_EQ(db.size(), 1u);
  const double loss_a = da[0]["loss"].get<double>(), loss_b = db[0]["loss"].get<double>();
  const double norm_a = da[0]["grad_norm"].get<double>(), norm_b = db[0]["grad_norm"].get<double>();
  EXPECT_GT(norm_a, 0);
  EXPECT_NEAR(loss_b, loss_a, 1e-5 * std::abs(loss_a));
  // 1e-4 relative: fp32 reduction order (all-to-all attention vs the plain core); a wrong factor
  // is off by 2x.
  EXPECT_NEAR(norm_b, norm_a, 1e-4 * norm_a) << "SP/DP grad norm ratio " << norm_b / norm_a;
}

}  // namespace
}  // namespace loom::trainer_test
