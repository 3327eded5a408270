#include "spec/model_config.h"
#include "spec/json_fields.h"
#include "spec/model_config_keys.h"

#include <nlohmann/json.hpp>

#include "common/problems.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::spec {
namespace {

using ::loom::testing::StatusIs;

constexpr char kTiny[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
  "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true
})";

TEST(ParseLlamaConfigTest, ParsesFieldsAndIgnoresOtherHfKeys) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kTiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 256);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim(), 16);
  EXPECT_EQ(c->max_position_embeddings, 128);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->initializer_range, 0.02);
}

TEST(ParseLlamaConfigTest, DefaultsKvHeadsAndAcceptsIntegralFloats) {
  // google.protobuf.Struct carries numbers as doubles; proto3 JSON may quote int64.
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(R"({"vocab_size": 300.0,
      "hidden_size": "32", "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 2, "max_position_embeddings": 16})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->hidden_size, 32);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
}

void ExpectError(const std::string& json, const std::string& needle) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(json);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument, needle)) << json;
}

TEST(ParseLlamaConfigTest, ErrorsNameTheField) {
  const std::string base = R"("vocab_size": 256, "intermediate_size": 64,
      "num_hidden_layers": 1, "max_position_embeddings": 16)";
  ExpectError("{" + base + R"(, "hidden_size": 48, "num_attention_heads": 6,
      "num_key_value_heads": 4})",
              "model.config.num_attention_heads: 6 is not divisible by num_key_value_heads 4");
  ExpectError("{" + base + R"(, "num_attention_heads": 2})",
              "model.config.hidden_size: required field is missing");
  ExpectError("{" + base + R"(, "hidden_size": 0, "num_attention_heads": 2})",
              "model.config.hidden_size: 0 must be positive");
  ExpectError("{" + base + R"(, "hidden_size": 30, "num_attention_heads": 4})",
              "model.config.hidden_size: 30 is not divisible by num_attention_heads 4");
  ExpectError("{" + base + R"(, "hidden_size": 30, "num_attention_heads": 2})",
              "must be even for rotary embeddings");
  ExpectError("{" + base + R"(, "hidden_size": 32, "num_attention_heads": 2,
      "num_key_value_heads": -1})",
              "model.config.num_key_value_heads: -1 must be positive");
  ExpectError("{" + base + R"(, "hidden_size": 32, "num_attention_heads": "two"})",
              "model.config.num_attention_heads: expected an integer");
  ExpectError("{" + base + R"(, "hidden_size": 32, "num_attention_heads": 2,
      "hidden_act": "gelu"})",
              "model.config.hidden_act");
  ExpectError("{" + base + R"(, "hidden_size": 32, "num_attention_heads": 2,
      "attention_dropout": 0.1})",
              "model.config.attention_dropout: 0.1 is not supported (dropout is not implemented");
  EXPECT_TRUE(ParseLlamaConfig("{" + base + R"(, "hidden_size": 32, "num_attention_heads": 2,
      "attention_dropout": 0.0})").ok());
  ExpectError("{" + base + R"(, "hidden_size": 32, "num_attention_heads": 2,
      "pad_token_id": 256})",
              "model.config.pad_token_id: 256 is not in [0, vocab_size 256)");
  absl::StatusOr<LlamaConfig> padded = ParseLlamaConfig("{" + base + R"(, "hidden_size": 32,
      "num_attention_heads": 2, "pad_token_id": 7})");
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(padded->pad_token_id, 7);
  EXPECT_EQ(nlohmann::json::parse(LlamaConfigToHfJson(*padded))["pad_token_id"], 7);
  EXPECT_EQ(ParseLlamaConfig(kTiny)->pad_token_id, -1);
  ExpectError("[1]", "model.config: not a JSON object");
}

