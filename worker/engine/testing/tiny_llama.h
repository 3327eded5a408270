// The tiny Llama shape the engine's unit tests train (vocab 64, hidden 16, intermediate 24,
// 2 layers, 4 query / 2 KV heads, 32 positions, N(0, 0.2) init): small enough for a thread gang
// of Gloo ranks in one test process, with GQA and a tied or untied head. Tests that need another
// shape start from it and change the fields they need. Torch-free.
#ifndef LOOM_WORKER_ENGINE_TESTING_TINY_LLAMA_H_
#define LOOM_WORKER_ENGINE_TESTING_TINY_LLAMA_H_

#include "spec/model_config.h"

namespace loom::engine::testing {

inline spec::LlamaConfig TinyLlamaConfig(bool tie_word_embeddings = false) {
  spec::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tie_word_embeddings;
  c.initializer_range = 0.2;
  return c;
}

}  // namespace loom::engine::testing

#endif  // LOOM_WORKER_ENGINE_TESTING_TINY_LLAMA_H_
