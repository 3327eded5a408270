// ZeRO stage-3 partition arithmetic (DeepSpeed partition_parameters.py; docs/design/TECHNIQUES.md
// §1.3, §1.11): every parameter of n elements is partitioned individually over N ranks with
// p = ceil(n / N); rank r owns flat elements [r*p, min((r+1)*p, n)), zero-padded to p elements.
// Concatenating the N partitions and truncating to n reproduces the flat parameter.
// Torch-free. Thread-safe (pure functions).
#ifndef LOOM_WORKER_ENGINE_PARTITION_H_
#define LOOM_WORKER_ENGINE_PARTITION_H_

#include <algorithm>
#include <cstdint>

namespace loom::engine {

struct PartitionSlice {
  int64_t partition_numel = 0;  // p = ceil(n / N): every rank stores exactly p elements
  int64_t begin = 0;            // first owned flat element (may be >= n for trailing ranks)
  int64_t end = 0;              // one past the last owned flat element, <= n
  int64_t valid() const { return end - begin; }          // real elements on this rank
  int64_t padding() const { return partition_numel - valid(); }  // zero padding on this rank
};

// p = ceil(n / N). n >= 0, N >= 1.
inline int64_t PartitionNumel(int64_t numel, int64_t world_size) {
  return (numel + world_size - 1) / world_size;
}

// Total padding N*p - n of one parameter.
inline int64_t TotalPadding(int64_t numel, int64_t world_size) {
  return PartitionNumel(numel, world_size) * world_size - numel;
}

inline PartitionSlice ComputePartition(int64_t numel, int64_t world_size, int64_t rank) {
  PartitionSlice s;
  s.partition_numel = PartitionNumel(numel, world_size);
  s.begin = std::min(rank * s.partition_numel, numel);
  s.end = std::min((rank + 1) * s.partition_numel, numel);
  return s;
}

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_PARTITION_H_
