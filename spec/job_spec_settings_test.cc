// spec/job_spec_settings.h: the settings `technique: auto` writes land where the job document
// puts those keys, bad settings are refused naming themselves with the spec untouched, and, for
// each technique the chooser can pick, the spec with its settings applied plans (through the
// trainer's own parsers, MemoryPlanInputFromJobSpec) to exactly the plan the choice was made on.
#include "spec/job_spec_settings.h"

#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "spec/memory_plan.h"
#include "spec/technique_choice.h"

namespace loom::spec {
namespace {

using ::loom::testing::IsOk;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

loom::v1::JobSpec FromJson(const std::string& text) {
  loom::v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &spec).ok()) << text;
  return spec;
}

// A job as a user who has not chosen a technique writes it: ZeRO stage 0, no checkpointing.
loom::v1::JobSpec Job(const std::string& model_config, int ranks, const std::string& accelerator,
                      int per_node, int sequence, bool bf16) {
  return FromJson(absl::StrCat(R"({"name": "t", "technique": "auto", "model": {"config": )",
                               model_config, R"(}, "dataset": {"name": "fortunes"},
      "deepspeed_config": {"train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": )", bf16 ? "true" : "false", R"(},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e8}},
      "resources": {"num_ranks": )", ranks, R"(, "accelerator": ")", accelerator,
                               R"(", "accelerators_per_node": )", per_node, R"(},
      "training": {"sequence_length": )", sequence, R"(, "steps": "10"}})"));
}

constexpr char kLlama3_70B[] = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072})";
constexpr char kLlama3_8B[] = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 262144})";
constexpr char kQwen3_14B[] = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 5120,
    "intermediate_size": 17408, "num_hidden_layers": 40, "num_attention_heads": 40,
    "num_key_value_heads": 8, "vocab_size": 151936, "max_position_embeddings": 40960})";
constexpr char kSmall[] = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 384,
    "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 6,
    "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 1024})";

TEST(JobSpecSettingsTest, WritesTheKeysWhereTheJobDocumentPutsThem) {
  loom::v1::JobSpec spec = Job(kSmall, 2, "ACCELERATOR_KIND_CPU", 0, 256, false);
  ASSERT_THAT(ApplyJobSpecSettings(
      {"deepspeed_config.zero_optimization.stage: 3",
       "deepspeed_config.zero_optimization.offload_optimizer: {device: cpu, super_offload: true}",
       "deepspeed_config.activation_checkpointing: {}", "deepspeed_config.sequence_parallel_size: 2",
       "training.tiled_mlp_compute: true"},
      &spec), IsOk());
  const auto& ds = spec.deepspeed_config().fields();
  const auto& zero = ds.at("zero_optimization").struct_value().fields();
  EXPECT_EQ(zero.at("stage").number_value(), 3);
  EXPECT_EQ(zero.at("reduce_bucket_size").number_value(), 5e8);  // the rest is kept
  const auto& offload = zero.at("offload_optimizer").struct_value().fields();
  EXPECT_EQ(offload.at("device").string_value(), "cpu");
  EXPECT_TRUE(offload.at("super_offload").bool_value());
  EXPECT_EQ(ds.at("activation_checkpointing").struct_value().fields_size(), 0);
  EXPECT_EQ(ds.at("sequence_parallel_size").number_value(), 2);
  EXPECT_TRUE(spec.training().tiled_mlp_compute());
  EXPECT_EQ(spec.training().steps(), 10);  // int64 fields survive the JSON round trip
  EXPECT_EQ(spec.technique(), "auto");
}

TEST(JobSpecSettingsTest, RefusesABadSettingNamingItAndLeavesTheSpecAlone) {
  const loom::v1::JobSpec before = Job(kSmall, 2, "ACCELERATOR_KIND_CPU", 0, 256, false);
  for (const std::string& bad :
       {std::string("deepspeed_config.zero_optimization.stage 3"),  // no ": "
        std::string("training.tiled_mlp_computation: true"),       // not a TrainingSpec field
        std::string("name.first: x"),                              // name is a string
        std::string("training.sequence_length: [1, 2]"),           // wrong type
        std::string("deepspeed_config.bf16: {enabled: [}")}) {     // not YAML
    loom::v1::JobSpec spec = before;
    absl::Status s = ApplyJobSpecSettings({"training.tiled_mlp_compute: true", bad}, &spec);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bad.substr(0, bad.find(':'))));
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, before)) << bad;
  }
}

struct Case {
  std::string name;
  loom::v1::JobSpec spec;
  NodeShape nodes;
  Technique want;
};

// For each technique the chooser picks, the applied spec plans as the choice did: the settings
// say exactly what the planner assumed.
TEST(JobSpecSettingsTest, EachChoiceAppliedPlansAsTheChoiceWasMade) {
  const std::vector<Case> cases = {
      {"70B on an 8 x H200 node with 4 TiB host: ZenFlow",
       Job(kLlama3_70B, 8, "ACCELERATOR_KIND_H200", 8, 4096, true),
       {loom::v1::ACCELERATOR_KIND_H200, 8, 4096 * kGiB, 141 * kGiB, 1},
       Technique::kZero3ZenFlow},
      {"8B at 256K tokens on an HGX H100: ALST",
       Job(kLlama3_8B, 8, "ACCELERATOR_KIND_H100", 8, 262144, true),
       {loom::v1::ACCELERATOR_KIND_H100, 8, 2048 * kGiB, 80 * kGiB, 1},
       Technique::kAlst},
      {"Qwen3-14B on one GH200: SuperOffload",
       Job(kQwen3_14B, 1, "ACCELERATOR_KIND_GH200", 1, 4096, true),
       {loom::v1::ACCELERATOR_KIND_GH200, 1, 480 * kGiB, 96 * kGiB, 1},
       Technique::kSuperOffload},
      {"the small model on two 1 GiB CPU workers: ZeRO-2",
       Job(kSmall, 2, "ACCELERATOR_KIND_CPU", 0, 256, false),
       {loom::v1::ACCELERATOR_KIND_CPU, 1, 1 * kGiB, 0, 2},
       Technique::kZero2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<MemoryPlanInput> in = MemoryPlanInputFromJobSpec(c.spec);
    ASSERT_THAT(in, IsOk());
    absl::StatusOr<TechniqueChoice> made = ChooseTechnique(
        *in, c.nodes.kind, c.spec.resources().accelerators_per_node(), {c.nodes});
    ASSERT_THAT(made, IsOk());
    const TechniqueChoice& choice = *made;
    EXPECT_EQ(choice.technique, c.want) << TechniqueName(choice.technique) << ": " << choice.why;
    loom::v1::JobSpec applied = c.spec;
    ASSERT_THAT(ApplyJobSpecSettings(choice.settings, &applied), IsOk());
    absl::StatusOr<MemoryPlanInput> applied_in = MemoryPlanInputFromJobSpec(applied);
    ASSERT_THAT(applied_in, IsOk());
    absl::StatusOr<RankMemoryPlan> applied_plan = PlanRankMemory(*applied_in);
    ASSERT_THAT(applied_plan, IsOk());
    const RankMemoryPlan& plan = *applied_plan;
    EXPECT_EQ(plan.host_bytes(), choice.plan.host_bytes());
    EXPECT_EQ(plan.device_bytes(), choice.plan.device_bytes());
    EXPECT_EQ(plan.tracked_bytes(), choice.plan.tracked_bytes());
  }
}

}  // namespace
}  // namespace loom::spec
