// ZeRO stages 0-3 (Rajbhandari et al., "ZeRO", SC'20; DeepSpeed stage_1_and_2.py, stage3.py,
// partition_parameters.py; docs/design/TECHNIQUES.md §1.3-§1.6) as the provider of ParamAccess. It
// sees only a list of ParamSpec (name, shape, kind): nothing model-specific (docs/engine.md).
//
// What Acquire / the gradient sink mean per stage:
//   stage 0  full replicas of params (param dtype), fp32 master and Adam state on every rank;
//            local gradients accumulate over micro-steps and are all-reduced (mean) in buckets
//            of reduce_bucket_size elements during the last micro-step's backward.
//   stage 1  as stage 0, but the optimizer state (fp32 master, m, v) is partitioned: at the last
//            micro-step the accumulated full gradients are reduce-scattered in buckets; after
//            the step the updated partitions are all-gathered (allgather_bucket_size buckets)
//            back into the replicas.
//   stage 2  as stage 1, but gradients are reduce-scattered every micro-step (owners accumulate
//            their fp32 partition), so no full gradient outlives its bucket.
//   stage 3  parameters are partitioned too: Acquire all-gathers (one collective per
//            parameter), with persistence of small params, a prefetch trace and reuse-distance
//            release (below).
// Partition layout (all stages, the checkpoint layout of storage/checkpoint/shard_format.h):
// every parameter of n elements is partitioned individually, p = ceil(n/N), rank r owns flat
// elements [r*p, min((r+1)p, n)) zero-padded to p. Reduce-scatters are coalesced per bucket of
// reduce_bucket_size elements (one StartReduceScatterSumCoalesced): every gradient in it is a
// zero-padded [N*p] fp32 buffer pre-divided by gradient_divide_factor (docs/design/TECHNIQUES.md
// §1.6 step 4). In stages 2/3 the linear and embedding backward write the weight gradient straight
// into that buffer (GradDestination/CommitGrad), and the reduced partition goes straight into the
// gradient partition when it is the first contribution since ClearGrads. In stage 1 the
// step's first contribution is written straight into the pooled [N*p] local accumulator the
// same way (later micro-steps add into it).
// One rank with fp32 gradient communication (stages 1-3): the reduction is the identity (p = n,
// the reduce-scatter a copy), so none runs: in stages 2/3 the first contribution since
// ClearGrads is written straight into the gradient partition (GradDestination hands out the
// partition itself) and later ones, deferred sums and stage 1's accumulator are copied or
// added into it at Flush; the values are the same bit for bit, and the grad-ready event of a
// directly written gradient is raised at its CommitGrad.
// Gradient deferral (ParamAccess::BeginGradDeferral): stages 2/3 sum the deferred contributions
// in one [N*p] buffer and reduce it once at EndGradDeferral; stages 0/1 accumulate locally
// anyway and reduce once per step.
// overlap_comm: bucket reductions are started asynchronously (at most two in flight) and waited
// at the end of backward. Large temporaries come from a BufferPool (counted as kBuffers while in
// use, kCached while idle). contiguous_gradients: gradient partitions are views into one flat
// fp32 buffer.
//
// Stage-3 fetching: parameters with numel <= param_persistence_threshold are persistent
// (gathered once, kept until the next optimizer step). During training micro-steps the first
// micro-step records the order of Acquire calls (the trace, forward and backward); later
// micro-steps replay it: after each fetch the next trace entries are all-gathered
// asynchronously, bounded by prefetch_bucket_size elements of not-yet-used prefetches and
// max_live_parameters live non-persistent elements; a released parameter whose next use is
// within max_reuse_distance elements stays gathered. When a fetch differs from the trace the
// trace is dropped (outstanding prefetches waited for and freed), fetching falls back to
// on-demand, and the next micro-step records a new trace. With a PartitionSource that serves
// partitions (offload_param nvme), replay also hints the reads of the partitions it is about to
// gather (ReadAhead); unused hints are dropped at FinishMicroStep.
//
// Mixed precision: param_dtype kBFloat16 -> bf16 params and activations; kHalf -> fp16 params
// with fp32 activations (LibTorch 1.13 on CPU has no fp16 matmul kernels). The optimizer works
// on fp32 master partitions. All tensors on CPU.
// Gradient communication dtype (DeepSpeed's communication_data_type; ZeroOptions::
// communication_dtype, default the param dtype for bf16, fp32 otherwise): a gradient's local
// contributions are summed in fp32 (the [N*p] buffer); with a 16-bit communication dtype
// (stages 1-3) that buffer, pre-divided, is rounded once to it and reduce-scattered in it
// (half the bytes of fp32; Collectives sums the 16-bit values in fp32 in rank order and rounds
// once), and the reduced [p] partition is added to the fp32 gradient partition, so gradient
// accumulation over micro-steps stays fp32 (DeepSpeed's grad_accum_dtype fp32). This holds for
// any param dtype: fp32 on a bf16 job reduces the fp32 buffer as it is; bf16 or fp16 on an fp32
// job rounds it (fp16: values beyond 65504 become inf, which the loss scaler / overflow check
// sees, as in DeepSpeed). Stage 0's all-reduce stays fp32 on the wire (Collectives' bf16
// all-reduce reduces an fp32 copy), so stage 0 takes no explicit 16-bit dtype.
//
// Every rank must make the same calls in the same order (collectives). Collective failures
// throw CollectiveError. Not thread-safe.
//
// Files: the knobs and initial values a caller chooses are in zero_options.h; Create (the
// partition layout, initial values, memory accounting) is in zero_create.cc, fetching in
// zero_fetch.cc, the gradient sink in zero_grads.cc, stage 1/2 refresh in zero_refresh.cc, and
// micro-step boundaries, refresh, norms and checkpoint partitions in zero_provider.cc.
#ifndef LOOM_WORKER_ENGINE_ZERO_ZERO_PROVIDER_H_
#define LOOM_WORKER_ENGINE_ZERO_ZERO_PROVIDER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/model_config.h"
#include "worker/engine/buffer_pool.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/param_access.h"
#include "worker/engine/partition.h"
#include "worker/engine/zero/memory_tracker.h"
#include "worker/engine/zero/partition_source.h"
#include "worker/engine/zero/zero_options.h"

