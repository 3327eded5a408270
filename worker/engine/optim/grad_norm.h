// The local squared L2 norm of gradient partitions, Σ_i Σ_j g_ij² in fp64, in one read of each
// fp32 gradient (4 bytes per element) with no temporaries: the global-norm input of step
// validation (step_validation.h; DeepSpeed's get_global_norm squares and sums in fp32/fp64 the
// same way).
//
// Replaces `g.to(kDouble).pow(2).sum()` per partition, which allocates two fp64 copies and reads
// and writes 36 bytes per element: at a small micro-batch that was as much memory traffic as the
// whole CpuAdam step of ZeRO-Offload (docs/benchmarks.md, ZenFlow section). Each element is
// squared exactly in fp64 (a float's square fits a double's 53-bit mantissa exactly); the sum
// uses 8 interleaved fp64 accumulators (so it vectorises) added in a fixed order at the end, so
// the result is deterministic for a given input and differs from a sequential fp64 sum only by
// fp64 rounding (relative ~n·2^-53).
//
// Shapes: each tensor is a contiguous fp32 CPU tensor of any shape (undefined = no gradient,
// skipped); bf16/fp16 gradients are read through a fp32 copy. Thread-safety: pure function.
#ifndef LOOM_WORKER_ENGINE_OPTIM_GRAD_NORM_H_
#define LOOM_WORKER_ENGINE_OPTIM_GRAD_NORM_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace loom::engine::optim {

// Σ g[j]² over [0, n), in fp64.
double SumOfSquares(const float* g, int64_t n);

// Σ over the defined tensors of SumOfSquares of their elements.
double LocalSquaredNorm(const std::vector<at::Tensor>& grads);

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_GRAD_NORM_H_
