// The job-spec keys that choose how the model executes (issue 13, ALST): the attention core
// (model.attn_implementation, model.attn_block_size) and per-layer activation checkpointing
// with host offload (deepspeed_config.activation_checkpointing, parsed into
// EngineOptions::ds.activation_checkpointing, and ArcticTraining's
// training.activation_checkpoint_cpu_offload). docs/job-spec.md lists them. Torch-free; pure.
#ifndef LOOM_WORKER_ENGINE_ENGINE_OPTIONS_MODEL_H_
#define LOOM_WORKER_ENGINE_ENGINE_OPTIONS_MODEL_H_

#include "absl/status/status.h"
#include "worker/engine/engine_options.h"

namespace loom::engine {

// Fills o->attn_implementation, attn_block_size, activation_checkpointing and
// activation_checkpoint_cpu_offload from `spec` and o->ds (already parsed). Errors:
// INVALID_ARGUMENT "model.attn_implementation: ..." / "model.attn_block_size: ...".
absl::Status ModelExecutionOptionsFromJobSpec(const loom::v1::JobSpec& spec, EngineOptions* o);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ENGINE_OPTIONS_MODEL_H_
