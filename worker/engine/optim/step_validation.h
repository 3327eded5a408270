// The validation of one optimizer step, the same on every rank: the fp16 overflow check
// (all-reduce MAX of a local non-finite flag), the global gradient norm (all-reduce SUM of the
// local squared norms of the gradient partitions; stage 0's replicas are already global) and
// DeepSpeed ZeRO's clip coefficient fused with unscaling:
//   clip = (norm / scale + 1e-6) / gradient_clipping;  multiplier = 1 / (clip * scale) when
//   clip > 1, else 1 / scale (exactly 1.0 when scale is 1: the multiply is skipped).
// Source: DeepSpeed stage_1_and_2.py / stage3.py unscale_and_clip_grads, get_global_norm.
// The result feeds OptimizerPipeline::FinishStep (optimizer_pipeline.h).
//
// Collectives issued, in order: the overflow flag (1 double, only when check_overflow), then the
// squared norm (1 double, only when no overflow and grads_partitioned) — the same sequence on
// every rank. Thread-safety: the training thread (it runs collectives).
// Errors: the collectives' (DEADLINE_EXCEEDED / UNAVAILABLE).
#ifndef LOOM_WORKER_ENGINE_OPTIM_STEP_VALIDATION_H_
#define LOOM_WORKER_ENGINE_OPTIM_STEP_VALIDATION_H_

#include <functional>

#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"
#include "worker/engine/optim/optimizer_pipeline.h"

namespace loom::engine::optim {

struct ValidationInputs {
  bool check_overflow = false;     // fp16 with dynamic loss scaling
  double loss_scale = 1.0;         // this step's loss scale (gradients are scaled by it)
  double gradient_clipping = 0.0;  // max global norm; 0 = off
  bool grads_partitioned = true;   // stages 1-3: each rank holds a partition of the gradients
};

// local_nonfinite(): this rank's gradients hold an inf/NaN (called only with check_overflow).
// local_squared_norm(): Σ ||g||² over this rank's scaled gradient partitions (called only when
// there is no overflow). On overflow: {overflow = true, grad_norm = 0}.
absl::StatusOr<StepValidation> ValidateStep(Collectives& collectives,
                                            const ValidationInputs& inputs,
                                            const std::function<bool()>& local_nonfinite,
                                            const std::function<double()>& local_squared_norm);

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_STEP_VALIDATION_H_
