// The keys of a Hugging Face config.json that Loom knows (model.config), and a problem for each
// key it does not: a typo such as "rms_norm_epsilon" or "num_key_value_head" would otherwise be
// ignored silently and the default used, as transformers itself does (PretrainedConfig keeps
// unknown keys as attributes). Every key is used, known not to matter for training, or refused
// (issue 47): ParseLlamaConfigValue refuses a config with any unknown key, naming each.
//
// Known: the keys Loom reads or refuses (spec/model_config.h), and the generic and
// family-specific keys transformers writes for Llama, Qwen2, Qwen3 and Mistral that do not
// change the decoder Loom trains (architectures, torch_dtype, pad_token_id, id2label, ...).
// Pure and thread-safe.
#ifndef LOOM_SPEC_MODEL_CONFIG_KEYS_H_
#define LOOM_SPEC_MODEL_CONFIG_KEYS_H_

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/problems.h"

namespace loom::spec {

// One problem per top-level key of `config` (an object; anything else gives none) that Loom does
// not know, in key order: {path "model.config.rms_norm_epsilon", what "unknown key (did you mean
// rms_norm_eps?)"} when a known key is within edit distance max(2, length / 4), else
// {"model.config.<key>", "unknown key (neither read by Loom nor one that transformers writes for
// llama, qwen2, qwen3 or mistral; remove it)"}. Keys are shown escaped (JSON string syntax).
std::vector<Problem> UnknownModelConfigKeys(const nlohmann::json& config);

}  // namespace loom::spec

#endif  // LOOM_SPEC_MODEL_CONFIG_KEYS_H_
