// Applies the job's model-execution options (issue 13: EngineOptions::attn_implementation,
// attn_block_size, activation_checkpointing, activation_checkpoint_cpu_offload;
// engine_options_model.h) to the Trainer's LlamaModel. `memory` (the provider's tracker) counts
// offloaded checkpoint inputs and must outlive the model. Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_MODEL_EXECUTION_H_
#define LOOM_WORKER_ENGINE_MODEL_EXECUTION_H_

#include <memory>

#include "worker/engine/engine_options.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/zero/memory_tracker.h"

namespace loom::engine {

void ApplyModelExecutionOptions(const EngineOptions& o, LlamaModel* model, MemoryTracker* memory);

// The attention core `o.attn_implementation` names: BlockwiseCausalAttention for
// "flash_attention_2" (the default), MaterializedCausalAttention for "eager". Sequence parallelism wraps it.
std::unique_ptr<AttentionCore> MakeAttentionCore(const EngineOptions& o);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_EXECUTION_H_