// Only the model families the engine implements are trained; the error names the field and lists
// what is supported (a Qwen2 or GPT-2 config must not silently train as a Llama).
// transformers 5 layout (SmolLM2, Qwen2.5 saved by transformers 5): the RoPE base lives in
// rope_parameters; it was ignored and the model trained with the default base 10000.
TEST(ParseLlamaConfigTest, RopeParametersOfTransformers5AreRead) {
  const std::string base = R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 16, )";
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(
      base + R"("rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 100000.0);
  // Both layouts at once (transformers 4.5x writes both): equal values are one base.
  c = ParseLlamaConfig(base + R"("rope_theta": 1000000.0,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 1000000.0);
  ExpectError(base + R"("rope_theta": 10000.0, "rope_parameters": {"rope_theta": 500000.0}})",
              "model.config.rope_parameters.rope_theta: 500000 differs from rope_theta 10000");
  ExpectError(base + R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3",
      "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}})",
              "model.config.rope_parameters.low_freq_factor: required for rope_type \"llama3\"");
  ExpectError(base + R"("rope_parameters": {"full_attention": {"rope_theta": 1e6}}})",
              "model.config.rope_parameters: per-layer-type RoPE (\"full_attention\")");
  ExpectError(base + R"("rope_parameters": {"rope_theta": -1}})",
              "model.config.rope_parameters.rope_theta: must be positive");
  ExpectError(base + R"("rope_parameters": 5})",
              "model.config.rope_parameters: expected an object or null, got 5");
}

// Every scaling type transformers implements for Llama, in both layouts (values are checked
// against transformers itself in tests/python/hf_model_configs_test.py).
TEST(ParseLlamaConfigTest, RopeScalingInBothLayouts) {
  const std::string base = R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 64, )";
  // Llama 3.1 as shipped (transformers 4 layout).
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(base + R"("rope_theta": 500000.0,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 16, "rope_type": "llama3"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.rope_type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 16);
  EXPECT_TRUE(c->warnings.empty());
  // The same in the transformers 5 layout, and its export (transformers 4 layout) reads back.
  c = ParseLlamaConfig(base + R"("rope_parameters": {"rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
      "rope_type": "llama3"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  const nlohmann::json exported = nlohmann::json::parse(LlamaConfigToHfJson(*c));
  EXPECT_EQ(exported["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(exported["rope_scaling"]["low_freq_factor"], 1.0);
  EXPECT_EQ(exported["rope_theta"], 500000.0);
  absl::StatusOr<LlamaConfig> back = ParseLlamaConfig(exported.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rope_scaling.original_max_position_embeddings, 16);
  // "type" (the older key) and a yarn block.
  c = ParseLlamaConfig(base + R"("rope_scaling": {"type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 16, "finetuned": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.rope_type, RopeType::kYarn);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0],
            "model.config.rope_scaling.finetuned: not read for rope_type \"yarn\", ignored");
  // Errors name the field.
  ExpectError(base + R"("rope_scaling": {"rope_type": "linear"}})",
              "model.config.rope_scaling.factor: required for rope_type \"linear\"");
  ExpectError(base + R"("rope_scaling": {"rope_type": "dynamic", "factor": -2}})",
              "model.config.rope_scaling.factor: -2 must be positive");
  ExpectError(base + R"("rope_scaling": {"rope_type": "su", "factor": 2}})",
              "model.config.rope_scaling.rope_type: \"su\" is not supported (supported: "
              "default, linear, dynamic, yarn, longrope, llama3)");
  ExpectError(base + R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1],
      "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]}})",
              "model.config.rope_scaling.short_factor: has 2 entries, expected head_dim / 2 = 8");
  ExpectError(base + R"("rope_scaling": {"rope_type": "llama3", "factor": 8,
      "low_freq_factor": 4, "high_freq_factor": 1}})",
              "model.config.rope_scaling.high_freq_factor: 1 must be greater than "
              "low_freq_factor 4");
  ExpectError(base + R"("rope_scaling": {"rope_type": "linear", "factor": 2,
      "partial_rotary_factor": 0.5}})",
              "model.config.rope_scaling.partial_rotary_factor: 0.5 is not supported");
  ExpectError(base + R"("rope_scaling": {"rope_type": "linear", "factor": 2},
      "rope_parameters": {"rope_type": "linear", "factor": 4, "rope_theta": 10000.0}})",
              "model.config.rope_scaling.factor: 2 differs from rope_parameters.factor 4");
  ExpectError(base + R"("rope_theta": 2e5, "rope_scaling": {"rope_type": "linear",
      "factor": 2, "rope_theta": 1e4}})",
              "model.config.rope_scaling.rope_theta: 10000 differs from rope_theta 200000");
}

