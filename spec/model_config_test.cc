#include "spec/model_config.h"
#include "spec/json_fields.h"
#include "spec/model_config_keys.h"

#include <nlohmann/json.hpp>

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
      "factor": 8.0}})",
              "model.config.rope_parameters.factor: RoPE scaling parameters are not supported");
  ExpectError(base + R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3"}})",
              "model.config.rope_parameters.rope_type: \"llama3\" is not supported yet");
  ExpectError(base + R"("rope_parameters": {"full_attention": {"rope_theta": 1e6}}})",
              "model.config.rope_parameters: per-layer-type RoPE (\"full_attention\")");
  ExpectError(base + R"("rope_parameters": {"rope_theta": -1}})",
              "model.config.rope_parameters.rope_theta: must be positive");
  ExpectError(base + R"("rope_parameters": 5})", "model.config.rope_parameters: must be an object");
}

// Llama 3.x's config.json lists its end ids; the list was refused ("not an integer").
TEST(ParseLlamaConfigTest, ListValuedEosTokenIdOfLlama3IsKeptAndWrittenBack) {
  const std::string base = R"({"vocab_size": 128256, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 16, )";
  absl::StatusOr<LlamaConfig> c =
      ParseLlamaConfig(base + R"("bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
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
              "model.config.model_type: \"gpt2\" is not supported (supported: llama, qwen2)");
  ExpectError("{" + base + R"(, "model_type": 7})",
              "model.config.model_type: 7 is not supported (supported: llama, qwen2)");
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
TEST(ParseLlamaConfigTest, UnknownKeysWarnNamingTheNearestKnownOne) {
  std::string text = kTiny;
  text.pop_back();  // the closing brace
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(
      text + R"(, "rms_norm_epsilon": 1e-5, "num_key_value_head": 1, "zzz_custom": 3,
                "qkv_bias": true})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->warnings,
            (std::vector<std::string>{
                "model.config.num_key_value_head: unknown key, ignored (did you mean "
                "num_key_value_heads?)",
                "model.config.qkv_bias: unknown key, ignored",
                "model.config.rms_norm_epsilon: unknown key, ignored (did you mean rms_norm_eps?)",
                "model.config.zzz_custom: unknown key, ignored"}));
  // kTiny (architectures, torch_dtype, ...) and every key transformers 5.25 writes for
  // LlamaConfig and Qwen2Config (to_json_string(use_diff=False)) give none.
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
    EXPECT_TRUE(UnknownModelConfigKeyWarnings(nlohmann::json{{key, nullptr}}).empty()) << key;
  }
  // A control character in a key is shown escaped.
  EXPECT_EQ(UnknownModelConfigKeyWarnings(nlohmann::json{{"a\nb", 1}}),
            std::vector<std::string>{"model.config.a\\nb: unknown key, ignored"});
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
