// rope_dump: what Loom makes of a Hugging Face config.json, for tests against transformers.
//
// Usage: rope_dump [SEQ_LEN] < config.json
// Prints one JSON object: {"inv_freq": [head_dim/2 doubles], "attention_scaling": x,
// "head_dim": d, "warnings": [...], "export": {LlamaConfigToHfJson}} for a forward pass of
// SEQ_LEN positions (default max_position_embeddings; only "dynamic" and "longrope" depend on
// it). Exits 1 with {"error": "..."} when ParseLlamaConfig refuses the config.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "spec/model_config.h"
#include "spec/rope.h"

int main(int argc, char** argv) {
  const std::string text((std::istreambuf_iterator<char>(std::cin)),
                         std::istreambuf_iterator<char>());
  absl::StatusOr<loom::spec::LlamaConfig> c = loom::spec::ParseLlamaConfig(text);
  if (!c.ok()) {
    std::cout << nlohmann::json{{"error", std::string(c.status().message())}}.dump() << "\n";
    return 1;
  }
  const int64_t seq_len = argc > 1 ? std::strtoll(argv[1], nullptr, 10)
                                   : c->max_position_embeddings;
  const loom::spec::RopeFrequencies f = loom::spec::ComputeRopeFrequencies(
      c->rope_theta, c->rope_scaling, c->head_dim(), c->max_position_embeddings, seq_len);
  nlohmann::json out;
  out["inv_freq"] = f.inv_freq;
  out["attention_scaling"] = f.attention_scaling;
  out["head_dim"] = c->head_dim();
  out["warnings"] = c->warnings;
  out["export"] = nlohmann::json::parse(loom::spec::LlamaConfigToHfJson(*c));
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}
