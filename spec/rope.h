// Rotary position embedding (RoPE) parameters of a Hugging Face decoder config and the inverse
// frequencies they give, as transformers computes them (transformers/modeling_rope_utils.py:
// ROPE_INIT_FUNCTIONS, _compute_{linear_scaling,dynamic_ntk,yarn,longrope,llama3}_parameters,
// dynamic_rope_update; LlamaRotaryEmbedding.compute_default_rope_parameters for "default").
//
// Two config layouts carry them:
//   transformers 4: top-level "rope_theta" and "rope_scaling" ({"rope_type" or "type": ...,
//                   "factor": ..., ...} or null);
//   transformers 5: "rope_parameters" ({"rope_theta": ..., "rope_type": ..., scaling keys}).
// Pure double math, no LibTorch: the scheduler validates with it and the engine builds its cos/sin
// tables from it (worker/engine/model/llama_model.h RopeTables). Thread-safe (no state).
#ifndef LOOM_SPEC_ROPE_H_
#define LOOM_SPEC_ROPE_H_

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loom::spec {

// transformers' "rope_type" values for Llama-style decoders (kRopeTypeNames in rope.cc).
enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLongrope, kLlama3 };
const char* RopeTypeName(RopeType type);

// The scaling parameters as the config gave them (nullopt/empty: absent; the defaults of
// transformers apply, see ComputeRopeFrequencies). Keys per type (transformers'
// _validate_<type>_rope_parameters): linear, dynamic: factor; yarn: factor,
// original_max_position_embeddings, optional attention_factor, beta_fast, beta_slow, mscale,
// mscale_all_dim, truncate; longrope: short_factor, long_factor ([head_dim/2] each),
// original_max_position_embeddings, optional factor, attention_factor; llama3: factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings.
struct RopeScaling {
  RopeType rope_type = RopeType::kDefault;
  std::optional<double> factor;
  // Absent: max_position_embeddings (transformers' standardize_rope_params does the same).
  std::optional<int64_t> original_max_position_embeddings;
  std::optional<double> attention_factor;
  std::optional<double> beta_fast, beta_slow, mscale, mscale_all_dim;
  std::optional<bool> truncate;
  std::vector<double> short_factor, long_factor;
  std::optional<double> low_freq_factor, high_freq_factor;
};

// Reads the RoPE base and scaling of a config object (either layout; both may be present when
// they agree). `head_dim` (d) and `max_position_embeddings` are the already-parsed config values
// (list lengths and the defaults depend on them). A top-level "original_max_position_embeddings"
// (Phi-3's place for it) is used for yarn/longrope/llama3 as transformers does.
// Defaults: theta 10000 (transformers' default_theta), type "default".
// Errors (INVALID_ARGUMENT naming the field, e.g. "model.config.rope_scaling.factor: required
// for rope_type \"llama3\""): a non-object block, an unknown rope_type, a missing or non-positive
// required key, a list of the wrong length, partial_rotary_factor other than 1, per-layer-type
// blocks, a theta given twice with different values ("model.config.rope_parameters.rope_theta:
// 500000 differs from rope_theta 10000"), rope_scaling and rope_parameters that disagree.
// A key of the block that no type reads adds a warning to *warnings (it is ignored, as
// transformers ignores it).
absl::Status ParseRopeConfig(const nlohmann::json& config, int64_t head_dim,
                             int64_t max_position_embeddings, double* rope_theta,
                             RopeScaling* scaling, std::vector<std::string>* warnings);

// The transformers-4 layout of the scaling: null for "default", else {"rope_type": ..., and every
// key the config gave}. transformers 4.45+ and 5 both load it (5 moves it into rope_parameters);
// the exporter writes it with a top-level "rope_theta".
nlohmann::json RopeScalingToJson(const RopeScaling& scaling);

// What transformers' rotary embedding uses for a sequence: cos/sin = cos/sin(position *
// inv_freq) * attention_scaling.
struct RopeFrequencies {
  std::vector<double> inv_freq;  // [head_dim / 2], radians per position
  double attention_scaling = 1.0;
};

// inv_freq and attention_scaling for a forward pass whose largest position is seq_len - 1
// (transformers' dynamic_rope_update takes seq_len = max(position_ids) + 1). Only "dynamic" and
// "longrope" depend on seq_len: dynamic NTK rescales the base once seq_len >
// max_position_embeddings (below that it equals "default"); longrope uses long_factor when
// seq_len > original_max_position_embeddings, else short_factor.
// Double precision throughout; transformers computes the same formulas in float32, so the two
// agree to float32 rounding (tests/python/hf_model_configs_test.py). Requires a config accepted by
// ParseRopeConfig (head_dim even, > 0).
RopeFrequencies ComputeRopeFrequencies(double rope_theta, const RopeScaling& scaling,
                                       int64_t head_dim, int64_t max_position_embeddings,
                                       int64_t seq_len);

}  // namespace loom::spec

#endif  // LOOM_SPEC_ROPE_H_
