// The job spec's ALST keys (issue 13; docs/job-spec.md): training.tiled_* (tiled compute), the
// attention core (model.attn_implementation, model.attn_block_size) and per-layer activation
// checkpointing (deepspeed_config.activation_checkpointing, already parsed by
// ParseDeepSpeedConfig, and ArcticTraining's training.activation_checkpoint_cpu_offload).
// One parser for both readers: engine_options.cc (the trainer) and the scheduler's submission
// checks (scheduler/job_spec_validation.cc), so both refuse the same specs with the same
// messages. Torch-free, pure and thread-safe.
#ifndef LOOM_SPEC_ENGINE_OPTIONS_TILED_H_
#define LOOM_SPEC_ENGINE_OPTIONS_TILED_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/common.pb.h"
#include "spec/ds_config.h"
#include "spec/model_config.h"
#include "spec/tiled_compute_options.h"

namespace loom::spec {

// Fills `out` from training.tiled_mlp_compute / tiled_mlp_tile_size / tiled_logits_loss /
// tiled_logits_loss_tile_size. INVALID_ARGUMENT naming the field for a negative tile size, or
// for a tile size given while its switch is off (a typo would otherwise be silently ignored).
absl::Status ParseTiledCompute(const loom::v1::TrainingSpec& training, TiledComputeOptions* out);

// How the model executes (EngineOptions carries the same fields).
struct ModelExecutionKeys {
  // flash_attention_2 (default: the blockwise core, dense within one block) | eager
  std::string attn_implementation = "flash_attention_2";
  int64_t attn_block_size = 128;              // tokens per query/key block of the blockwise core
  bool activation_checkpointing = false;      // per decoder layer
  bool activation_checkpoint_cpu_offload = false;  // checkpointed layer inputs in host memory
};

// Fills `out` from spec.model().attn_implementation / attn_block_size (empty / 0: the defaults
// above), `ac` (deepspeed_config.activation_checkpointing as ParseDeepSpeedConfig read it) and
// spec.training().activation_checkpoint_cpu_offload (which turns checkpointing on too).
// Errors: INVALID_ARGUMENT "model.attn_implementation: ..." (not eager or flash_attention_2),
// "model.attn_block_size: ..." (< 1).
absl::Status ParseModelExecution(const loom::v1::JobSpec& spec,
                                 const ActivationCheckpointingConfig& ac, ModelExecutionKeys* out);

// dataset.pack_documents (packed samples; proto/common.proto): needs
// train_micro_batch_size_per_gpu == 1 (`micro_batch`: one packed sample per micro-batch, the
// layout of Hugging Face's DataCollatorWithFlattening) and, for dataset.format "tokens", an
// model.config.eos_token_id given and a token id of the vocabulary, 0 <= id < vocab_size (token
// files mark document ends only by it: a default or an id that cannot occur would silently pack
// across documents). INVALID_ARGUMENT "dataset.pack_documents: ..." naming the other field and
// its value. OK when the key is off.
absl::Status CheckPackDocuments(const loom::v1::DatasetSpec& dataset, int64_t micro_batch,
                                const LlamaConfig& model);

// Both parsers above on `spec` with `ds` = ParseDeepSpeedConfig(spec.deepspeed_config()): the
// scheduler's submission check. The first error, as the trainer would report it.
absl::Status ValidateAlstKeys(const loom::v1::JobSpec& spec, const DeepSpeedConfig& ds);

}  // namespace loom::spec

#endif  // LOOM_SPEC_ENGINE_OPTIONS_TILED_H_
