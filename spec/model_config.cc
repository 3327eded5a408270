#include "spec/model_config.h"

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/problems.h"
#include "common/status_macros.h"
#include "spec/json_fields.h"
#include "spec/model_config_keys.h"

namespace loom::spec {

using nlohmann::json;

namespace {

constexpr char kPath[] = "model.config";

// Hugging Face model_type values this engine trains (config.json "model_type"; absent = llama),
// in ModelType order.
constexpr const char* kSupportedModelTypes[] = {"llama", "qwen2", "qwen3", "mistral"};

absl::Status Field(const std::string& key, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(kPath, ".", key, ": ", msg));
}

absl::Status ReadRequiredPositive(const json& j, const std::string& key, int64_t* out) {
  ASSIGN_OR_RETURN(std::optional<int64_t> v, json_fields::OptInt(j, key, kPath));
  if (!v.has_value()) return Field(key, "required field is missing");
  if (*v <= 0) return Field(key, absl::StrCat(*v, " must be positive"));
  *out = *v;
  return absl::OkStatus();
}

}  // namespace

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<LlamaConfig> ParseLlamaConfig(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(kPath, ": not a JSON object"));
  }
  return ParseLlamaConfigValue(j);
}

absl::StatusOr<LlamaConfig> ParseLlamaConfigValue(const json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(kPath, ": not a JSON object"));
  }
  // Every key is read below, known not to change the decoder, or refused (issue 47): all unknown
  // keys in one answer, before anything else (a misspelt required key is named as such).
  if (std::vector<Problem> unknown = UnknownModelConfigKeys(j); !unknown.empty()) {
    Problems problems;
    for (const Problem& p : unknown) problems.Add(p.path, p.what);
    return problems.ToStatus();
  }
  LlamaConfig c;
  if (auto it = j.find("model_type"); it != j.end()) {
    bool supported = false;
    std::string list;
    int index = 0;
    for (const char* t : kSupportedModelTypes) {
      if (!supported && it->is_string() && it->get<std::string>() == t) {
        supported = true;
        c.model_type = static_cast<ModelType>(index);
      }
      absl::StrAppend(&list, list.empty() ? "" : ", ", t);
      ++index;
    }
    if (!supported) {
      // dump() escapes control characters and invalid UTF-8 is replaced, so the message is safe.
      return Field("model_type",
                   absl::StrCat(it->dump(-1, ' ', false, json::error_handler_t::replace),
                                " is not supported (supported: ", list, ")"));
    }
  }
  RETURN_IF_ERROR(ReadRequiredPositive(j, "vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(ReadRequiredPositive(j, "hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(ReadRequiredPositive(j, "intermediate_size", &c.intermediate_size));
  RETURN_IF_ERROR(ReadRequiredPositive(j, "num_hidden_layers", &c.num_hidden_layers));
  RETURN_IF_ERROR(ReadRequiredPositive(j, "num_attention_heads", &c.num_attention_heads));
  RETURN_IF_ERROR(
      ReadRequiredPositive(j, "max_position_embeddings", &c.max_position_embeddings));
  ASSIGN_OR_RETURN(std::optional<int64_t> kv,
                   json_fields::OptInt(j, "num_key_value_heads", kPath));
  c.num_key_value_heads = kv.value_or(c.num_attention_heads);
  if (c.num_key_value_heads <= 0) {
    return Field("num_key_value_heads", absl::StrCat(c.num_key_value_heads, " must be positive"));
  }
  ASSIGN_OR_RETURN(std::optional<double> eps, json_fields::OptDouble(j, "rms_norm_eps", kPath));
  if (eps.has_value()) c.rms_norm_eps = *eps;
  if (!(c.rms_norm_eps > 0)) return Field("rms_norm_eps", "must be positive");
  ASSIGN_OR_RETURN(std::optional<bool> tie,
                   json_fields::OptBool(j, "tie_word_embeddings", kPath));
  c.tie_word_embeddings = tie.value_or(false);
  ASSIGN_OR_RETURN(std::optional<double> init,
                   json_fields::OptDouble(j, "initializer_range", kPath));
  if (init.has_value()) c.initializer_range = *init;
  if (!(c.initializer_range >= 0)) return Field("initializer_range", "must be >= 0");
  ASSIGN_OR_RETURN(std::optional<int64_t> pad, json_fields::OptInt(j, "pad_token_id", kPath));
  if (pad.has_value() && (*pad < 0 || *pad >= c.vocab_size)) {
    return Field("pad_token_id", absl::StrCat(*pad, " is not in [0, vocab_size ", c.vocab_size,
                                              ") (transformers' embedding padding_idx)"));
  }
  c.pad_token_id = pad.value_or(-1);
  ASSIGN_OR_RETURN(std::optional<int64_t> bos, json_fields::OptInt(j, "bos_token_id", kPath));
  if (bos.has_value()) c.bos_token_id = *bos;
  c.bos_token_id_set = bos.has_value();
  if (auto it = j.find("eos_token_id"); it != j.end() && it->is_array()) {
    // Llama 3.x lists every id that ends a turn or a text; the first is the end of a text.
    if (it->empty()) return Field("eos_token_id", "an empty list (give at least one token id)");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return Field(absl::StrCat("eos_token_id[", i, "]"),
                     absl::StrCat(v.dump(-1, ' ', false, json::error_handler_t::replace),
                                  " is not a token id (a non-negative integer)"));
      }
      c.eos_token_ids.push_back(v.get<int64_t>());
    }
    c.eos_token_id = c.eos_token_ids.front();
    c.eos_token_id_set = true;
  } else {
    ASSIGN_OR_RETURN(std::optional<int64_t> eos, json_fields::OptInt(j, "eos_token_id", kPath));
    if (eos.has_value()) c.eos_token_id = *eos;
    c.eos_token_id_set = eos.has_value();
  }

  // Features this engine does not implement change the model's function: refuse them.
  if (c.model_type == ModelType::kQwen2 || c.model_type == ModelType::kQwen3) {
    // Qwen2/3's sliding-window attention (use_sliding_window, sliding_window, max_window_layers)
    // changes the mask; the engine implements full causal attention only. Without
    // use_sliding_window transformers ignores sliding_window and max_window_layers.
    ASSIGN_OR_RETURN(std::optional<bool> sliding,
                     json_fields::OptBool(j, "use_sliding_window", kPath));
    if (sliding.value_or(false)) {
      return Field("use_sliding_window",
                   "true is not supported (Qwen2/Qwen3 sliding-window attention is not "
                   "implemented; set it to false)");
    }
  }
  if (c.model_type == ModelType::kMistral) {
    ASSIGN_OR_RETURN(c.sliding_window, json_fields::OptInt(j, "sliding_window", kPath));
    if (c.sliding_window.has_value() && *c.sliding_window <= 0) {
      return Field("sliding_window", absl::StrCat(*c.sliding_window, " must be positive or null"));
    }
  }
  // transformers 5 lists each layer's attention kind (Qwen2/3: all "full_attention" unless
  // use_sliding_window). Loom implements full attention only.
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) {
      return Field("layer_types", absl::StrCat("expected a list, got ",
                                               it->dump(-1, ' ', false,
                                                        json::error_handler_t::replace)));
    }
    if (static_cast<int64_t>(it->size()) != c.num_hidden_layers) {
      return Field("layer_types", absl::StrCat("has ", it->size(), " entries, num_hidden_layers ",
                                               c.num_hidden_layers));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_string() || v.get<std::string>() != "full_attention") {
        return Field(absl::StrCat("layer_types[", i, "]"),
                     absl::StrCat(v.dump(-1, ' ', false, json::error_handler_t::replace),
                                  " is not supported (only \"full_attention\": sliding-window "
                                  "attention is not implemented)"));
      }
    }
  }
  // SmolLM2's nanotron-converted config says rope_interleaved false; transformers does not read
  // the key (it always rotates halves, as Loom does), so true would silently train another model.
  ASSIGN_OR_RETURN(std::optional<bool> interleaved,
                   json_fields::OptBool(j, "rope_interleaved", kPath));
  if (interleaved.value_or(false)) {
    return Field("rope_interleaved", "true is not supported (interleaved RoPE is not implemented; "
                                     "transformers' Llama rotates halves and ignores this key)");
  }
  // transformers applies attention dropout in training mode; every shipped config says 0.0.
  ASSIGN_OR_RETURN(std::optional<double> dropout,
                   json_fields::OptDouble(j, "attention_dropout", kPath));
  if (dropout.value_or(0.0) != 0.0) {
    return Field("attention_dropout",
                 absl::StrCat(*dropout, " is not supported (dropout is not implemented; only 0)"));
  }
  if (auto it = j.find("attention_bias"); it != j.end() && it->is_boolean() && it->get<bool>()) {
    return Field("attention_bias", "attention biases are not supported yet");
  }
  if (auto it = j.find("mlp_bias"); it != j.end() && it->is_boolean() && it->get<bool>()) {
    return Field("mlp_bias", "MLP biases are not supported yet");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "silu") {
      return Field("hidden_act", absl::StrCat(it->dump(), " is not supported (only \"silu\")"));
    }
  }
  // transformers: head_dim = config.head_dim or hidden_size // num_attention_heads.
  ASSIGN_OR_RETURN(std::optional<int64_t> hd, json_fields::OptInt(j, "head_dim", kPath));
  if (hd.has_value() && *hd <= 0) return Field("head_dim", absl::StrCat(*hd, " must be positive"));
  if (hd.has_value() && *hd > kMaxLlamaParams) {
    return Field("head_dim", absl::StrCat(*hd, " is larger than ", kMaxLlamaParams));
  }
  c.explicit_head_dim = hd.value_or(0);

  if (!hd.has_value() && c.hidden_size % c.num_attention_heads != 0) {
    return Field("hidden_size", absl::StrCat(c.hidden_size, " is not divisible by "
                                             "num_attention_heads ", c.num_attention_heads));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Field("num_attention_heads",
                 absl::StrCat(c.num_attention_heads, " is not divisible by num_key_value_heads ",
                              c.num_key_value_heads));
  }
  if (c.head_dim() % 2 != 0) {
    return Field(hd.has_value() ? "head_dim" : "hidden_size",
                 absl::StrCat("head_dim = ",
                              hd.has_value() ? "" : "hidden_size / num_attention_heads = ",
                              c.head_dim(), " must be even for rotary embeddings"));
  }
  std::vector<std::string> rope_warnings;
  RETURN_IF_ERROR(ParseRopeConfig(j, c.head_dim(), c.max_position_embeddings, &c.rope_theta,
                                  &c.rope_scaling, &rope_warnings));
  // Parameter count, overflow-checked: absurd dimensions (vocab 1e15, 1e9 layers) are refused
  // here, not discovered by the trainer failing to allocate (or enumerating 9e9 tensors). Every
  // dimension (heads and head_dim included) is at most kMaxLlamaParams, so with
  // each factor <= kMaxLlamaParams < 2^41 the 128-bit products below cannot overflow.
  for (const auto& [key, value] :
       {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"intermediate_size", c.intermediate_size},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_attention_heads", c.num_attention_heads},
        {"max_position_embeddings", c.max_position_embeddings}}) {
    if (value > kMaxLlamaParams) {
      return Field(key, absl::StrCat(value, " is larger than ", kMaxLlamaParams));
    }
  }
  const __int128 V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size;
  const __int128 d = c.head_dim();
  const __int128 q = c.num_attention_heads * d, kv_dim = c.num_key_value_heads * d;
  const __int128 biases = c.qkv_bias() ? q + 2 * kv_dim : 0;
  const __int128 qk_norms = c.qk_norm() ? 2 * d : 0;
  const __int128 per_layer = 2 * H + 2 * q * H + 2 * kv_dim * H + 3 * I * H + biases + qk_norms;
  const __int128 total =
      V * H * (c.tie_word_embeddings ? 1 : 2) + H + per_layer * c.num_hidden_layers;
  if (total > kMaxLlamaParams) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPath, ": the model would have more than ", kMaxLlamaParams,
        " parameters (vocab_size ", c.vocab_size, ", hidden_size ", c.hidden_size,
        ", intermediate_size ", c.intermediate_size, ", num_hidden_layers ",
        c.num_hidden_layers, ")"));
  }
  c.warnings = std::move(rope_warnings);
  return c;
}