namespace loom::engine {

struct ZeroParam {
  spec::ParamSpec spec;
  int64_t numel = 0;
  PartitionSlice slice;     // this rank's per-parameter partition (checkpoint layout)
  bool persistent = false;  // stage 3: numel <= param_persistence_threshold
  at::Tensor master;        // fp32 [m]: m = p (stages 1-3) or n (stage 0)
  at::Tensor exp_avg;       // fp32 [m] Adam first moment
  at::Tensor exp_avg_sq;    // fp32 [m] Adam second moment
  at::Tensor grad;          // fp32 [m] reduced mean gradient (stage 0: also the local
                            // accumulator); undefined until the first reduction of a step
  at::Tensor local_grad;    // stage 1: fp32 [N*p] local accumulator over micro-steps
  at::Tensor replica;       // stages 0-2: full parameter [shape], param dtype (a view of
                            // master: stage 0 fp32, and ZeroOptions::params_view_masters)
  at::Tensor shard;         // stage 3: [p] param dtype (the master itself when fp32)
  bool shard_offloaded = false;  // stage 3 offload_param nvme: master/shard are stride-0
                                 // placeholders; all-gathers read PartitionSource::Fetch
};

class ZeroProvider : public ParamAccess {
 public:
  // Builds the parameters of `specs` (in order; ids are indexes). `collectives` must outlive the
  // provider. Errors: INVALID_ARGUMENT for a stage outside 0-3; `init.from`'s read errors
  // (NOT_FOUND, INVALID_ARGUMENT) and PartitionSource::OnParamBuilt's as they are.
  static absl::StatusOr<std::unique_ptr<ZeroProvider>> Create(std::vector<spec::ParamSpec> specs,
                                                              Collectives* collectives,
                                                              const ParamInit& init,
                                                              const ZeroOptions& options = {});

