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

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace loom::engine::optim {

// Σ g[j]² over [0, n), in fp64.
double SumOfSquares(const float* g, int64_t n);

// Σ over the defined tensors of SumOfSquares of their elements.
double LocalSquaredNorm(const std::vector<at::Tensor>& grads);

// Per-parameter SumOfSquares values computed ahead of step validation by a pipeline's helper
// thread while backward runs (OptimizerPipeline::ComputedSquaredNorm), each tagged with the
// pipeline's step epoch (a counter the pipeline advances at every BeginStep, so that a value
// from an earlier step, or from a rolled-back attempt at the same step number, never passes for
// this one).
// Thread-safety: Publish(i, ...) from one thread at a time per parameter; Get from any thread;
// a value is visible to Get once Publish has returned (release/acquire on the epoch).
class ReadySquaredNorms {
 public:
  explicit ReadySquaredNorms(size_t n)
      : n_(n), sq_(new std::atomic<double>[n]), epoch_(new std::atomic<int64_t>[n]) {
    for (size_t i = 0; i < n; ++i) {
      sq_[i].store(0.0, std::memory_order_relaxed);
      epoch_[i].store(0, std::memory_order_relaxed);  // epochs count from 1
    }
  }
  size_t size() const { return n_; }
  void Publish(size_t i, int64_t epoch, double squared_norm) {
    sq_[i].store(squared_norm, std::memory_order_relaxed);
    epoch_[i].store(epoch, std::memory_order_release);
  }
  // False when i is out of range or its value is not from `epoch`.
  bool Get(size_t i, int64_t epoch, double* squared_norm) const {
    if (i >= n_ || epoch_[i].load(std::memory_order_acquire) != epoch) return false;
    *squared_norm = sq_[i].load(std::memory_order_relaxed);
    return true;
  }

 private:
  size_t n_;
  std::unique_ptr<std::atomic<double>[]> sq_;
  std::unique_ptr<std::atomic<int64_t>[]> epoch_;
};

}  // namespace loom::engine::optim

#endif  // LOOM_WORKER_ENGINE_OPTIM_GRAD_NORM_H_
