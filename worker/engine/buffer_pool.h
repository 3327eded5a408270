// A free list of large CPU tensors keyed by (dtype, element count).
//
// A ZeRO-3 training step gathers the same parameters and reduces the same gradients every step,
// so its large temporaries (gathered weights, gradient buckets, reduce-scatter outputs) repeat
// the same sizes in the same order. Taking them from this pool instead of malloc keeps them out
// of glibc's heap, where 1-32 MiB blocks freed in a different order than they were allocated
// leave the process holding hundreds of MiB it does not use (measured: bench/zero_bench.py,
// docs/benchmarks.md), and avoids faulting in fresh pages every step. A general-purpose caching
// allocator (jemalloc, tcmalloc) would also cut the retention, but measured 1.7x slower steps
// here with jemalloc's default purging; the pool only holds what the step reuses.
//
// Buffers idle for a whole Trim period (e.g. one micro-step) are freed by Trim, so a size the
// model stops using does not stay resident. The pool reports every byte it holds (in use or
// idle) to `on_bytes(in_use_delta, idle_delta)`, so memory accounting stays honest: a new buffer
// is (+n, 0), one taken from the free list (+n, -n), one given back (-n, +n), one freed by Trim
// (0, -n), one given back but still viewed elsewhere (-n, 0: no longer the pool's).
// Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_BUFFER_POOL_H_
#define LOOM_WORKER_ENGINE_BUFFER_POOL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace loom::engine {

class BufferPool {
 public:
  using Accounting = std::function<void(int64_t in_use_delta, int64_t idle_delta)>;
  explicit BufferPool(Accounting on_bytes = nullptr)
      : on_bytes_(std::move(on_bytes)) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A contiguous 1-d CPU tensor of `numel` elements of `dtype`; contents are unspecified.
  at::Tensor Get(int64_t numel, at::ScalarType dtype);
  // Gives back a tensor that Get returned. If anything else still refers to its storage (a view
  // kept elsewhere), it is not reused: the pool forgets it and the last user frees it.
  void Put(at::Tensor t);
  // Frees idle buffers that were not handed out since the previous Trim.
  void Trim();
  // Bytes handed out and not given back; bytes idle in the free list.
  int64_t in_use_bytes() const { return in_use_bytes_; }
  int64_t idle_bytes() const { return idle_bytes_; }

 private:
  struct Idle {
    at::Tensor t;
    bool used = false;  // handed out (and back) since the last Trim
  };
  using Key = std::pair<int, int64_t>;
  void Account(int64_t in_use, int64_t idle);

  Accounting on_bytes_;
  std::map<Key, std::vector<Idle>> idle_;
  int64_t in_use_bytes_ = 0;
  int64_t idle_bytes_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_BUFFER_POOL_H_
