// zero_optimization.zenflow parsing (ds_config_zenflow.cc): DeepSpeed's keys, defaults
// (docs/design/TECHNIQUES.md §2.6) and constraints, each violation INVALID_ARGUMENT naming the key.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/ds_config.h"

namespace loom::spec {
namespace {

using ::loom::testing::StatusIs;
using ::testing::HasSubstr;

// A stage-`stage` config with CPU optimizer offload and the given zenflow block.
std::string Config(const std::string& zenflow, int stage = 2,
                   const std::string& offload = R"({"device": "cpu"})",
                   const std::string& extra_zero = "") {
  return absl::StrCat(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": )",
                      stage, extra_zero, R"(, "offload_optimizer": )", offload,
                      R"(, "zenflow": )", zenflow, "}}");
}

void ExpectError(const std::string& json, const std::string& needle) {
  EXPECT_THAT(ParseDeepSpeedConfig(json, 2), StatusIs(absl::StatusCode::kInvalidArgument, needle))
      << json;
}

TEST(ZenFlowConfigTest, AbsentBlockLeavesZenFlowOff) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}})",
      2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->zero.zenflow.enabled);
}

TEST(ZenFlowConfigTest, EmptyBlockHasDeepSpeedsDefaults) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(Config("{}"), 2);
  ASSERT_TRUE(c.ok()) << c.status();
  const ZenFlowConfig& z = c->zero.zenflow;
  EXPECT_TRUE(z.enabled);
  EXPECT_DOUBLE_EQ(z.topk_ratio, 0.1);
  EXPECT_EQ(z.select_strategy, "auto");
  EXPECT_EQ(z.select_interval, 0);  // "auto"
  EXPECT_EQ(z.update_interval, 0);  // "auto"
  EXPECT_FALSE(z.overlap_step);
  EXPECT_FALSE(z.offload);
  EXPECT_DOUBLE_EQ(z.auto_ratio, 0.99);
  EXPECT_EQ(z.full_warm_up_rounds, 0);
  EXPECT_DOUBLE_EQ(z.pt_reserved_cores_perc, 0.5);
}

TEST(ZenFlowConfigTest, TheTutorialBlockAsWritten) {
  // DeepSpeed's ZenFlow tutorial: stage 2, topk 0.05, update 4, overlap on.
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      Config(R"({"topk_ratio": 0.05, "select_strategy": "step", "select_interval": 4,
                 "update_interval": 4, "overlap_step": true, "full_warm_up_rounds": 0,
                 "auto_ratio": 0.99, "pt_reserved_cores_perc": 0.25})"),
      2);
  ASSERT_TRUE(c.ok()) << c.status();
  const ZenFlowConfig& z = c->zero.zenflow;
  EXPECT_DOUBLE_EQ(z.topk_ratio, 0.05);
  EXPECT_EQ(z.select_strategy, "step");
  EXPECT_EQ(z.select_interval, 4);
  EXPECT_EQ(z.update_interval, 4);
  EXPECT_TRUE(z.overlap_step);
  EXPECT_DOUBLE_EQ(z.pt_reserved_cores_perc, 0.25);
}

TEST(ZenFlowConfigTest, AutoStringsAndEpochStrategy) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      Config(R"({"select_strategy": "epoch", "select_interval": 1, "update_interval": "auto",
                 "steps_per_epoch": 10})"),
      2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.zenflow.select_interval, 1);
  EXPECT_EQ(c->zero.zenflow.update_interval, 0);
  EXPECT_EQ(c->zero.zenflow.steps_per_epoch, 10);
}

TEST(ZenFlowConfigTest, AutoStrategyWithAnIntegerIntervalWarnsAndUsesOneEpoch) {
  absl::StatusOr<DeepSpeedConfig> c =
      ParseDeepSpeedConfig(Config(R"({"select_strategy": "auto", "select_interval": 7})"), 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.zenflow.select_interval, 0);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_THAT(c->warnings[0],
              HasSubstr("deepspeed_config.zero_optimization.zenflow.select_interval: ignored"));
}

