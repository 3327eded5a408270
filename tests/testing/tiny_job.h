// A tiny but real training job for end-to-end tests that go through the REST gateway: a 1-layer
// Llama-style model (byte vocabulary, hidden 32) trained for 5 ZeRO-3 steps on the fortunes
// corpus, checkpointed at the end. Header-only; no LibTorch.
#ifndef LOOM_TESTS_TESTING_TINY_JOB_H_
#define LOOM_TESTS_TESTING_TINY_JOB_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace loom::testing {

// The job spec (a JobSpec in protobuf's JSON mapping) of a job named `name` with `num_ranks`
// ranks.
inline std::string TinyJobSpecJson(const std::string& name, int num_ranks) {
  return absl::StrCat(R"json({
  "name": ")json", name, R"json(",
  "model": {"config": {
    "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
    "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": true}},
  "dataset": {"name": "fortunes"},
  "deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                       "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                       "zero_optimization": {"stage": 3}},
  "resources": {"num_ranks": )json", num_ranks, R"json(},
  "training": {"steps": 5, "sequence_length": 16, "seed": 1},
  "checkpoint": {"interval_steps": 5}
})json");
}

// The body of `POST /v1/jobs` (a SubmitJobRequest in protobuf's JSON mapping) for that job.
inline std::string TinySubmitJobJson(const std::string& name, int num_ranks) {
  return absl::StrCat(R"json({"spec": )json", TinyJobSpecJson(name, num_ranks), "}");
}

}  // namespace loom::testing

#endif  // LOOM_TESTS_TESTING_TINY_JOB_H_
