// Issue 47, "One answer with every problem": a DeepSpeed config with mistakes in several
// sections is refused once, naming each (ParseDeepSpeedConfig, common/problems.h).
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/problems.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/ds_config.h"

namespace loom::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;

std::vector<std::string> Paths(const absl::Status& s) {
  std::vector<std::string> paths;
  for (const Problem& p : ProblemsOf(s)) paths.push_back(p.path);
  return paths;
}

TEST(DeepSpeedConfigProblemsTest, EveryUnknownKeyAndUnsupportedFeatureInOneAnswer) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(R"({
      "train_micro_batch_size_per_gpu": 2,
      "gradient_clippping": 1.0,
      "tensor_parallel": {"autotp_size": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "amsgrad": true, "maximize": true,
                                                "betas2": [0.9, 0.99]}},
      "zero_optimization": {"stage": 2, "overlapcomm": true, "zero_hpz_partition_size": 2,
                            "zero_quantized_weights": true},
      "fp16": {"enabled": true, "auto_cast": true},
      "sparse_gradients": true})", 2);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Paths(c.status()),
              ElementsAre("deepspeed_config.gradient_clippping",
                          "deepspeed_config.tensor_parallel",
                          "deepspeed_config.optimizer.params.betas2",
                          "deepspeed_config.optimizer.params.amsgrad",
                          "deepspeed_config.optimizer.params.maximize",
                          "deepspeed_config.zero_optimization.overlapcomm",
                          "deepspeed_config.zero_optimization.zero_hpz_partition_size",
                          "deepspeed_config.zero_optimization.zero_quantized_weights",
                          "deepspeed_config.fp16.auto_cast",
                          "deepspeed_config.sparse_gradients"));
  const std::string message(c.status().message());
  EXPECT_EQ(message.substr(0, message.find('\n')), "10 problems:");
  EXPECT_THAT(ProblemsOf(c.status()),
              ::testing::Contains(AllOf(
                  Field(&Problem::path, "deepspeed_config.zero_optimization.overlapcomm"),
                  Field(&Problem::what, "unknown key (did you mean overlap_comm?)"))));
}

TEST(DeepSpeedConfigProblemsTest, OneMistakeReadsAsBefore) {
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
          "zero_optimization": {"stage": 3, "foo": 1}})", 2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "deepspeed_config.zero_optimization.foo: unknown key");
}

TEST(DeepSpeedConfigProblemsTest, ChecksThatNeedAFailedSectionAreSkipped) {
  // sequence_parallel_size 3 does not divide 2 ranks: the batch, which counts world / P ranks,
  // is not checked (its "not divisible" would be a consequence, not a second mistake).
  absl::StatusOr<DeepSpeedConfig> c = ParseDeepSpeedConfig(
      R"({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW"}, "sequence_parallel_size": 3})", 2);
  EXPECT_THAT(Paths(c.status()), ElementsAre("deepspeed_config.sequence_parallel_size"));
}

}  // namespace
}  // namespace loom::spec
