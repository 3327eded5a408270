// Bytes a rank holds per kind of model state, current and peak since ResetPeaks(). Torch-free.
// Thread-safe (one mutex).
#ifndef LOOM_WORKER_ENGINE_ZERO_MEMORY_TRACKER_H_
#define LOOM_WORKER_ENGINE_ZERO_MEMORY_TRACKER_H_

#include <cstdint>
#include <mutex>

namespace loom::engine {

//   kParams           parameters in param dtype: replicas (stages 0-2), the rank's partition and
//                     persistent gathered params (stage 3); the fp32 master when it is the same
//                     tensor (fp32 stage 0 / stage 3)
//   kGrads            fp32 gradient accumulators and partitions
//   kOptimizerStates  Adam m and v, plus the fp32 master when it is a separate tensor
//   kBuffers          temporary, in use: gathered full params (stage 3), reduction buckets,
//                     all-gather buffers
//   kCached           idle buffers the provider's BufferPool keeps for reuse by the next
//                     micro-step (resident, like PyTorch's reserved-but-unallocated memory)
//   kActivationOffload checkpointed decoder-layer inputs held in host memory between forward
//                     and their recompute (model/activation_checkpoint.h, cpu_checkpointing)
enum class MemoryKind {
  kParams = 0,
  kGrads = 1,
  kOptimizerStates = 2,
  kBuffers = 3,
  kCached = 4,
  kActivationOffload = 5,
};
inline constexpr int kNumMemoryKinds = 6;

class MemoryTracker {
 public:
  void Acquire(MemoryKind kind, int64_t bytes);
  void Release(MemoryKind kind, int64_t bytes);
  int64_t current(MemoryKind kind) const;
  int64_t peak(MemoryKind kind) const;
  int64_t current_total() const;
  int64_t peak_total() const;  // peak of the sum over kinds
  void ResetPeaks();

 private:
  mutable std::mutex mu_;
  int64_t cur_[kNumMemoryKinds] = {};
  int64_t peak_[kNumMemoryKinds] = {};
  int64_t total_ = 0;
  int64_t peak_total_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_MEMORY_TRACKER_H_
