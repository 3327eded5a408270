// What the Collectives implementations (collectives.cc, gloo_collectives.cc) share, so that
// they refuse the same arguments with the same messages and record the same hash: the argument
// checks of each collective, the operation codes passed to Collectives::Record, and a handle
// that is already complete. Not part of the engine's API: include it only from an
// implementation of Collectives.
//
// Shapes (collectives.h): part [p], full [N*p] for gathers and reduce-scatters; all-to-all
// input and output [N*c]; all contiguous and 1-d, of one dtype per call. N is `world`.
// Thread-safety: free functions without state; a Done() handle is confined to its caller.
#ifndef LOOM_WORKER_ENGINE_COLLECTIVES_INTERNAL_H_
#define LOOM_WORKER_ENGINE_COLLECTIVES_INTERNAL_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "worker/engine/collectives.h"

namespace loom::engine::collectives_internal {

// Codes of Collectives::Record. Fixed values: they enter collective_hash(), which ranks compare.
enum Op {
  kAllGather = 1,
  kReduceScatter = 2,
  kAllReduce = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kAllToAll = 6,
  kNewSubgroup = 7,
};

// INVALID_ARGUMENT unless part [p] and full [world*p] are contiguous, 1-d and of one dtype.
absl::Status CheckShapes(const at::Tensor& part, const at::Tensor& full, int world);
// CheckShapes for every (parts[k], fulls[k]); INVALID_ARGUMENT also when the counts differ.
absl::Status CheckCoalesced(const std::vector<at::Tensor>& fulls,
                            const std::vector<at::Tensor>& parts, int world);
// INVALID_ARGUMENT unless input and output are contiguous 1-d [world*c] of one dtype and
// output does not alias input.
absl::Status CheckAllToAll(const at::Tensor& input, const at::Tensor& output, int world);
// Subgroup ranks: non-empty, strictly increasing, in [0, world); name non-empty without '/'.
// INVALID_ARGUMENT naming the offending rank or the name otherwise.
absl::Status CheckSubgroup(const std::vector<int>& ranks, absl::string_view name, int world);

// A handle whose Wait() returns `s` at once (a collective refused by a check, or done locally).
std::unique_ptr<PendingCollective> Done(absl::Status s = absl::OkStatus());

}  // namespace loom::engine::collectives_internal

#endif  // LOOM_WORKER_ENGINE_COLLECTIVES_INTERNAL_H_