// Qwen3 (q_norm/k_norm, head_dim apart from hidden_size / heads), transformers 5's layer_types
// and dtype, and Mistral's sliding_window.
TEST(ParseLlamaConfigTest, Qwen3MistralAndTransformers5Keys) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(R"({"model_type": "qwen3",
      "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "vocab_size": 256,
      "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
      "max_position_embeddings": 64, "attention_bias": false, "use_sliding_window": false,
      "sliding_window": null, "max_window_layers": 2,
      "layer_types": ["full_attention", "full_attention"],
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kQwen3);
  EXPECT_EQ(c->head_dim(), 32);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->qkv_bias());
  EXPECT_TRUE(c->warnings.empty());
  const std::vector<ParamSpec> specs = LlamaParamSpecs(*c);
  // embed, per layer 11 (2 norms, q/k/v/o, q_norm, k_norm, 3 MLP), final norm, lm_head.
  ASSERT_EQ(specs.size(), 1u + 2 * 11 + 2);
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(specs[5].shape, (std::vector<int64_t>{64, 128}));  // o_proj
  EXPECT_EQ(specs[6].name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(specs[6].shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(specs[6].kind, ParamSpec::Kind::kNorm);
  EXPECT_EQ(specs[7].name, "model.layers.0.self_attn.k_norm.weight");
  int64_t sum = 0;
  for (const ParamSpec& s : specs) sum += s.numel();
  EXPECT_EQ(LlamaParamCount(*c), sum);
  EXPECT_EQ(sum, 2 * 256 * 64 + 64 +
                     2 * (2 * 64 + 128 * 64 * 2 + 64 * 64 * 2 + 3 * 96 * 64 + 2 * 32));
  const nlohmann::json j = nlohmann::json::parse(LlamaConfigToHfJson(*c));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(j["head_dim"], 32);
  absl::StatusOr<LlamaConfig> back = ParseLlamaConfig(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model_type, ModelType::kQwen3);
  EXPECT_EQ(back->head_dim(), 32);
  EXPECT_DOUBLE_EQ(back->rope_theta, 1000000.0);

  const std::string base = R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64, )";
  ExpectError(base + R"("model_type": "qwen3", "use_sliding_window": true})",
              "model.config.use_sliding_window: true is not supported");
  ExpectError(base + R"("layer_types": ["full_attention", "sliding_attention"]})",
              "model.config.layer_types[1]: \"sliding_attention\" is not supported");
  ExpectError(base + R"("layer_types": ["full_attention"]})",
              "model.config.layer_types: has 1 entries, num_hidden_layers 2");
  ExpectError(base + R"("head_dim": 7})", "model.config.head_dim: head_dim = 7 must be even");
  c = ParseLlamaConfig(base + R"("model_type": "mistral", "sliding_window": 4096})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kMistral);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(nlohmann::json::parse(LlamaConfigToHfJson(*c))["sliding_window"], 4096);
  c = ParseLlamaConfig(base + R"("model_type": "mistral", "sliding_window": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->sliding_window.has_value());
  ExpectError(base + R"("model_type": "mistral", "sliding_window": 0})",
              "model.config.sliding_window: 0 must be positive or null");
  c = ParseLlamaConfig(base + R"("model_type": "mistral", "sliding_window": 32})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(CheckModelConfigForSequenceLength(*c, 32).ok());
  EXPECT_THAT(CheckModelConfigForSequenceLength(*c, 33),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.config.sliding_window: 32 is shorter than "
                       "training.sequence_length 33"));
  // LongRoPE past original_max_position_embeddings under sequence parallelism: refused (shards
  // would pick different factors); within it, or on one shard, accepted.
  c = ParseLlamaConfig(base + R"("rope_scaling": {"rope_type": "longrope",
      "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [2, 2, 2, 2, 2, 2, 2, 2],
      "original_max_position_embeddings": 16}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(CheckModelConfigForSequenceLength(*c, 32, 1).ok());
  EXPECT_TRUE(CheckModelConfigForSequenceLength(*c, 16, 2).ok());
  EXPECT_THAT(CheckModelConfigForSequenceLength(*c, 32, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.config.rope_scaling.rope_type: \"longrope\" with sequence "
                       "parallelism (sequence_parallel_size 2) and training.sequence_length 32 > "
                       "original_max_position_embeddings 16 is not supported"));
}

// SmolLM2-135M's config.json as shipped (nanotron's converter adds is_llama_config and
// rope_interleaved, which transformers does not read): a Llama with base 100000.
TEST(ParseLlamaConfigTest, SmolLM2AsShippedIsALlama) {
  constexpr char kSmolLM2[] = R"({"architectures": ["LlamaForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0,
      "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
      "intermediate_size": 1536, "is_llama_config": true, "max_position_embeddings": 8192,
      "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
      "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
      "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
      "use_cache": true, "vocab_size": 49152})";
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kSmolLM2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kLlama);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_DOUBLE_EQ(c->rope_theta, 100000.0);
  EXPECT_EQ(c->rope_scaling.rope_type, RopeType::kDefault);
  EXPECT_TRUE(c->warnings.empty());
  std::string interleaved = kSmolLM2;
  interleaved.replace(interleaved.find("\"rope_interleaved\": false"), 25,
                      "\"rope_interleaved\": true ");
  EXPECT_THAT(ParseLlamaConfig(interleaved).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.config.rope_interleaved: true is not supported (interleaved "
                       "RoPE is not implemented"));
}

