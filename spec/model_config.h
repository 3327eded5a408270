// Llama-style decoder configuration (a Hugging Face `config.json` for LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM or MistralForCausalLM), its validation, the exported
// config.json and the parameter list in Hugging Face order. Qwen2 (transformers'
// modeling_qwen2.py) is Llama plus biases on the q/k/v projections (no o_proj or MLP bias).
// Qwen3 (modeling_qwen3.py) is Llama plus an RMSNorm over each head of q and of k (q_norm,
// k_norm weights [head_dim], applied before RoPE). Mistral (modeling_mistral.py) is Llama with a
// sliding attention window, accepted when it cannot bind (see sliding_window below). RoPE, with
// every scaling type transformers implements for these models, is spec/rope.h.
//
// No LibTorch here: the scheduler (memory planning), the checkpoint service (consolidation) and
// the trainer all use this library. All functions are pure and thread-safe.
#ifndef LOOM_SPEC_MODEL_CONFIG_H_
#define LOOM_SPEC_MODEL_CONFIG_H_

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/rope.h"

namespace loom::spec {

// Hyper-parameters of a Llama decoder (transformers' LlamaConfig field names and defaults).
// Largest model (parameters) and largest single dimension ParseLlamaConfig accepts: 2^40 (~1.1T
// parameters), beyond anything this engine can hold, and small enough that size arithmetic on
// accepted configs cannot overflow int64.
inline constexpr int64_t kMaxLlamaParams = int64_t{1} << 40;

// The decoder families (config.json "model_type").
enum class ModelType { kLlama, kQwen2, kQwen3, kMistral };

struct LlamaConfig {
  // "llama" (also when absent), "qwen2", "qwen3" or "mistral"
  ModelType model_type = ModelType::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;              // H
  int64_t intermediate_size = 0;        // I (SwiGLU MLP width)
  int64_t num_hidden_layers = 0;        // L
  int64_t num_attention_heads = 0;      // Hq
  int64_t num_key_value_heads = 0;      // Hkv; defaults to Hq (no grouped-query attention)
  int64_t max_position_embeddings = 0;  // longest sequence the model accepts
  double rms_norm_eps = 1e-6;
  // The RoPE base: rope_theta, or rope_parameters.rope_theta (transformers 5); the scaling:
  // rope_scaling (transformers 4) or the rest of rope_parameters. spec/rope.h.
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // The config's head_dim when given (Qwen3: 128 with hidden_size 1024 and 16 heads); 0: not
  // given, d = H / Hq.
  int64_t explicit_head_dim = 0;
  // Mistral's attention window (tokens; nullopt: null, full attention). Attention with a window
  // of W >= the sequence length equals full causal attention; the engine has no windowed
  // attention, so a job with sequence_length > W is refused (engine_options.cc) naming
  // model.config.sliding_window.
  std::optional<int64_t> sliding_window;
  bool tie_word_embeddings = false;     // lm_head shares model.embed_tokens.weight
  double initializer_range = 0.02;      // std of the normal init of linear/embedding weights
  // Written to config.json only, and only when the config gave it (bos_token_id_set): an export
  // must not invent ids (transformers' defaults differ: Llama 1 and 2, Qwen2 none).
  int64_t bos_token_id = 1;
  bool bos_token_id_set = false;
  // pad_token_id, or -1 (absent or null). As transformers' nn.Embedding(padding_idx): the
  // embedding path gives its row no gradient (worker/engine/model/autograd_ops.h EmbeddingOp; the
  // tied lm_head path still does). Written back to config.json when given. A fresh model's row
  // is drawn like the others (transformers zeroes it): only the gradient masking is implemented.
  int64_t pad_token_id = -1;
  // Marks document ends in token files for dataset.pack_documents; else written to config.json
  // only. eos_token_id_set: the config gave it (pack_documents on token files requires that).
  // A list (Llama 3.x: [128001, 128008, 128009]) is kept whole in eos_token_ids and written back
  // as a list; its first id is eos_token_id, the one that marks document ends.
  int64_t eos_token_id = 2;
  bool eos_token_id_set = false;
  std::vector<int64_t> eos_token_ids;  // as given when a list, else empty
  // One per key of a RoPE block that its rope_type does not read (transformers ignores it too;
  // ParseRopeConfig); the trainer emits them as warning events.
  std::vector<std::string> warnings;

