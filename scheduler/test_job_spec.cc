#include "scheduler/test_job_spec.h"

#include "common/logging.h"
#include "google/protobuf/util/json_util.h"

namespace loom {

loom::v1::JobSpec ValidTestJobSpec() {
  static constexpr char kJson[] = R"json({
    "name": "tiny-llama",
    "model": {"config": {
      "vocab_size": 256, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": true}},
    "dataset": {"name": "fortunes"},
    "deepspeed_config": {
      "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW",
                    "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                               "weight_decay": 0.01}},
      "zero_optimization": {"stage": 3}},
    "resources": {"num_ranks": 2},
    "training": {"steps": 20, "sequence_length": 64, "seed": 1},
    "checkpoint": {"interval_steps": 10}
  })json";
  loom::v1::JobSpec spec;
  auto status = google::protobuf::util::JsonStringToMessage(kJson, &spec);
  CHECK(status.ok()) << status.ToString();  // a constant; failing here is a test bug
  return spec;
}

loom::v1::JobSpec TestJobSpecWithRanks(int num_ranks) {
  loom::v1::JobSpec spec = ValidTestJobSpec();
  spec.mutable_resources()->set_num_ranks(num_ranks);
  return spec;
}

}  // namespace loom