// Llama 3.x's config.json lists its end ids; the list was refused ("not an integer").
TEST(ParseLlamaConfigTest, ListValuedEosTokenIdOfLlama3IsKeptAndWrittenBack) {
  const std::string base = R"({"vocab_size": 128256, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 16, )";
  absl::StatusOr<LlamaConfig> c =
      ParseLlamaConfig(base + R"("bos_token_id": 128000,
                                 "eos_token_id": [128001, 128008, 128009]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_id, 128001);
  EXPECT_TRUE(c->eos_token_id_set);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  const nlohmann::json out = nlohmann::json::parse(LlamaConfigToHfJson(*c));
  EXPECT_EQ(out["eos_token_id"], nlohmann::json({128001, 128008, 128009}));
  ExpectError(base + R"("eos_token_id": []})", "model.config.eos_token_id: an empty list");
  ExpectError(base + R"("eos_token_id": [1, "x"]})",
              "model.config.eos_token_id[1]: \"x\" is not a token id");
}

TEST(ParseLlamaConfigTest, UnsupportedModelTypeIsRefusedNamingTheField) {
  const std::string base = R"("vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16)";
  ExpectError("{" + base + R"(, "model_type": "gpt2"})",
              "model.config.model_type: \"gpt2\" is not supported (supported: llama, qwen2, "
              "qwen3, mistral)");
  ExpectError("{" + base + R"(, "model_type": 7})",
              "model.config.model_type: 7 is not supported (supported: llama, qwen2, qwen3, "
              "mistral)");
  ExpectError("{" + base + R"(, "model_type": "Llama"})", "model.config.model_type");
  EXPECT_TRUE(ParseLlamaConfig("{" + base + R"(, "model_type": "llama"})").ok());
  EXPECT_TRUE(ParseLlamaConfig("{" + base + "}").ok());  // absent: llama
}

// Qwen2: model_type qwen2 selects the q/k/v biases; sliding-window attention is refused (the
// engine's mask is full causal), naming the field; use_sliding_window false is accepted.
TEST(ParseLlamaConfigTest, Qwen2IsParsedAndSlidingWindowIsRefused) {
  const std::string base = R"("vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16,
      "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"])";
  absl::StatusOr<LlamaConfig> c =
      ParseLlamaConfig("{" + base + R"(, "use_sliding_window": false, "sliding_window": 4096,
      "max_window_layers": 21, "rope_theta": 1000000.0, "tie_word_embeddings": true})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, ModelType::kQwen2);
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_DOUBLE_EQ(c->rope_theta, 1000000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  ExpectError("{" + base + R"(, "use_sliding_window": true})",
              "model.config.use_sliding_window: true is not supported");
  ExpectError("{" + base + R"(, "use_sliding_window": "yes"})", "model.config.use_sliding_window");
  absl::StatusOr<LlamaConfig> llama = ParseLlamaConfig(R"({"vocab_size": 256,
      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 2, "max_position_embeddings": 16})");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->model_type, ModelType::kLlama);
  EXPECT_FALSE(llama->qkv_bias());
}