  // ParamAccess.
  const std::vector<spec::ParamSpec>& param_specs() const override { return specs_; }
  const at::Tensor& Acquire(ParamId i) override;
  void Release(ParamId i) override;
  void NoteUse(ParamId i) override;
  at::Tensor GradDestination(ParamId i, at::ScalarType compute_dtype) override;
  void CommitGrad(ParamId i) override;
  void AddGrad(ParamId i, const at::Tensor& full_grad) override;
  void BeginGradDeferral(const std::vector<ParamId>& ids) override;
  void EndGradDeferral(const std::vector<ParamId>& ids) override;
  at::ScalarType activation_dtype() const override;
  const at::Tensor& anchor() const override { return anchor_; }

  // Training micro-steps: BeginMicroStep before the forward (last = the last micro-step of the
  // optimizer step), FinishMicroStep after backward (flushes and waits for gradient reductions,
  // raises the remaining grad-ready events, frees gathered params). After the last micro-step
  // params()[i].grad holds the mean gradient (partition for stages 1-3, full for stage 0).
  void BeginMicroStep(bool last);
  void FinishMicroStep();
  // After the optimizer updated the fp32 masters: refreshes the compute copies (stage 0 cast,
  // stage 1/2 on one rank a copy, or nothing with ZeroOptions::params_view_masters; stage 1/2
  // all-gather of each partition straight into its replica, zero_refresh.cc: with
  // fp32 params started and left in flight, each waited by its parameter's next Acquire and
  // all by FinishMicroStep / LoadPartition / the next RefreshParams, so the masters must not be
  // written before one of those; stage 3 shard cast and persistent params released). Also used
  // after loading a checkpoint. Collective for stages 1/2.
  void RefreshParams();
  // Drops the gradients (contiguous buffer zeroed and kept; on one rank with an fp32 wire the
  // zeroing is deferred: each gradient's first write overwrites it, and the partitions no
  // micro-step wrote are zeroed at the end of the last micro-step, so params()[i].grad is only
  // meaningful after that FinishMicroStep).
  void ClearGrads();
  // Σ ||grad||^2 (double) over this rank's gradient storage (padding is zero). Stages 1-3 need
  // an all-reduce SUM over ranks to get the global value; stage 0 holds it fully. Squares and
  // sums each gradient in one double buffer of the largest gradient's size.
  double LocalGradSquaredNorm() const;
  bool any_nonfinite_grad() const;
  bool grads_partitioned() const { return options_.stage >= 1; }

  // The full parameter i as fp32 (a collective for stage 3), shape spec.shape.
  at::Tensor GatherFull(ParamId i);
  // This rank's partition [p] of parameter i's master / exp_avg / exp_avg_sq (which = 0, 1, 2),
  // the checkpoint layout for every stage (stage 0 slices its full replica).
  at::Tensor CheckpointPartition(ParamId i, int which) const;
  // Sets parameter i's master (which = 0), exp_avg (1) or exp_avg_sq (2) from this rank's
  // partition (p floats). Stage 0 all-gathers the full tensor (collective). Call RefreshParams
  // after the last.
  void LoadPartition(ParamId i, int which, const float* src);

