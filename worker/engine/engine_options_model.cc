#include "worker/engine/engine_options_model.h"

#include "common/status_macros.h"
#include "proto/common.pb.h"
#include "spec/engine_options_tiled.h"

namespace loom::engine {

absl::Status ModelExecutionOptionsFromJobSpec(const loom::v1::JobSpec& spec, EngineOptions* o) {
  spec::ModelExecutionKeys keys;  // the one parser the scheduler uses too (engine_options_tiled.h)
  RETURN_IF_ERROR(spec::ParseModelExecution(spec, o->ds.activation_checkpointing, &keys));
  o->attn_implementation = keys.attn_implementation;
  o->attn_block_size = keys.attn_block_size;
  o->activation_checkpointing = keys.activation_checkpointing;
  o->activation_checkpoint_cpu_offload = keys.activation_checkpoint_cpu_offload;
  return absl::OkStatus();
}

}  // namespace loom::engine
