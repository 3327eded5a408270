// ZenFlow convergence (issue 14's acceptance): on the fortunes corpus with CPU optimizer offload,
// ZenFlow's held-out loss after the same number of steps is within 2% of synchronous
// ZeRO-Offload's. Real loom-trainer processes, 2 ranks over Gloo, ZeRO stage 2, the tiny Llama of
// gang_test_util.h (hidden 64, 2 layers, byte vocabulary; the example job's model is ~6.4M
// parameters and 300 steps at sequence 128, too slow for the suite), micro-batch 4, sequence 32,
// kSteps steps, a constant learning rate. ZenFlow: topk_ratio 0.1, select and update every 4
// steps, overlap_step on (so the unselected columns are up to 7 steps stale), 1 warm-up round.
// The reference is the same job without the zenflow block; both start from the same weights and
// read the same batches. Held-out loss: the final eval event (16 held-out micro-batches).
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

constexpr int kSteps = 200;

std::string Spec(const std::string& name, const json& zenflow) {
  const std::string path = WriteSpec(name, 4, kSteps);
  json spec = json::parse(*ReadText(path));
  json& ds = spec["deepspeed_config"];
  ds["gradient_accumulation_steps"] = 1;
  ds["gradient_clipping"] = 1.0;
  ds.erase("scheduler");  // constant lr 3e-3
  ds["zero_optimization"] = {{"stage", 2},
                             {"overlap_comm", true},
                             {"reduce_bucket_size", 20000},
                             {"offload_optimizer", {{"device", "cpu"}}}};
  if (!zenflow.is_null()) ds["zero_optimization"]["zenflow"] = zenflow;
  spec["training"]["eval_every_steps"] = "0";
  spec["training"]["eval_batches"] = 16;
  spec["checkpoint"]["interval_steps"] = std::to_string(kSteps);
  std::ofstream(path) << spec.dump(2);
  return path;
}

std::vector<double> EvalLosses(const std::string& name, const std::string& spec) {
  const absl::Time t0 = absl::Now();
  GangResult r = RunGang(name, spec, 2, {"--checkpoint_dir=" + TmpDir() + "/ckpt_" + name});
  std::cerr << name << ": " << kSteps << " steps in " << absl::Now() - t0 << "\n";
  EXPECT_FALSE(r.timed_out) << name;
  for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0) << name << " rank " << rank;
  }
  EXPECT_EQ(Losses(r, "step").size(), static_cast<size_t>(kSteps)) << name;
  return Losses(r, "eval");
}

TEST(ZenFlowConvergenceTest, HeldOutLossWithinTwoPercentOfZeroOffload) {
  const std::vector<double> off = EvalLosses("conv_offload", Spec("conv_offload", nullptr));
  const std::vector<double> zf =
      EvalLosses("conv_zenflow", Spec("conv_zenflow", {{"topk_ratio", 0.1},
                                                       {"select_strategy", "step"},
                                                       {"select_interval", 4},
                                                       {"update_interval", 4},
                                                       {"overlap_step", true},
                                                       {"full_warm_up_rounds", 1}}));
  ASSERT_GE(off.size(), 2u);
  ASSERT_GE(zf.size(), 2u);
  EXPECT_EQ(zf.front(), off.front()) << "the same initial weights and held-out batches";
  // Both trained well past the start (the comparison is of trained models, not of two
  // near-initial ones): a byte-level model starts near ln(256) = 5.55 nats.
  EXPECT_LT(off.back(), 0.75 * off.front());
  EXPECT_LT(zf.back(), 0.75 * zf.front());
  const double delta = std::fabs(zf.back() - off.back()) / off.back();
  std::cerr << "held-out loss after " << kSteps << " steps: offload " << off.back()
            << ", zenflow " << zf.back() << ", relative difference " << delta << "\n";
  EXPECT_LE(delta, 0.02);
}

}  // namespace
