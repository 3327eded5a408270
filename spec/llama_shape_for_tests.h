// File: spec/llama_shape_for_tests.h
//
// A LlamaConfig of a given shape for the planner's tests (memory_fit_test, technique_choice_test):
// the published sizes of a model's config.json, the rest at spec/model_config.h's defaults.
// Testonly.
#ifndef LOOM_SPEC_LLAMA_SHAPE_FOR_TESTS_H_
#define LOOM_SPEC_LLAMA_SHAPE_FOR_TESTS_H_

#include <cstdint>

#include "spec/model_config.h"

namespace loom::spec {

// max_position_embeddings 1M: no test's sequence is refused by it.
inline LlamaConfig LlamaShape(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                              int64_t kv_heads, int64_t vocab) {
  LlamaConfig m;
  m.hidden_size = hidden;
  m.intermediate_size = intermediate;
  m.num_hidden_layers = layers;
  m.num_attention_heads = heads;
  m.num_key_value_heads = kv_heads;
  m.vocab_size = vocab;
  m.max_position_embeddings = 1 << 20;
  return m;
}

}  // namespace loom::spec

#endif  // LOOM_SPEC_LLAMA_SHAPE_FOR_TESTS_H_
