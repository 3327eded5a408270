#include "worker/engine/model_execution.h"

#include <memory>

#include "worker/engine/model/blockwise_attention.h"

namespace loom::engine {

void ApplyModelExecutionOptions(const EngineOptions& o, LlamaModel* model, MemoryTracker* memory) {
  if (o.attn_implementation == "flash_attention_2") {
    model->set_attention_core(std::make_unique<BlockwiseCausalAttention>(o.attn_block_size));
  } else {
    model->set_attention_core(nullptr);  // eager: MaterializedCausalAttention
  }
  ActivationCheckpointOptions ck;
  ck.enabled = o.activation_checkpointing;
  ck.cpu_offload = o.activation_checkpoint_cpu_offload;
  ck.memory = memory;
  model->set_activation_checkpointing(ck);
}

}  // namespace loom::engine
