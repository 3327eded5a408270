#include "spec/model_config_keys.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "spec/json_fields.h"

namespace loom::spec {
namespace {

// Read or refused by ParseLlamaConfigValue: the keys a near miss is matched against.
constexpr const char* kLoomKeys[] = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
    "rope_theta", "rope_parameters", "rope_scaling", "tie_word_embeddings", "initializer_range",
    "bos_token_id", "eos_token_id", "use_sliding_window", "sliding_window", "max_window_layers",
    "attention_bias", "mlp_bias", "hidden_act", "head_dim", "layer_types",
    "original_max_position_embeddings", "rope_interleaved", "attention_dropout", "pad_token_id",
};

// What transformers 4.x/5.x write for Llama, Qwen2, Qwen3 and Mistral (PretrainedConfig's
// attributes included) without changing the decoder Loom builds. A typo of one of these changes
// nothing here.
constexpr const char* kOtherHfKeys[] = {
    "architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "name_or_path", "use_cache", "sep_token_id", "decoder_start_token_id",
    "pretraining_tp", "output_attentions",
    "output_hidden_states", "return_dict", "id2label", "label2id", "num_labels", "problem_type",
    "tokenizer_class", "prefix", "task_specific_params", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "chunk_size_feed_forward", "cross_attention_hidden_size",
    "finetuning_task", "tie_encoder_decoder", "pruned_heads", "torchscript", "use_mrope",
    "bad_words_ids", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "tf_legacy_loss", "use_bfloat16", "quantization_config",
    "_attn_implementation_autoset", "attn_implementation",
    // SmolLM2's config.json (written by nanotron's converter); transformers reads neither.
    // rope_interleaved true is refused by ParseLlamaConfigValue.
    "is_llama_config",
};

}  // namespace

std::vector<Problem> UnknownModelConfigKeys(const nlohmann::json& config) {
  std::vector<Problem> problems;
  if (!config.is_object()) return problems;
  auto known = [](const std::string& key) {
    auto in = [&](const auto& list) {
      return std::find(std::begin(list), std::end(list), key) != std::end(list);
    };
    return in(kLoomKeys) || in(kOtherHfKeys);
  };
  for (const auto& [key, value] : config.items()) {
    if (known(key)) continue;
    const std::string nearest = json_fields::NearestKey(key, kLoomKeys);
    const std::string shown = nlohmann::json(key).dump(-1, ' ', false,
                                                       nlohmann::json::error_handler_t::replace);
    problems.push_back(
        {absl::StrCat("model.config.", shown.substr(1, shown.size() - 2)),
         nearest.empty() ? "unknown key (neither read by Loom nor one that transformers writes "
                           "for llama, qwen2, qwen3 or mistral; remove it)"
                         : absl::StrCat("unknown key (did you mean ", nearest, "?)")});
  }
  return problems;
}

}  // namespace loom::spec
