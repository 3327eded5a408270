// ALST tiled compute end to end (issue 13): loom-trainer gangs (2 ranks, ZeRO-3, GAS 2,
// clipping; gang_test_util's tiny job) with training.tiled_mlp_compute and
// training.tiled_logits_loss set give the untiled job's loss trajectory and held-out losses
// within 1e-5 relative (fp32 summation order of the tiles), and the same collective sequence on
// both ranks. Bad tile sizes are config errors naming the field.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

constexpr int kSteps = 4;

std::string TiledSpec(const std::string& name, const json& training) {
  const std::string path = WriteSpec(name, /*micro=*/2, kSteps);
  json spec = json::parse(*ReadText(path));
  for (auto it = training.begin(); it != training.end(); ++it) spec["training"][it.key()] = *it;
  std::ofstream(path) << spec.dump(2);
  return path;
}

void ExpectSuccess(const GangResult& r, const std::string& name) {
  ASSERT_FALSE(r.timed_out) << name;
  for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0)
        << name << " rank " << rank << " (see " << name << ".rank" << rank << ".stderr)";
  }
}

TEST(TiledComputeTrainerTest, TiledJobFollowsTheUntiledLossTrajectory) {
  GangResult plain = RunGang("untiled", TiledSpec("untiled", json::object()), 2, {});
  ExpectSuccess(plain, "untiled");
  // 32 tokens per sample: MLP tiles of 10 -> 4 tiles (8 each); 2 samples = 64 loss rows in
  // tiles of 24 -> 3 tiles (22, 22, 20).
  GangResult tiled = RunGang("tiled",
                             TiledSpec("tiled", {{"tiled_mlp_compute", true},
                                                 {"tiled_mlp_tile_size", "10"},
                                                 {"tiled_logits_loss", true},
                                                 {"tiled_logits_loss_tile_size", "24"}}),
                             2, {});
  ExpectSuccess(tiled, "tiled");
  const std::vector<double> a = Losses(plain, "step"), b = Losses(tiled, "step");
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), a.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
    worst = std::max(worst, std::abs(b[i] - a[i]) / a[i]);
  }
  const std::vector<double> ea = Losses(plain, "eval"), eb = Losses(tiled, "eval");
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) EXPECT_NEAR(eb[i], ea[i], 1e-5 * ea[i]) << "eval " << i;
  std::cout << "tiled vs untiled: max relative step-loss difference " << worst << "\n";
  std::vector<json> d0 = tiled.Of(0, "done"), d1 = tiled.Of(1, "done");
  ASSERT_EQ(d0.size(), 1u);
  ASSERT_EQ(d1.size(), 1u);
  EXPECT_EQ(d0[0]["collective_hash"], d1[0]["collective_hash"]);
}

TEST(TiledComputeTrainerTest, BadTileSizesAreConfigErrorsNamingTheField) {
  struct Case {
    json training;
    std::string field;
  };
  const std::vector<Case> cases = {
      {{{"tiled_mlp_compute", true}, {"tiled_mlp_tile_size", "-3"}},
       "training.tiled_mlp_tile_size"},
      {{{"tiled_logits_loss_tile_size", "64"}}, "training.tiled_logits_loss_tile_size"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = "bad_tiles_" + std::to_string(i);
    GangResult r = RunGang(name, TiledSpec(name, cases[i].training), 1, {});
    EXPECT_EQ(r.exit_codes[0], loom::kTrainerExitConfigError) << name;
    std::vector<json> errors = r.Of(0, "error");
    ASSERT_EQ(errors.size(), 1u) << name;
    EXPECT_NE(errors[0]["message"].get<std::string>().find(cases[i].field), std::string::npos)
        << errors[0]["message"];
  }
}

}  // namespace
