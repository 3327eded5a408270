#include "worker/engine/engine_options_model.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "proto/common.pb.h"

namespace loom::engine {

absl::Status ModelExecutionOptionsFromJobSpec(const loom::v1::JobSpec& spec, EngineOptions* o) {
  const loom::v1::ModelSpec& model = spec.model();
  if (!model.attn_implementation().empty()) o->attn_implementation = model.attn_implementation();
  if (o->attn_implementation != "eager" && o->attn_implementation != "flash_attention_2") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.attn_implementation: \"", o->attn_implementation,
                     "\" is not eager or flash_attention_2"));
  }
  if (model.attn_block_size() != 0) o->attn_block_size = model.attn_block_size();
  if (o->attn_block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.attn_block_size: ", o->attn_block_size, " must be >= 1"));
  }
  const ActivationCheckpointingConfig& ac = o->ds.activation_checkpointing;
  const bool arctic_offload = spec.training().activation_checkpoint_cpu_offload();
  o->activation_checkpointing = ac.enabled || arctic_offload;
  o->activation_checkpoint_cpu_offload = ac.cpu_checkpointing || arctic_offload;
  return absl::OkStatus();
}

}  // namespace loom::engine