  std::vector<ZeroParam>& params() { return params_; }
  const ZeroOptions& options() const { return options_; }
  void set_grad_ready_listener(GradReadyListener* l) { options_.grad_ready_listener = l; }
  // A writer of master partitions that may still run after the optimizer step returned (ZenFlow's
  // deferred selective update, optim/zenflow_pipeline.h): the provider calls fence(i) on the
  // calling thread before anything it does reads or writes master i (Acquire, GatherFull,
  // CheckpointPartition, LoadPartition, RefreshParams), and fence(i) returns once no such write
  // is in flight. Only meaningful where the parameter forward reads is the master itself
  // (params_view_masters()), so that the wait lands at the parameter's first use in the next
  // forward. Empty function: none (the default). Set it from the training thread, between steps.
  void set_master_fence(std::function<void(ParamId)> fence) { master_fence_ = std::move(fence); }
  // ZeroOptions::params_view_masters took effect (one rank, fp32 params, stages 1-3).
  bool params_view_masters() const { return replica_views_master_ || gather_views_shard_; }
  // 2 when ZeroOptions::double_buffer_grads took effect: the gradients of step s stay intact
  // until the ClearGrads before step s + 2's backward; else 1 (until the next ClearGrads).
  int gradient_buffers() const {
    return options_.double_buffer_grads && options_.contiguous_gradients && identity_reduction()
               ? 2
               : 1;
  }
  // Σ m * 4: bytes of this rank's fp32 master (= Σ p * 4 for stages 1-3, Σ n * 4 for stage 0).
  int64_t partition_bytes() const;
  MemoryTracker& memory() { return memory_; }
  Collectives& collectives() { return *collectives_; }
  // The resolved gradient communication dtype (options().communication_dtype, default applied).
  at::ScalarType grad_communication_dtype() const;
  // Stage-3 prefetch statistics since construction.
  int64_t prefetch_hits() const { return prefetch_hits_; }
  int64_t trace_invalidations() const { return trace_invalidations_; }
  int64_t on_demand_fetches() const { return on_demand_fetches_; }

 private:
  struct Live {
    at::Tensor input;   // the fetched partition when it is not the shard (kept until done)
    at::Tensor buffer;  // [N*p]
    at::Tensor full;    // view [shape]
    std::unique_ptr<PendingCollective> pending;
    int uses = 0;
    bool prefetched_unused = false;
    bool view = false;  // full is a view of the shard (gather_views_shard_): nothing to free
    MemoryKind kind = MemoryKind::kBuffers;
  };
  struct Reduction {
    std::unique_ptr<PendingCollective> pending;
    at::Tensor send;                   // stage 0: the concatenated bucket (all-reduced)
    std::vector<at::Tensor> fulls;     // stages 1-3: [N*p] per bucket entry
    std::vector<at::Tensor> parts;     // stages 1-3: [p] reduced partition per entry
    std::vector<char> direct;          // first reduction since ClearGrads: parts[b] is the
                                       // gradient partition itself (fp32 wire) or is copied in
    bool wire16 = false;               // fulls/parts are 16-bit copies (communication_dtype)
    std::vector<size_t> ids;
    std::vector<int64_t> offsets;      // stage 0: each entry's offset in send
    int64_t bytes = 0;
  };
  enum class TraceMode { kRecord, kReplay, kOff };

  ZeroProvider(std::vector<spec::ParamSpec> specs, Collectives* collectives,
               const ZeroOptions& options)
      : specs_(std::move(specs)), collectives_(collectives), options_(options) {}
  // zero_fetch.cc
  std::map<size_t, Live>::iterator StartGather(size_t i);
  void Free(std::map<size_t, Live>::iterator it);
  void IssuePrefetches();
  void InvalidateTrace();
  bool ReusedSoon(size_t i) const;
  void FreeGathered();  // FinishMicroStep's stage-3 part
  // zero_grads.cc
  void EnsureGrad(ZeroParam& p);
  // contiguous_gradients: points every parameter's grad at its slice of grad_flat_.
  void ViewGradsInFlat();
  at::Tensor NewGradBuffer(size_t i);
  at::Tensor NewLocalGrad(size_t i);  // stage 1: a pooled [N*p] accumulator counted as kGrads
  void PutLocalGrad(ZeroParam& p);   // back to the pool once reduced
  void Enqueue(size_t i, const at::Tensor& flat);
  void Flush();
  void FlushIdentity();  // Flush at one rank with an fp32 wire (identity_reduction)
  void CompleteOldest();
  void FlushGrads();  // FinishMicroStep's gradient part
  // zero_refresh.cc: RefreshParams' stage 1/2 all-gathers; waits for a replica's / all
  // in-flight direct gathers (CollectiveError on a failed one, unless throw_errors is false).
  void RefreshReplicas();
  void WaitReplica(size_t i);
  void WaitReplicas(bool throw_errors = true);
  void MaybeGradReady(size_t i);
  double divide_factor() const;
  // Stages 1-3 on one rank with fp32 gradient communication: the reduce-scatter of a [p] = [n]
  // buffer is a copy, so gradients go into the gradient partition directly (zero_grads.cc).
  bool identity_reduction() const {
    return options_.stage >= 1 && collectives_->world_size() == 1 &&
           grad_communication_dtype() == at::kFloat;
  }
  bool sources_partitions() const {
    return options_.partition_source != nullptr && options_.partition_source->serves_partitions();
  }