  // d: the config's head_dim, else H / Hq.
  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  // Qwen2: q_proj, k_proj and v_proj carry a bias ([Hq*d], [Hkv*d], [Hkv*d]).
  bool qkv_bias() const { return model_type == ModelType::kQwen2; }
  // Qwen3: self_attn.q_norm and k_norm, RMSNorm weights [d] over each head of q and k.
  bool qk_norm() const { return model_type == ModelType::kQwen3; }
};

// Parses a config.json object. Required: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, max_position_embeddings. model_type, when present,
// must be a supported family (kSupportedModelTypes in model_config.cc), else
// INVALID_ARGUMENT "model.config.model_type: \"gpt2\" is not supported (supported: llama,
// qwen2, qwen3, mistral)". Qwen2/Qwen3: use_sliding_window true is refused (INVALID_ARGUMENT
// naming model.config.use_sliding_window: the engine has no sliding-window attention), as is
// layer_types with an entry other than "full_attention". RoPE: both layouts and every scaling
// type (ParseRopeConfig, spec/rope.h). head_dim may differ from hidden_size / heads (even).
// Hugging Face keys that do not change the decoder (architectures, torch_dtype or dtype, ids,
// ...) are accepted and ignored; any key transformers does not write either (a typo) is refused
// first, every such key in one INVALID_ARGUMENT (common/problems.h; one problem per key, with
// the nearest key Loom reads: UnknownModelConfigKeys). rope_interleaved true is refused (not
// implemented; transformers ignores the key). Integer fields accept
// JSON integers, integral floats (protobuf Struct numbers) and decimal strings.
// Errors: INVALID_ARGUMENT naming the field as "model.config.<field>: ...", e.g.
// "model.config.num_attention_heads: 6 is not divisible by num_key_value_heads 4".
// Also INVALID_ARGUMENT when a dimension or the parameter count exceeds kMaxLlamaParams.
absl::StatusOr<LlamaConfig> ParseLlamaConfig(const std::string& json_text);
// The same on a parsed value (e.g. spec::StructToJson of a job spec's model.config).
absl::StatusOr<LlamaConfig> ParseLlamaConfigValue(const nlohmann::json& j);

// The checks that need the job's sequence length (training.sequence_length): Mistral's
// sliding_window W < seq_len is refused, INVALID_ARGUMENT "model.config.sliding_window: 16 is
// shorter than training.sequence_length 32 (windowed attention is not implemented; ...)"; with
// W >= seq_len every key is within the window, so attention equals full causal attention.
// LongRoPE with sequence_parallel_size > 1 and seq_len > original_max_position_embeddings is
// refused naming model.config.rope_scaling.rope_type: each shard would pick short or long factors
// from its own largest position (RopeTables), unlike the unsharded model.
absl::Status CheckModelConfigForSequenceLength(const LlamaConfig& config, int64_t sequence_length,
                                               int64_t sequence_parallel_size = 1);

// A complete Hugging Face config.json object (architectures ["LlamaForCausalLM"],
// model_type "llama", hidden_act "silu", torch_dtype "float32", attention_bias false, ...; for
// Qwen2 architectures ["Qwen2ForCausalLM"], model_type "qwen2", use_sliding_window false; Qwen3
// and Mistral likewise). RoPE in the transformers-4 layout (rope_theta and rope_scaling,
// RopeScalingToJson), which transformers 4.45+ and 5 both load.
// ParseLlamaConfig(LlamaConfigToHfJson(c)) == c.
std::string LlamaConfigToHfJson(const LlamaConfig& config);

// One trainable tensor: Hugging Face name and shape (row-major).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
  // What the tensor is; decides its initialisation (normal vs ones).
  // kBias: a linear layer's bias [out]. Providers initialise it like a linear weight (normal with
  // initializer_range; they treat every kind but kNorm alike), where Hugging Face zeroes it:
  // a from-scratch Qwen2 starts with small random biases. Fine-tuning reads them from the export.
  enum class Kind { kEmbedding, kLinear, kNorm, kBias } kind = Kind::kLinear;
};

// Every trainable tensor in model order: model.embed_tokens.weight [V,H]; per layer i
// model.layers.{i}.input_layernorm.weight [H], self_attn.{q,k,v,o}_proj.weight
// ([Hq*d,H], [Hkv*d,H], [Hkv*d,H], [H,Hq*d]), post_attention_layernorm.weight [H],
// mlp.{gate,up,down}_proj.weight ([I,H], [I,H], [H,I]); model.norm.weight [H];
// lm_head.weight [V,H] only when not tied. Qwen2 adds self_attn.{q,k,v}_proj.bias ([Hq*d],
// [Hkv*d], [Hkv*d]) each right after its weight (Hugging Face's order), Kind kBias. Qwen3 adds
// self_attn.q_norm.weight and self_attn.k_norm.weight ([d] each, Kind kNorm) after o_proj.
std::vector<ParamSpec> LlamaParamSpecs(const LlamaConfig& config);

// Ψ: total trainable parameters (sum of LlamaParamSpecs numels).
int64_t LlamaParamCount(const LlamaConfig& config);

}  // namespace loom::spec

#endif  // LOOM_SPEC_MODEL_CONFIG_H_