TEST(ZenFlowConfigTest, EachViolationNamesItsKey) {
  const std::string zf = "deepspeed_config.zero_optimization.zenflow";
  ExpectError(Config(R"({"topk_ratio": 1.5})"), zf + ".topk_ratio: 1.5 is not in [0, 1]");
  ExpectError(Config(R"({"topk_ratio": -0.1})"), zf + ".topk_ratio");
  ExpectError(Config(R"({"topk_ratio": "big"})"), zf + ".topk_ratio");
  ExpectError(Config(R"({"select_strategy": "random"})"),
              zf + ".select_strategy: \"random\" is not one of auto, step, epoch");
  ExpectError(Config(R"({"select_strategy": "step"})"),
              zf + ".select_interval: an integer is required");
  ExpectError(Config(R"({"select_strategy": "step", "select_interval": 2,
                         "update_interval": 4})"),
              zf + ".select_interval: 2 is below update_interval 4");
  ExpectError(Config(R"({"update_interval": 0})"), zf + ".update_interval: 0 is not a positive");
  ExpectError(Config(R"({"update_interval": "sometimes"})"),
              zf + ".update_interval: expected a positive integer or \"auto\"");
  ExpectError(Config(R"({"select_strategy": "step", "select_interval": -3})"),
              zf + ".select_interval");
  ExpectError(Config(R"({"overlap_step": "yes"})"), zf + ".overlap_step");
  ExpectError(Config(R"({"auto_ratio": 0})"), zf + ".auto_ratio: 0 is not in (0, 1]");
  ExpectError(Config(R"({"auto_ratio": 1.01})"), zf + ".auto_ratio");
  ExpectError(Config(R"({"full_warm_up_rounds": -1})"), zf + ".full_warm_up_rounds");
  ExpectError(Config(R"({"pt_reserved_cores_perc": 2})"), zf + ".pt_reserved_cores_perc");
  ExpectError(Config(R"({"steps_per_epoch": 0})"), zf + ".steps_per_epoch");
  ExpectError(Config(R"({"topk": 0.1})"), zf + ".topk: unknown key");
  ExpectError(Config("[1]"), zf + ": expected a JSON object");
  // Regression: "nan" (absl::SimpleAtod accepts it) passed every range check, and a NaN
  // topk_ratio with update_interval "auto" silently turned the CPU updates off.
  for (const char* key : {"topk_ratio", "auto_ratio", "pt_reserved_cores_perc"}) {
    for (const char* nan : {"nan", "NaN", "-nan"}) {
      ExpectError(Config(absl::StrCat(R"({")", key, R"(": ")", nan, R"("})")),
                  absl::StrCat(zf, ".", key, ": expected a finite number"));
    }
  }
  // select_interval epochs whose step count overflows int64 (it used to wrap to a negative or
  // zero interval).
  ExpectError(Config(R"({"select_strategy": "epoch", "select_interval": 4503599627370496,
                         "steps_per_epoch": 4096})"),
              zf + ".select_interval: 4503599627370496 epochs of steps_per_epoch 4096 overflow");
}

TEST(ZenFlowConfigTest, NullStepsPerEpochIsAbsentLikeEveryOtherKey) {
  absl::StatusOr<DeepSpeedConfig> c =
      ParseDeepSpeedConfig(Config(R"({"steps_per_epoch": null})"), 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero.zenflow.steps_per_epoch, 0);
}

TEST(ZenFlowConfigTest, PartialOffloadIsRefusedWithZenFlowToo) {
  // Regression: the ratio check lived in the trainer's offload setup, which ZenFlow skips, so
  // ratio 0.5 was silently ignored under ZenFlow (and accepted at submission without it).
  ExpectError(Config("{}", 2, R"({"device": "cpu", "ratio": 0.5})"),
              "deepspeed_config.zero_optimization.offload_optimizer.ratio: partial offload (0.5");
  ExpectError(Config("{}", 2, R"({"device": "cpu", "ratio": 0})"),
              "offload_optimizer.ratio: partial offload (0;");
  EXPECT_TRUE(ParseDeepSpeedConfig(Config("{}", 2, R"({"device": "cpu", "ratio": 1.0})"), 2).ok());
  // Out of [0, 1] is refused whatever the device (it was accepted with device "none").
  for (const char* off : {R"({"device": "none", "ratio": 7})", R"({"ratio": -3})",
                          R"({"device": "cpu", "ratio": 1.5})"}) {
    ExpectError(Config("{}", 2, off), "offload_optimizer.ratio: ");
  }
}

TEST(ZenFlowConfigTest, NeedsCpuOptimizerOffloadAndAZeroStage) {
  const std::string zf = "deepspeed_config.zero_optimization.zenflow";
  ExpectError(Config("{}", 2, R"({"device": "none"})"),
              zf + ": requires zero_optimization.offload_optimizer.device \"cpu\"");
  ExpectError(Config("{}", 3, R"({"device": "nvme", "nvme_path": "/tmp"})"),
              zf + ": requires zero_optimization.offload_optimizer.device \"cpu\" (got \"nvme\")");
  ExpectError(Config("{}", 0), zf + ": ZenFlow needs zero_optimization.stage 1, 2 or 3");
  ExpectError(Config("{}", 3, R"({"device": "cpu"}, "offload_param": {"device": "nvme",
                                  "nvme_path": "/tmp"})"),
              zf + ": ZenFlow with offload_param.device \"nvme\" is not supported yet");
}

TEST(ZenFlowConfigTest, OffloadNeedsOverlapComm) {
  const std::string zf = "deepspeed_config.zero_optimization.zenflow";
  ExpectError(Config(R"({"offload": true})", 2, R"({"device": "cpu"})",
                     R"(, "overlap_comm": false)"),
              zf + ".offload: requires zero_optimization.overlap_comm true");
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      Config(R"({"offload": true})", 2, R"({"device": "cpu"})", R"(, "overlap_comm": true)"), 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->zero.zenflow.offload);
}

TEST(ZenFlowConfigTest, StagesOneTwoThreeAreAccepted) {
  for (int stage : {1, 2, 3}) {
    absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
        Config(R"({"topk_ratio": 0.2, "select_strategy": "step", "select_interval": 10,
                   "update_interval": 3})",
               stage),
        2);
    EXPECT_TRUE(c.ok()) << "stage " << stage << ": " << c.status();
  }
}

}  // namespace
}  // namespace loom::spec