  std::vector<spec::ParamSpec> specs_;
  Collectives* collectives_;
  ZeroOptions options_;
  MemoryTracker memory_;
  BufferPool pool_{[this](int64_t in_use, int64_t idle) {
    // Acquire first so that a move between the kinds never dips the total.
    if (in_use > 0) memory_.Acquire(MemoryKind::kBuffers, in_use);
    if (idle > 0) memory_.Acquire(MemoryKind::kCached, idle);
    if (in_use < 0) memory_.Release(MemoryKind::kBuffers, -in_use);
    if (idle < 0) memory_.Release(MemoryKind::kCached, -idle);
  }};
  std::vector<ZeroParam> params_;
  at::Tensor anchor_;  // empty leaf requiring grad: makes every op part of the autograd graph

  // Gradient reduction (per param vectors sized in Create).
  bool last_micro_ = true;
  bool in_micro_step_ = false;
  std::vector<int> grad_expected_, grad_seen_;  // per param, this micro-step
  std::vector<char> touched_;   // per param: got a gradient since the last ClearGrads
  std::vector<char> enqueued_;  // per param: queued for reduction in this micro-step
  std::vector<char> grad_written_;   // per param: grad holds a reduction since ClearGrads
  std::vector<at::Tensor> grad_out_;  // per param: the buffer GradDestination handed out
  std::vector<char> grad_out_direct_;  // per param: grad_out_ is the gradient partition itself
  std::vector<int> deferral_depth_;       // per param: open GradDeferrals
  std::vector<at::Tensor> deferred_;      // per param: stages 2/3 summed [N*p] contributions
  std::vector<int> reductions_in_flight_;  // per param: queued or started, not completed
  std::vector<char> ready_raised_;        // per param: OnPartitionGradReady in this step
  std::vector<std::pair<size_t, at::Tensor>> bucket_;
  int64_t bucket_elems_ = 0;
  std::deque<Reduction> in_flight_;
  at::Tensor grad_flat_;  // contiguous_gradients storage
  at::Tensor grad_flat_other_;  // double_buffer_grads: the previous step's (ClearGrads swaps)
  bool grads_stale_ = false;  // one rank: ClearGrads left grad_flat_ unzeroed (FlushGrads zeroes)
  // Stages 1/2: per param, the direct all-gather into its replica still in flight (or null).
  std::vector<std::unique_ptr<PendingCollective>> replica_pending_;
  int64_t replicas_pending_ = 0;
  bool replica_views_master_ = false;  // params_view_masters took effect at stage 1/2
  bool gather_views_shard_ = false;    // params_view_masters took effect at stage 3
  std::function<void(ParamId)> master_fence_;  // set_master_fence (empty: none)

  // Stage-3 fetching.
  std::map<size_t, Live> live_;
  TraceMode trace_mode_ = TraceMode::kRecord;
  std::vector<size_t> trace_, recording_;
  size_t trace_pos_ = 0, prefetch_pos_ = 0, read_ahead_pos_ = 0;
  int64_t live_elems_ = 0, prefetch_elems_ = 0;
  int64_t prefetch_hits_ = 0, trace_invalidations_ = 0, on_demand_fetches_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_ZERO_PROVIDER_H_
