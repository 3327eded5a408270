// ZeRO per-rank model-state formulas (zero_memory.h) against references that share nothing with
// the code: the figures printed in the ZeRO paper (Rajbhandari et al., SC'20, Figure 1: Ψ =
// 7.5B, N = 64), per-rank byte counts worked out by hand for a three-tensor model, and, for a
// real Llama config, Ψ counted by hand from its shapes with the Ψ/N formulas of
// worker/trainer:zero_stages_test (which measures them on a Gloo gang) and DeepSpeed's
// estimate_zero3_model_states_mem_needs GPU term (18Ψ/N for bf16 stage 3).
#include "spec/zero_memory.h"

#include <cstdint>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/ds_config.h"
#include "spec/model_config.h"

namespace loom::spec {
namespace {

using ::loom::testing::StatusIs;

TEST(PaperZeroModelStateBytesTest, MatchesFigureOneOfTheZeroPaper) {
  // Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (GB = 1e9 bytes, printed to 3 digits).
  const double figure[] = {120e9, 31.4e9, 16.6e9, 1.9e9};
  for (int stage = 0; stage <= 3; ++stage) {
    absl::StatusOr<double> b = PaperZeroModelStateBytes(7.5e9, stage, 64);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NEAR(*b, figure[stage], 0.05e9) << "stage " << stage;
  }
}

// Tensors of 10, 7 and 3 elements on N = 4 ranks: Ψ = 20; partitions ceil(n/4) = 3, 2, 1, so
// P = 6. By hand, fp32 (d = 4):
//   stage 0: params 4*20 = 80, grads 4*20 = 80, optimizer 8*20 = 160
//   stage 1: params 80, grads 4*4*6 + 4*6 = 120, optimizer 12*6 = 72
//   stage 2: params 80, grads 4*6 = 24, optimizer 72
//   stage 3 (threshold 5: the 3-element tensor is persistent, 4*4*1 = 16 bytes gathered):
//            params 4*6 + 16 = 40, grads 24, optimizer 8*6 = 48
TEST(ZeroModelStateBytesTest, Fp32LayoutsByHand) {
  const std::vector<int64_t> numels = {10, 7, 3};
  const int64_t want[4][3] = {{80, 80, 160}, {80, 120, 72}, {80, 24, 72}, {40, 24, 48}};
  for (int stage = 0; stage <= 3; ++stage) {
    absl::StatusOr<ModelStateBytes> b = ZeroModelStateBytes(numels, stage, 4, 4, 5);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->params, want[stage][0]) << "stage " << stage;
    EXPECT_EQ(b->grads, want[stage][1]) << "stage " << stage;
    EXPECT_EQ(b->optimizer_states, want[stage][2]) << "stage " << stage;
  }
}

// bf16 (d = 2), same tensors: the fp32 master is a separate tensor at every stage.
//   stage 0: params 2*20 = 40, grads 80, optimizer 8*20 + 4*20 = 240
//   stage 2: params 40, grads 24, optimizer 72
//   stage 3: params 2*6 + 2*4*1 = 20, grads 24, optimizer 8*6 + 4*6 = 72
TEST(ZeroModelStateBytesTest, Bf16LayoutsByHand) {
  const std::vector<int64_t> numels = {10, 7, 3};
  absl::StatusOr<ModelStateBytes> s0 = ZeroModelStateBytes(numels, 0, 4, 2, 5);
  absl::StatusOr<ModelStateBytes> s2 = ZeroModelStateBytes(numels, 2, 4, 2, 5);
  absl::StatusOr<ModelStateBytes> s3 = ZeroModelStateBytes(numels, 3, 4, 2, 5);
  ASSERT_TRUE(s0.ok() && s2.ok() && s3.ok());
  EXPECT_EQ(s0->total(), 40 + 80 + 240);
  EXPECT_EQ(s2->total(), 40 + 24 + 72);
  EXPECT_EQ(s3->params, 20);
  EXPECT_EQ(s3->grads, 24);
  EXPECT_EQ(s3->optimizer_states, 72);
}

// vocab 256, H 64, I 128, 2 layers, 4 heads of 16, 2 KV heads, untied. Every tensor's numel is
// even, so on N = 2 ranks there is no padding and P = Ψ/2. By hand:
//   embed 256*64 = 16384; per layer: norms 2*64 = 128, q 64*64 = 4096, k and v 32*64 = 2048
//   each, o 4096, gate/up/down 3*128*64 = 24576: 36992; final norm 64; lm_head 16384.
//   Ψ = 16384 + 2*36992 + 64 + 16384 = 106816.
TEST(ZeroModelStateBytesTest, LlamaJobMatchesThePsiOverNFormulas) {
  constexpr int64_t kPsi = 106816;
  absl::StatusOr<LlamaConfig> model = ParseLlamaConfig(R"({"vocab_size": 256,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64})");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<DeepSpeedConfig> stage2 = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
          "zero_optimization": {"stage": 2}})",
      2);
  ASSERT_TRUE(stage2.ok()) << stage2.status();
  absl::StatusOr<ModelStateBytes> b2 = ZeroModelStateBytes(*model, *stage2, 2);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->total(), 4 * kPsi + 16 * kPsi / 2);  // 4Ψ + 16Ψ/N

  absl::StatusOr<DeepSpeedConfig> bf16_stage3 = ParseDeepSpeedConfig(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "bf16": {"enabled": true},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})",
      2);
  ASSERT_TRUE(bf16_stage3.ok()) << bf16_stage3.status();
  absl::StatusOr<ModelStateBytes> b3 = ZeroModelStateBytes(*model, *bf16_stage3, 2);
  ASSERT_TRUE(b3.ok()) << b3.status();
  EXPECT_EQ(b3->total(), 18 * kPsi / 2);  // DeepSpeed's 18Ψ/N GPU term
}

TEST(ZeroModelStateBytesTest, BadArgumentsNameTheArgument) {
  EXPECT_THAT(ZeroModelStateBytes({4}, 4, 2, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "stage"));
  EXPECT_THAT(ZeroModelStateBytes({4}, 1, 0, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "world_size"));
  EXPECT_THAT(ZeroModelStateBytes({4}, 1, 2, 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "param_dtype_bytes"));
  EXPECT_THAT(ZeroModelStateBytes({4, -1}, 1, 2, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "param_numels[1]"));
  EXPECT_THAT(PaperZeroModelStateBytes(-1, 0, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "psi"));
}

}  // namespace
}  // namespace loom::spec