TEST(LlamaConfigToHfJsonTest, Qwen2RoundTripsWithItsArchitecture) {
  LlamaConfig c = *ParseLlamaConfig(kTiny);
  c.model_type = ModelType::kQwen2;
  nlohmann::json j = nlohmann::json::parse(LlamaConfigToHfJson(c));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_FALSE(j.contains("attention_bias"));  // a Llama key; Qwen2's biases are implied
  absl::StatusOr<LlamaConfig> back = ParseLlamaConfig(j.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model_type, ModelType::kQwen2);
  EXPECT_EQ(LlamaParamCount(*back), LlamaParamCount(c));
  // Per layer q/k/v biases [64] + [32] + [32] on top of the Llama count.
  LlamaConfig llama = c;
  llama.model_type = ModelType::kLlama;
  EXPECT_EQ(LlamaParamCount(c), LlamaParamCount(llama) + 2 * (64 + 32 + 32));
}

// Regression: vocab_size 1e15, 1e9 layers or hidden_size 2^40 were accepted; the trainer then
// failed to allocate (or enumerated 9e9 tensor specs), and the parameter count overflowed int64.
TEST(ParseLlamaConfigTest, AbsurdModelSizesAreRefused) {
  const std::string tail = R"(, "num_attention_heads": 2, "max_position_embeddings": 16})";
  ExpectError(R"({"vocab_size": 1000000000000000, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1)" + tail,
              "model.config.vocab_size: 1000000000000000 is larger than 1099511627776");
  ExpectError(R"({"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1000000000)" + tail,
              "model.config: the model would have more than 1099511627776 parameters");
  ExpectError(R"({"vocab_size": 256, "hidden_size": 1099511627776, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 1048576, "max_position_embeddings": 16})",
              "model.config: the model would have more than");
  ExpectError(R"({"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 2,
      "max_position_embeddings": 1000000000000000})",
              "model.config.max_position_embeddings: 1000000000000000 is larger than");
  ExpectError(R"({"vocab_size": 256, "hidden_size": 32,
      "intermediate_size": 9223372036854775807, "num_hidden_layers": 9223372036854775807)" + tail,
              "model.config.intermediate_size: 9223372036854775807 is larger than 1099511627776");
  // A large but sane model (Llama-2-70B shapes) is still accepted.
  absl::StatusOr<LlamaConfig> big = ParseLlamaConfig(R"({"vocab_size": 32000,
      "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
      "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 4096})");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(LlamaParamCount(*big), 68976648192);
}

TEST(LlamaConfigToHfJsonTest, RoundTripsAndWritesHfKeys) {
  LlamaConfig c = *ParseLlamaConfig(kTiny);
  std::string text = LlamaConfigToHfJson(c);
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  absl::StatusOr<LlamaConfig> back = ParseLlamaConfig(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->vocab_size, c.vocab_size);
  EXPECT_EQ(back->num_key_value_heads, c.num_key_value_heads);
  EXPECT_DOUBLE_EQ(back->rope_theta, c.rope_theta);
  EXPECT_EQ(back->tie_word_embeddings, c.tie_word_embeddings);
}

