// The optimizer step of one ZeRO partition (or sub-group of partitions): torch.optim.Adam /
// AdamW (PyTorch 1.13; DeepSpeed FusedAdam with adam_w_mode) on fp32 master weights. This is
// the one place the engine updates weights in memory, so an offload backend (CPU Adam, NVMe
// swapping; docs/design/TECHNIQUES.md §1.7-1.8) can route a sub-group elsewhere by replacing this
// call.
//
// Kernels: a partition whose four tensors are fp32, contiguous CPU tensors is stepped by the
// fused kernel of offload/cpu_adam.h (one pass over param/grad/m/v per slice instead of ATen's
// eight element-wise passes: 0.12 s instead of 0.33-0.40 s for a 53.5M-element partition), as
// DeepSpeed runs FusedAdam on the device the weights live on. It is bit-identical to
// ZeRO-Offload's CpuAdam and differs from ATen's op-by-op update by a few ulp per step (ATen's
// vectorised add/addcmul contract to FMA; offload/cpu_adam.h). Any other partition (an
// accelerator's) runs the op-by-op ATen update. Results do not depend on the thread count.
//
// Not thread-safe per partition (each call mutates its partitions in place); distinct
// partitions may be stepped concurrently. The CPU kernel splits a partition over the caller's
// intra-op threads (at::parallel_for).
#ifndef LOOM_WORKER_ENGINE_OPTIMIZER_H_
#define LOOM_WORKER_ENGINE_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "spec/ds_config.h"

namespace loom::engine {

// One partition of one parameter, all four tensors fp32 [m], contiguous, on the same device.
// m = ceil(n / N) (stages 1-3: this rank's partition) or n (stage 0: the full replica).
struct OptimizerPartition {
  at::Tensor param;       // fp32 master weights, updated in place
  at::Tensor grad;        // fp32 gradient (the data-parallel mean, still loss-scaled); may be
                          // undefined: treated as zeros
  at::Tensor exp_avg;     // fp32 Adam first moment, updated in place
  at::Tensor exp_avg_sq;  // fp32 Adam second moment, updated in place
};

// Per-step scalars shared by every sub-group of a step.
struct OptimizerStepArgs {
  int64_t step = 1;              // 1-based optimizer step count (bias correction)
  double lr = 0.0;               // learning rate of this step
  double grad_multiplier = 1.0;  // 1 / (clip * loss_scale): unscale and clip fused (DeepSpeed
                                 // ZeRO); exactly 1.0 skips the multiply
};

// Applies one Adam/AdamW step (config.decoupled_weight_decay selects AdamW) to every partition
// of `sub_group`, in order. The gradient tensors are multiplied in place by grad_multiplier
// when it is not 1. Throws c10::Error only on programming errors (dtype/shape mismatch).
void ApplyOptimizerStep(const spec::OptimizerConfig& config, const OptimizerStepArgs& args,
                        std::vector<OptimizerPartition>& sub_group);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_OPTIMIZER_H_
