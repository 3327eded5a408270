// The "which technique when" table of issue 48, row by row: ZeRO-2 for 7-13B models that fit,
// ZeRO-3 + ZenFlow for a 70B model on one node (plain offload where ZenFlow's host buffers do not
// fit), ALST for sequences of hundreds of thousands of
// tokens, SuperOffload on a GH200 superchip; and what a CPU cluster gets. The models are the
// published shapes (config.json of each); the nodes are an HGX H100 (8 x 80 GiB, 2 TiB host),
// an 8 x H200 with 4 TiB host, a GH200 superchip (96 GiB HBM3, 480 GiB LPDDR5X) and the development machine's 24 GiB workers.
#include "spec/technique_choice.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/llama_shape_for_tests.h"

namespace loom::spec {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

const LlamaConfig kLlama2_7B = LlamaShape(4096, 11008, 32, 32, 32, 32000);
const LlamaConfig kLlama2_13B = LlamaShape(5120, 13824, 40, 40, 40, 32000);
const LlamaConfig kLlama3_8B = LlamaShape(4096, 14336, 32, 32, 8, 128256);
const LlamaConfig kLlama3_70B = LlamaShape(8192, 28672, 80, 64, 8, 128256);
const LlamaConfig kQwen3_14B = LlamaShape(5120, 17408, 40, 40, 8, 151936);
const LlamaConfig kTiny = LlamaShape(64, 176, 2, 4, 2, 256);

MemoryPlanInput Job(const LlamaConfig& model, int ranks, int64_t sequence, bool cpu) {
  MemoryPlanInput in;
  in.model = model;
  in.world_size = ranks;
  in.sequence_length = sequence;
  in.ds.train_micro_batch_size_per_gpu = 1;
  in.ds.bf16_enabled = !cpu;
  in.ds.zero.stage = 0;  // as a user who has not chosen yet would write it
  in.cpu_rank = cpu;
  return in;
}

NodeShape Node(loom::v1::AcceleratorKind kind, int slots, int64_t host, int64_t accelerator,
               int count = 1) {
  return NodeShape{kind, slots, host, accelerator, count};
}

const NodeShape kHgxH100 = Node(loom::v1::ACCELERATOR_KIND_H100, 8, 2048 * kGiB, 80 * kGiB);
// An 8 x H200 server with 4 TiB of host memory (a configuration HGX H200 vendors sell).
const NodeShape kHgxH200Big = Node(loom::v1::ACCELERATOR_KIND_H200, 8, 4096 * kGiB, 141 * kGiB);
const NodeShape kGh200 = Node(loom::v1::ACCELERATOR_KIND_GH200, 1, 480 * kGiB, 96 * kGiB);
const NodeShape kDevWorkers = Node(loom::v1::ACCELERATOR_KIND_CPU, 1, 24 * kGiB, 0, 2);

struct Row {
  std::string name;
  MemoryPlanInput in;
  NodeShape nodes;
  Technique want;
};

TEST(TechniqueChoiceTest, TheWhichTechniqueWhenTable) {
  const std::vector<Row> table = {
      {"Llama-2-7B, 8 x H100, 4K", Job(kLlama2_7B, 8, 4096, false), kHgxH100, Technique::kZero2},
      {"Llama-2-13B, 8 x H100, 2K", Job(kLlama2_13B, 8, 2048, false), kHgxH100,
       Technique::kZero2},
      {"Llama-3-70B, one 8 x H200 node with 4 TiB host, 2K", Job(kLlama3_70B, 8, 2048, false),
       kHgxH200Big, Technique::kZero3ZenFlow},
      // Loom's ZenFlow keeps 12 bytes a parameter of host buffers besides Adam's 12 and the
      // offloaded gradients' 4: 1.84 TiB for 70B, over a 2 TiB node with the margin.
      {"Llama-3-70B, one 8 x H100 node with 2 TiB host, 2K", Job(kLlama3_70B, 8, 2048, false),
       kHgxH100, Technique::kZero3Offload},
      {"Llama-3-8B, 8 x H100, 256K tokens", Job(kLlama3_8B, 8, 262144, false), kHgxH100,
       Technique::kAlst},
      {"Qwen3-14B, one GH200, 4K", Job(kQwen3_14B, 1, 4096, false), kGh200,
       Technique::kSuperOffload},
      {"tiny Llama, two CPU workers", Job(kTiny, 2, 64, true), kDevWorkers, Technique::kZero2},
      {"Llama-3-70B, two 24 GiB CPU workers", Job(kLlama3_70B, 2, 1024, true), kDevWorkers,
       Technique::kNoneFits},
  };
  for (const Row& row : table) {
    absl::StatusOr<TechniqueChoice> c =
        ChooseTechnique(row.in, row.nodes.kind, 0, {row.nodes});
    ASSERT_TRUE(c.ok()) << row.name << ": " << c.status();
    EXPECT_EQ(TechniqueName(c->technique), std::string(TechniqueName(row.want)))
        << row.name << ": " << c->why;
    if (c->technique == Technique::kNoneFits) {
      EXPECT_TRUE(c->settings.empty()) << row.name;
      continue;
    }
    // What it chose fits, re-planned from the settings' input.
    absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(c->input);
    ASSERT_TRUE(plan.ok()) << row.name;
    EXPECT_TRUE(FitOnNodes(*plan, c->input.world_size, row.nodes.kind, 0, {row.nodes}).fits)
        << row.name;
  }
}

TEST(TechniqueChoiceTest, AnswersNameTheKeysToSet) {
  absl::StatusOr<TechniqueChoice> alst =
      ChooseTechnique(Job(kLlama3_8B, 8, 262144, false), kHgxH100.kind, 0, {kHgxH100});
  ASSERT_TRUE(alst.ok());
  EXPECT_THAT(alst->settings, Contains("deepspeed_config.sequence_parallel_size: 8"));
  EXPECT_THAT(alst->settings, Contains("training.tiled_mlp_compute: true"));
  EXPECT_EQ(alst->input.ds.sequence_parallel_size, 8);

  absl::StatusOr<TechniqueChoice> zenflow =
      ChooseTechnique(Job(kLlama3_70B, 8, 2048, false), kHgxH200Big.kind, 0, {kHgxH200Big});
  ASSERT_TRUE(zenflow.ok());
  EXPECT_THAT(zenflow->settings,
              Contains("deepspeed_config.zero_optimization.offload_optimizer: {device: cpu}"));
  EXPECT_TRUE(zenflow->input.ds.zero.zenflow.enabled);

  absl::StatusOr<TechniqueChoice> none =
      ChooseTechnique(Job(kLlama3_70B, 2, 1024, true), kDevWorkers.kind, 0, {kDevWorkers});
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(none->why, HasSubstr("no technique fits these nodes"));
}

}  // namespace
}  // namespace loom::spec
