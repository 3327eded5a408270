// What a caller chooses when it builds a ZeroProvider (zero_provider.h): the engine-side ZeRO
// knobs (ZeroOptions, DeepSpeed's zero_optimization section as the engine reads it) and where
// the parameters' initial values come from (ParamInit). What each knob does to the stages is
// documented in zero_provider.h; sizes here are in elements, bytes are named so.
// Plain values: copy them freely; thread-safety is the provider's (not thread-safe).
#ifndef LOOM_WORKER_ENGINE_ZERO_ZERO_OPTIONS_H_
#define LOOM_WORKER_ENGINE_ZERO_ZERO_OPTIONS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "worker/engine/hf_weights.h"
#include "worker/engine/zero/partition_source.h"

namespace loom::engine {

// Engine-side ZeRO knobs (docs/design/TECHNIQUES.md §1.9; sizes in elements).
struct ZeroOptions {
  int stage = 3;
  at::ScalarType param_dtype = at::kFloat;  // kFloat, kBFloat16 or kHalf
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool contiguous_gradients = true;
  bool overlap_comm = true;
  int64_t prefetch_bucket_size = 50000000;
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  // Every gradient contribution is divided by this before its reduction (sum over ranks), so
  // the reduced gradient is the mean over this many replicas. 0: the world size (data
  // parallelism over every rank); sequence parallelism (issue 13) sets dp x sp.
  double gradient_divide_factor = 0;
  // Dtype of the gradient reduce-scatters (stages 1-3): kFloat, kBFloat16 or kHalf;
  // kUndefined: kBFloat16 when param_dtype is kBFloat16 (DeepSpeed's default, the param dtype),
  // else kFloat (fp16 jobs keep fp32: their gradients are loss-scaled). Any of the three with
  // any param_dtype (e.g. bf16 on an fp32 job: rounded, reduced, added back in fp32). Create
  // refuses other dtypes, and a 16-bit one at stage 0 (its all-reduce is fp32).
  at::ScalarType communication_dtype = at::ScalarType::Undefined;
  // false: exp_avg / exp_avg_sq stay undefined (an offloaded optimizer keeps them).
  bool allocate_optimizer_state = true;
  // Offload (worker/engine/offload): see PartitionSource. Not owned; must outlive the provider.
  PartitionSource* partition_source = nullptr;
  // "Partition gradient ready" events. Not owned; may also be set by set_grad_ready_listener.
  GradReadyListener* grad_ready_listener = nullptr;
  // One rank with fp32 params (stages 1-3; p = n there): the parameter that forward and backward
  // read is a view of its fp32 master, so a write of a master is at once a write of that
  // parameter. Stages 1/2: the replica is the master's view and RefreshParams copies nothing.
  // Stage 3: Acquire returns a view of the shard (the master itself) and gathers nothing: no
  // buffer, no copy, and a persistent parameter holds no second copy (a 1-rank "all-gather" was a
  // copy of every parameter in forward and again in backward: 11% of a small offload step,
  // docs/benchmarks.md). Set it only when no master is written while forward or backward may
  // still read its parameter:
  //   - the in-memory and the synchronous offload optimizer: they step in FinishStep, on the
  //     training thread; LoadPartition likewise;
  //   - SuperOffload: its speculative step writes a sub-group's masters only once that
  //     sub-group's gradients are complete (the grad-ready event, raised after the parameter's
  //     last expected contribution), and every op reads its parameter before it hands over the
  //     gradient (autograd_ops.h: dx before dW), so nothing reads that parameter again before the
  //     next step's forward, which starts after FinishStep waited for every speculative step
  //     (and after a rollback restored the masters);
  //   - ZenFlow: its overlapped CPU step writes its own fp32 copy of each partition and the
  //     moments, never a master; the masters are written by Publish in FinishStep and by the
  //     selective update, in FinishStep or, deferred to its host thread, behind the master
  //     fence (set_master_fence) that every Acquire of the parameter waits on
  //     (zenflow_pipeline.h).
  // Ignored otherwise (bf16/fp16 params, more than one rank, stage 0 whose fp32 replica is
  // always the master, and stage 3 with offload_param nvme, which reads the partition from its
  // file).
  bool params_view_masters = false;
  // One rank with an fp32 wire and contiguous_gradients (the reduction is the identity): two
  // gradient buffers, ClearGrads switching between them, so that an optimizer still reading the
  // last step's gradients (ZenFlow's host-thread accumulation) may keep reading them through the
  // next backward, which writes the other buffer. Costs 4 bytes per parameter (counted as
  // kGrads). Ignored otherwise; gradient_buffers() says whether it took effect.
  bool double_buffer_grads = false;
};

// How parameters get their initial values. Parameter i's full tensor is drawn from a CPU
// generator seeded with Mix64(seed ^ Mix64(i + 1)): normal(0, initializer_range) for
// embedding/linear weights (zeros when initializer_range <= 0), ones for norm weights,
// identically for every world size and stage. With `from` (fine-tuning), values are read from
// that Hugging Face export by name instead.
struct ParamInit {
  uint64_t seed = 0;
  double initializer_range = 0.02;
  const HfWeights* from = nullptr;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_ZERO_OPTIONS_H_
