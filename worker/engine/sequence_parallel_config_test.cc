// The trainer's side of Ulysses' preconditions (sequence_parallel_config.h, ds_config's
// sequence_parallel_size / seq_parallel_communication_data_type): every bad input is
// INVALID_ARGUMENT naming the field, through the same ParseJobSpecJson the trainer runs.
#include "spec/sequence_parallel_config.h"

#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/ds_config.h"
#include "worker/engine/engine_options.h"

namespace loom::engine {
namespace {

using ::loom::testing::StatusIs;

// 4 heads, 2 KV heads, 4 ranks, S = 32; HEADS, KV, SP, SEQ, DTYPE are replaced per case.
std::string Spec(int heads, int kv, int sp, int seq, const std::string& dtype = "fp32",
                 int hidden = 64, int max_pos = 64) {
  return std::string(R"({"name": "sp",
  "model": {"config": {"vocab_size": 256, "hidden_size": )") + std::to_string(hidden) +
         R"(, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": )" +
         std::to_string(heads) + R"(, "num_key_value_heads": )" + std::to_string(kv) +
         R"(, "max_position_embeddings": )" + std::to_string(max_pos) + R"(}},
  "dataset": {"name": "fortunes"},
  "deepspeed_config": {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                       "sequence_parallel_size": )" +
         std::to_string(sp) + R"(, "seq_parallel_communication_data_type": ")" + dtype + R"(",
                       "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                       "zero_optimization": {"stage": 3}},
  "resources": {"num_ranks": 4},
  "training": {"steps": 2, "sequence_length": )" +
         std::to_string(seq) + R"(}})";
}

TEST(SequenceParallelConfigTest, ValidSpecsParse) {
  absl::StatusOr<EngineOptions> o = ParseJobSpecJson(Spec(4, 2, 2, 32), 4);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ds.sequence_parallel_size, 2);
  EXPECT_FALSE(o->ds.seq_parallel_communication_bf16);
  // DeepSpeed's batch counts data-parallel ranks: 1 * 2 * (4 / 2).
  EXPECT_EQ(o->ds.train_batch_size, 4);
  o = ParseJobSpecJson(Spec(4, 2, 4, 32, "bf16"), 4);  // P > KV heads: replicated
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->ds.seq_parallel_communication_bf16);
  EXPECT_EQ(o->ds.train_batch_size, 2);
  o = ParseJobSpecJson(Spec(4, 2, 1, 31), 4);  // P = 1: no constraint on S
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ds.train_batch_size, 8);
}

TEST(SequenceParallelConfigTest, EveryPreconditionNamesItsField) {
  EXPECT_THAT(ParseJobSpecJson(Spec(4, 2, 3, 33), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.sequence_parallel_size: 3 does not divide the "
                                 "world size 4"));
  EXPECT_THAT(ParseJobSpecJson(Spec(4, 2, 0, 32), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.sequence_parallel_size: 0 must be >= 1"));
  // 2 heads on 4 ranks.
  EXPECT_THAT(ParseJobSpecJson(Spec(2, 2, 4, 32), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.config.num_attention_heads: 2 is not divisible by "
                                 "deepspeed_config.sequence_parallel_size 4"));
  // 6 heads, 3 KV heads, P = 2: 3 % 2 != 0 and 2 % 3 != 0 (hidden 48: head_dim 8).
  EXPECT_THAT(ParseJobSpecJson(Spec(6, 3, 2, 32, "fp32", 48), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.config.num_key_value_heads: 3"));
  EXPECT_THAT(ParseJobSpecJson(Spec(4, 2, 2, 31), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "training.sequence_length: 31 is not divisible by "
                                 "deepspeed_config.sequence_parallel_size 2"));
  EXPECT_THAT(ParseJobSpecJson(Spec(4, 2, 2, 32, "fp16"), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "deepspeed_config.seq_parallel_communication_data_type: \"fp16\""));
  // Longer than max_position_embeddings: both numbers named.
  EXPECT_THAT(ParseJobSpecJson(Spec(4, 2, 2, 128), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "training.sequence_length: 128 is not in [2, max_position_embeddings 64]"));
}

}  // namespace
}  // namespace loom::engine