absl::Status CheckModelConfigForSequenceLength(const LlamaConfig& c, int64_t sequence_length,
                                               int64_t sequence_parallel_size) {
  if (c.sliding_window.has_value() && *c.sliding_window < sequence_length) {
    return Field("sliding_window",
                 absl::StrCat(*c.sliding_window, " is shorter than training.sequence_length ",
                              sequence_length, " (windowed attention is not implemented; a "
                              "window >= the sequence length, or null, is full causal attention)"));
  }
  const int64_t orig =
      c.rope_scaling.original_max_position_embeddings.value_or(c.max_position_embeddings);
  if (c.rope_scaling.rope_type == RopeType::kLongrope && sequence_parallel_size > 1 &&
      sequence_length > orig) {
    return Field("rope_scaling.rope_type",
                 absl::StrCat("\"longrope\" with sequence parallelism (sequence_parallel_size ",
                              sequence_parallel_size, ") and training.sequence_length ",
                              sequence_length, " > original_max_position_embeddings ", orig,
                              " is not supported: LongRoPE picks its factors from the largest "
                              "position, which differs between sequence shards"));
  }
  return absl::OkStatus();
}

std::string LlamaConfigToHfJson(const LlamaConfig& c) {
  json j;
  if (c.model_type == ModelType::kQwen2 || c.model_type == ModelType::kQwen3) {
    // transformers' Qwen2Config / Qwen3Config keys
    const bool qwen3 = c.model_type == ModelType::kQwen3;
    j["architectures"] = json::array({qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"});
    j["model_type"] = qwen3 ? "qwen3" : "qwen2";
    if (qwen3) j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else if (c.model_type == ModelType::kMistral) {
    j["architectures"] = json::array({"MistralForCausalLM"});
    j["model_type"] = "mistral";
    j["sliding_window"] = c.sliding_window.has_value() ? json(*c.sliding_window) : json(nullptr);
  } else {
    j["architectures"] = json::array({"LlamaForCausalLM"});
    j["model_type"] = "llama";
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  j["attention_dropout"] = 0.0;
  j["rope_scaling"] = RopeScalingToJson(c.rope_scaling);
  j["use_cache"] = true;
  if (c.bos_token_id_set) j["bos_token_id"] = c.bos_token_id;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  if (c.eos_token_ids.size() > 1) {
    j["eos_token_id"] = c.eos_token_ids;
  } else if (c.eos_token_id_set) {
    j["eos_token_id"] = c.eos_token_id;
  }
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim();
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  return j.dump(2);
}

std::vector<ParamSpec> LlamaParamSpecs(const LlamaConfig& c) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size;
  const int64_t d = c.head_dim();
  const int64_t q = c.num_attention_heads * d, kv = c.num_key_value_heads * d;
  using K = ParamSpec::Kind;
  std::vector<ParamSpec> out;
  out.push_back({"model.embed_tokens.weight", {V, H}, K::kEmbedding});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {H}, K::kNorm});
    out.push_back({p + "self_attn.q_proj.weight", {q, H}, K::kLinear});
    if (c.qkv_bias()) out.push_back({p + "self_attn.q_proj.bias", {q}, K::kBias});
    out.push_back({p + "self_attn.k_proj.weight", {kv, H}, K::kLinear});
    if (c.qkv_bias()) out.push_back({p + "self_attn.k_proj.bias", {kv}, K::kBias});
    out.push_back({p + "self_attn.v_proj.weight", {kv, H}, K::kLinear});
    if (c.qkv_bias()) out.push_back({p + "self_attn.v_proj.bias", {kv}, K::kBias});
    out.push_back({p + "self_attn.o_proj.weight", {H, q}, K::kLinear});
    if (c.qk_norm()) {
      out.push_back({p + "self_attn.q_norm.weight", {d}, K::kNorm});
      out.push_back({p + "self_attn.k_norm.weight", {d}, K::kNorm});
    }
    out.push_back({p + "post_attention_layernorm.weight", {H}, K::kNorm});
    out.push_back({p + "mlp.gate_proj.weight", {I, H}, K::kLinear});
    out.push_back({p + "mlp.up_proj.weight", {I, H}, K::kLinear});
    out.push_back({p + "mlp.down_proj.weight", {H, I}, K::kLinear});
  }
  out.push_back({"model.norm.weight", {H}, K::kNorm});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {V, H}, K::kLinear});
  return out;
}

int64_t LlamaParamCount(const LlamaConfig& c) {
  int64_t n = 0;
  for (const ParamSpec& s : LlamaParamSpecs(c)) n += s.numel();
  return n;
}

}  // namespace loom::spec
