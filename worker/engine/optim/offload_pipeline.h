// The ZeRO-Offload / ZeRO-Infinity optimizer pipeline: offload::OffloadOptimizer (CpuAdam over
// optimizer state in host memory or on NVMe, sub-group by sub-group, with its NVMe read/write
// pipelining) behind the OptimizerPipeline protocol. At commit the gradient partitions are
// multiplied in place by the validation's grad_multiplier (when it is not exactly 1) and handed
// to OffloadOptimizer::Step with the model's master partitions (null when the parameters live on
// NVMe). Nothing runs before validation, so a rollback has nothing to undo; SuperOffload's
// speculative variant (docs/design/TECHNIQUES.md §4.1) will start CpuAdam in OnReady instead.
//
// Thread-safety and errors: OptimizerPipeline's contract (optimizer_pipeline.h); Commit returns
// OffloadOptimizer::Step's status (NVMe I/O errors name the file).
#ifndef LOOM_WORKER_ENGINE_OPTIM_OFFLOAD_PIPELINE_H_
#define LOOM_WORKER_ENGINE_OPTIM_OFFLOAD_PIPELINE_H_

#include <memory>

#include "worker/engine/offload/offload_optimizer.h"
#include "worker/engine/optim/optimizer_pipeline.h"

namespace loom::engine::optim {

// `optimizer` (not owned) must outlive the pipeline; its plan() is the pipeline's plan. The
// source's param tensors are the masters when the parameters are in memory.
std::unique_ptr<OptimizerPipeline> MakeOffloadPipeline(offload::OffloadOptimizer* optimizer,
                                                       PartitionSource source);

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_OFFLOAD_PIPELINE_H_
