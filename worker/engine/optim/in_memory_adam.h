// The in-memory optimizer pipeline: torch.optim.Adam / AdamW (ApplyOptimizerStep,
// worker/engine/optimizer.h) on the model's fp32 master partitions and moments, sub-group by
// sub-group at commit. Nothing runs before the step is validated: OnSubGroupReady only records
// (OptimizerPipeline's bookkeeping), and a rollback has nothing to undo. Because every
// partition's update is independent, stepping per sub-group is bit-identical to one
// ApplyOptimizerStep over all partitions.
//
// Thread-safety and errors: OptimizerPipeline's contract (optimizer_pipeline.h); Commit throws
// c10::Error only on programming errors (dtype/shape mismatch), as ApplyOptimizerStep does.
#ifndef LOOM_WORKER_ENGINE_OPTIM_IN_MEMORY_ADAM_H_
#define LOOM_WORKER_ENGINE_OPTIM_IN_MEMORY_ADAM_H_

#include <memory>

#include "spec/ds_config.h"
#include "worker/engine/optim/optimizer_pipeline.h"

namespace loom::engine::optim {

// `plan` cuts the partitions the source returns (its partition numels are the tensors'
// numels); the source must return defined fp32 param/exp_avg/exp_avg_sq tensors.
std::unique_ptr<OptimizerPipeline> MakeInMemoryAdamPipeline(const spec::OptimizerConfig& config,
                                                            SubGroupPlan plan,
                                                            PartitionSource source);

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_IN_MEMORY_ADAM_H_