// Issue 42 defect 8: typos inside model.config were accepted silently and the defaults used.
// Issue 47: every key is used, known not to matter, or refused; all unknown keys in one answer.
TEST(ParseLlamaConfigTest, UnknownKeysAreRefusedNamingTheNearestKnownOne) {
  std::string text = kTiny;
  text.pop_back();  // the closing brace
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(
      text + R"(, "rms_norm_epsilon": 1e-5, "num_key_value_head": 1, "zzz_custom": 3,
                "qkv_bias": true})");
  EXPECT_THAT(c.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "4 problems:\n"
                       "  model.config.num_key_value_head: unknown key (did you mean "
                       "num_key_value_heads?)\n"
                       "  model.config.qkv_bias: unknown key (neither read by Loom nor one that "
                       "transformers writes for llama, qwen2, qwen3 or mistral; remove it)\n"
                       "  model.config.rms_norm_epsilon: unknown key (did you mean "
                       "rms_norm_eps?)\n"
                       "  model.config.zzz_custom: unknown key (neither read by Loom nor one "
                       "that transformers writes for llama, qwen2, qwen3 or mistral; remove it)"));
  // One problem per key in the status payload (the scheduler merges them with its own).
  std::vector<Problem> problems = ProblemsOf(c.status());
  ASSERT_EQ(problems.size(), 4u);
  EXPECT_EQ(problems[2].path, "model.config.rms_norm_epsilon");
  // A misspelt required key is named as a misspelling, not as a missing key.
  EXPECT_THAT(ParseLlamaConfig(R"({"vocab_sise": 256})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.config.vocab_sise: unknown key (did you mean vocab_size?)"));
  // kTiny (architectures, torch_dtype, ...) and every key transformers 5.25 writes for
  // LlamaConfig and Qwen2Config (to_json_string(use_diff=False)) give none
  // (tests/python/hf_model_configs_test.py checks Qwen3Config and MistralConfig too).
  EXPECT_TRUE(ParseLlamaConfig(kTiny)->warnings.empty());
  for (const char* key :
       {"_name_or_path", "architectures", "attention_bias", "attention_dropout", "bos_token_id",
        "chunk_size_feed_forward", "dtype", "eos_token_id", "head_dim", "hidden_act",
        "hidden_size", "id2label", "initializer_range", "intermediate_size",
        "is_encoder_decoder", "label2id", "layer_types", "max_position_embeddings",
        "max_window_layers", "mlp_bias", "model_type", "num_attention_heads", "num_hidden_layers",
        "num_key_value_heads", "output_attentions", "output_hidden_states", "pad_token_id",
        "pretraining_tp", "problem_type", "return_dict", "rms_norm_eps", "rope_parameters",
        "sliding_window", "tie_word_embeddings", "transformers_version", "use_cache",
        "use_sliding_window", "vocab_size", "torch_dtype", "rope_theta", "rope_scaling"}) {
    EXPECT_TRUE(UnknownModelConfigKeys(nlohmann::json{{key, nullptr}}).empty()) << key;
  }
  // A control character in a key is shown escaped.
  const std::vector<Problem> escaped = UnknownModelConfigKeys(nlohmann::json{{"a\nb", 1}});
  ASSERT_EQ(escaped.size(), 1u);
  EXPECT_EQ(escaped[0].path, "model.config.a\\nb");
  EXPECT_EQ(json_fields::EditDistance("rms_norm_epsilon", "rms_norm_eps"), 4);
  EXPECT_EQ(json_fields::EditDistance("", "abc"), 3);
  EXPECT_EQ(json_fields::EditDistance("kitten", "sitting"), 3);
}

// Issue 42 defect 8: a Qwen2 export of a config without token ids gained bos_token_id 1 and
// eos_token_id 2 (Llama's defaults; transformers' Qwen2Config has none).
TEST(LlamaConfigToHfJsonTest, TokenIdsAreWrittenOnlyWhenTheConfigGaveThem) {
  LlamaConfig c = *ParseLlamaConfig(kTiny);
  c.model_type = ModelType::kQwen2;
  nlohmann::json j = nlohmann::json::parse(LlamaConfigToHfJson(c));
  EXPECT_FALSE(j.contains("bos_token_id")) << j.dump();
  EXPECT_FALSE(j.contains("eos_token_id")) << j.dump();
  std::string text = kTiny;
  text.pop_back();
  c = *ParseLlamaConfig(text + R"(, "bos_token_id": 7, "eos_token_id": 0})");
  j = nlohmann::json::parse(LlamaConfigToHfJson(c));
  EXPECT_EQ(j["bos_token_id"], 7);
  EXPECT_EQ(j["eos_token_id"], 0);
}

TEST(LlamaParamSpecsTest, NamesShapesAndCounts) {
  LlamaConfig c = *ParseLlamaConfig(kTiny);  // V=256 H=64 I=128 L=2 Hq=4 Hkv=2 d=16
  std::vector<ParamSpec> specs = LlamaParamSpecs(c);
  ASSERT_EQ(specs.size(), 1u + 2u * 9u + 1u);  // tied: no lm_head
  EXPECT_EQ(specs[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(specs[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(specs[3].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(specs[4].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(specs[5].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(specs[6].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(specs[7].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(specs[7].shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(specs[9].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(specs[9].shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(specs[10].name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(specs.back().name, "model.norm.weight");
  // Per layer: 2*64 norms + 64*64 + 2*32*64 + 64*64 + 3*64*128 = 36992.
  EXPECT_EQ(LlamaParamCount(c), 256 * 64 + 2 * 36992 + 64);

  c.tie_word_embeddings = false;
  specs = LlamaParamSpecs(c);
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_EQ(specs.back().shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(LlamaParamCount(c), 2 * 256 * 64 + 2 * 36992 + 64);
}

}  // namespace
}  // namespace loom::spec
