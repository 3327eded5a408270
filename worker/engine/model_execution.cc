#include "worker/engine/model_execution.h"

#include <memory>

#include "worker/engine/model/blockwise_attention.h"

namespace loom::engine {

std::unique_ptr<AttentionCore> MakeAttentionCore(const EngineOptions& o) {
  if (o.attn_implementation == "flash_attention_2") {
    return std::make_unique<BlockwiseCausalAttention>(o.attn_block_size);
  }
  return std::make_unique<MaterializedCausalAttention>();  // eager
}

void ApplyModelExecutionOptions(const EngineOptions& o, LlamaModel* model, MemoryTracker* memory) {
  model->set_attention_core(MakeAttentionCore(o));
  ActivationCheckpointOptions ck;
  ck.enabled = o.activation_checkpointing;
  ck.cpu_offload = o.activation_checkpoint_cpu_offload;
  ck.memory = memory;
  model->set_activation_checkpointing(ck);
}

}  // namespace loom::engine
