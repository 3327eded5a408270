// Internal helpers shared by the zero_*.cc files of ZeroProvider. Not a public header.
#ifndef LOOM_WORKER_ENGINE_ZERO_ZERO_COMMON_H_
#define LOOM_WORKER_ENGINE_ZERO_ZERO_COMMON_H_

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "worker/engine/model/param_access.h"

namespace loom::engine::zero_internal {

inline void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw CollectiveError(s);
}

// bf16 tensors travel through Gloo as fp16 bit patterns (same element size; gathers only copy).
inline at::Tensor Wire(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

inline int64_t Bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

}  // namespace loom::engine::zero_internal

#endif  // LOOM_WORKER_ENGINE_ZERO_ZERO_COMMON_H_
