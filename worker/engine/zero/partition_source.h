// The two hooks a ZeroProvider offers to the code around it (docs/engine.md):
//   PartitionSource    where parameter partitions live when they are not plain tensors in memory
//                      (ZeRO-Offload / ZeRO-Infinity, worker/engine/offload;
//                      docs/design/TECHNIQUES.md §1.7-1.8): one named interface instead of four
//                      std::function hooks.
//   GradReadyListener  "partition gradient ready" events for an optimizer pipeline.
#ifndef LOOM_WORKER_ENGINE_ZERO_PARTITION_SOURCE_H_
#define LOOM_WORKER_ENGINE_ZERO_PARTITION_SOURCE_H_

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "worker/engine/model/param_access.h"

namespace loom::engine {

struct ZeroParam;

// Called by the provider on its training thread; implementations need no locking of their own
// against the provider.
class PartitionSource {
 public:
  virtual ~PartitionSource() = default;
  // Parameter i right after it is built (in id order): may take its values and, for stage-3
  // parameter offload, replace master/shard by stride-0 placeholders and set shard_offloaded.
  // An error aborts ZeroProvider::Create and is returned as it is.
  virtual absl::Status OnParamBuilt(ParamId i, ZeroParam& p) = 0;
  // True when stage-3 all-gathers read Fetch(i) instead of the in-memory shard.
  virtual bool serves_partitions() const { return false; }
  // Stage 3 (serves_partitions): parameter i's partition [p] (fp32 or param dtype) to
  // all-gather. May throw CollectiveError with the read's status.
  virtual at::Tensor Fetch(ParamId i) { return at::Tensor(); }
  // Stage 3 (serves_partitions), while a prefetch trace is replayed: i's partition will be
  // fetched soon, so its read may start now. False: no more reads can be in flight (hints stop
  // until the next fetch).
  virtual bool ReadAhead(ParamId i) { return false; }
  // Waits for and discards reads no fetch took; called at the end of every micro-step, before
  // the optimizer may rewrite the partitions.
  virtual void DropReadAhead() {}
};

// Partition gradient ready: parameter i's reduced gradient partition (ZeroParam::grad) is final
// for this optimizer step. Raised in the last micro-step of a step, after the last reduction of
// i completed (during backward with overlap_comm, else by FinishMicroStep), once per parameter
// that got a gradient, in completion order (bucket order; ties by id). Called on the training
// thread; the listener must not call back into the provider's gradient functions.
class GradReadyListener {
 public:
  virtual ~GradReadyListener() = default;
  virtual void OnPartitionGradReady(ParamId i) = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_PARTITION_SOURCE_H_
