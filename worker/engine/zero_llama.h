// A Llama decoder (Hugging Face LlamaForCausalLM semantics) trained with ZeRO stages 0-3
// (Rajbhandari et al., "ZeRO", SC'20; DeepSpeed stage_1_and_2.py, stage3.py,
// partition_parameters.py; TECHNIQUES.md §1.3-§1.6).
//
// Every linear / embedding / RMSNorm op is a custom autograd function that asks the model for
// its full weight (AcquireFull) just before use and gives it back right after (ReleaseFull); in
// backward it computes the full weight's gradient and hands it to the model (AddGrad). What
// that means depends on the stage:
//   stage 0  full replicas of params (param dtype), fp32 master and Adam state on every rank;
//            local gradients accumulate over micro-steps and are all-reduced (mean) in buckets
//            of reduce_bucket_size elements during the last micro-step's backward.
//   stage 1  as stage 0, but the optimizer state (fp32 master, m, v) is partitioned: at the last
//            micro-step the accumulated full gradients are reduce-scattered in buckets; after
//            the step the updated partitions are all-gathered (allgather_bucket_size buckets)
//            back into the replicas.
//   stage 2  as stage 1, but gradients are reduce-scattered every micro-step (owners accumulate
//            their fp32 partition), so no full gradient outlives its bucket.
//   stage 3  parameters are partitioned too: AcquireFull all-gathers (one collective per
//            parameter), with persistence of small params, a prefetch trace and reuse-distance
//            release (below).
// Partition layout (all stages, the checkpoint layout of storage/checkpoint/shard_format.h):
// every parameter of n elements is partitioned individually, p = ceil(n/N), rank r owns flat
// elements [r*p, min((r+1)p, n)) zero-padded to p. (DeepSpeed's stage 1/2 flattens all params
// into one buffer and cuts it in N equal pieces; Loom keeps the per-parameter cut for every stage
// so checkpoints and consolidation are stage-independent.) Reduce-scatters are coalesced per
// bucket of reduce_bucket_size elements (one StartReduceScatterSumCoalesced): every gradient in
// it is a zero-padded [N*p] fp32 buffer pre-divided by N (TECHNIQUES.md §1.6 step 4). In stages
// 2/3 the linear and embedding backward write the weight gradient straight into that buffer
// (GradDestination/CommitGrad: no full-size copy), and the reduced partition goes straight into
// the gradient partition when it is the first contribution since ClearGrads.
// overlap_comm: bucket reductions are started asynchronously (at most two in flight) and waited
// at the end of backward, so communication of bucket k overlaps the rest of backward.
// Large temporaries (stage-3 gather buffers, gradient buffers, reduce outputs) come from a
// BufferPool (reused by size across steps, idle ones freed after a micro-step without use),
// counted as kBuffers while in use and kCached while idle.
// contiguous_gradients: gradient partitions are views into one preallocated flat fp32 buffer
// (otherwise one tensor per parameter, allocated on first use and freed after the step).
//
// Stage-3 fetching: parameters with numel <= param_persistence_threshold are persistent
// (gathered once, kept until the next optimizer step). During training micro-steps
// (BeginMicroStep .. FinishMicroStep) the first micro-step records the order of AcquireFull
// calls (the trace, forward and backward); later micro-steps replay it: after each fetch the
// next trace entries are all-gathered asynchronously, bounded by prefetch_bucket_size elements
// of not-yet-used prefetches and max_live_parameters live non-persistent elements; a released
// parameter whose next use in the trace is within max_reuse_distance elements stays gathered.
// When a fetch differs from the trace (dynamic order) the trace is dropped: outstanding
// prefetches are waited for and freed (every rank issued them, so no collective is left
// unmatched), fetching falls back to on-demand, and the next micro-step records a new trace.
// Because gathers only move bytes, results are identical with and without prefetching.
// With fetch_partition (offload_param nvme) and read_ahead set, replay also hints the file reads
// of the partitions it is about to gather and of the trace entries after them (the hook decides
// how many run at once); a hinted read no fetch takes is dropped at FinishMicroStep.
//
// Mixed precision: param_dtype kBFloat16 -> bf16 params and activations; kHalf -> fp16 params
// (stored and communicated in fp16) with fp32 activations (LibTorch 1.13 on CPU has no fp16
// matmul/activation kernels), for loss scaling. Gradients are reduced and accumulated in fp32;
// the optimizer works on fp32 master partitions.
//
// Every rank must call Forward (and backward) on tensors of the same shapes in the same order:
// the gathers and reductions are collectives. Collective failures throw CollectiveError (catch
// at the engine boundary). Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_ZERO_LLAMA_H_
#define LOOM_WORKER_ENGINE_ZERO_LLAMA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/buffer_pool.h"
#include "worker/engine/collectives.h"
#include "worker/engine/hf_weights.h"
#include "worker/engine/model_config.h"
#include "worker/engine/partition.h"

namespace loom::engine {

// Thrown from inside forward/backward when a collective fails; carries the status.
class CollectiveError : public std::runtime_error {
 public:
  explicit CollectiveError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Bytes this rank holds per kind of state, current and peak since ResetPeaks(). Thread-safe.
//   kParams           parameters in param dtype: replicas (stages 0-2), the rank's partition and
//                     persistent gathered params (stage 3); the fp32 master when it is the same
//                     tensor (fp32 stage 0 / stage 3)
//   kGrads            fp32 gradient accumulators and partitions
//   kOptimizerStates  Adam m and v, plus the fp32 master when it is a separate tensor
//   kBuffers          temporary, in use: gathered full params (stage 3), reduction buckets,
//                     all-gather buffers
//   kCached           idle buffers the model's BufferPool keeps for reuse by the next
//                     micro-step (resident, like PyTorch's reserved-but-unallocated memory)
enum class MemoryKind { kParams = 0, kGrads = 1, kOptimizerStates = 2, kBuffers = 3, kCached = 4 };
inline constexpr int kNumMemoryKinds = 5;

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

struct ZeroParam;

// Engine-side ZeRO knobs (TECHNIQUES.md §1.9; sizes in elements).
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
  // ZeRO-Offload hooks (worker/engine/offload; TECHNIQUES.md §1.7-1.8). Defaults: no offload.
  // false: exp_avg / exp_avg_sq stay undefined (an offloaded optimizer keeps them).
  bool allocate_optimizer_state = true;
  // Called with parameter i right after it is built (in order); may take its values and, for
  // stage-3 parameter offload, replace master/shard by stride-0 placeholders. An error aborts
  // Create and is returned as it is.
  std::function<absl::Status(size_t i, ZeroParam& p)> on_param;
  // Stage 3: the partition [p] (fp32) that all-gathers read when the shard is not in memory
  // (offload_param to NVMe). May throw CollectiveError with the read's status.
  std::function<at::Tensor(size_t i)> fetch_partition;
  // Stage 3 with fetch_partition, while a prefetch trace is replayed: parameter i's partition
  // will be fetched soon (the trace entries just beyond the all-gather prefetch window), so
  // its read may start now. Returns false when no more reads can be in flight (hints stop
  // until the next fetch). drop_read_ahead: wait for and discard reads no fetch took (the trace
  // changed); called at the end of every micro-step, before the optimizer rewrites the files.
  std::function<bool(size_t i)> read_ahead;
  std::function<void()> drop_read_ahead;
};

struct ZeroParam {
  ParamSpec spec;
  int64_t numel = 0;
  PartitionSlice slice;     // this rank's per-parameter partition (checkpoint layout)
  bool persistent = false;  // stage 3: numel <= param_persistence_threshold
  at::Tensor master;        // fp32 [m]: m = p (stages 1-3) or n (stage 0)
  at::Tensor exp_avg;       // fp32 [m] Adam first moment
  at::Tensor exp_avg_sq;    // fp32 [m] Adam second moment
  at::Tensor grad;          // fp32 [m] reduced mean gradient (stage 0: also the local
                            // accumulator); undefined until the first reduction of a step
  at::Tensor local_grad;    // stage 1: fp32 [n] local accumulator over micro-steps
  at::Tensor replica;       // stages 0-2: full parameter [shape], param dtype
  at::Tensor shard;         // stage 3: [p] param dtype (the master itself when fp32)
  bool shard_offloaded = false;  // stage 3 offload_param nvme: master/shard are stride-0
                                 // placeholders; all-gathers read ZeroOptions::fetch_partition
};

class ZeroLlama {
 public:
  // Builds the parameters. Parameter i's full tensor is drawn from a CPU generator seeded with
  // Mix64(seed ^ Mix64(i + 1)) — normal(0, initializer_range) for linear/embedding weights,
  // ones for norm weights — identically for every world size and stage. `collectives` must
  // outlive the model. With `init` (fine-tuning), the weights are read from that Hugging Face
  // export instead (its errors returned as they are: NOT_FOUND for a missing tensor,
  // INVALID_ARGUMENT for a shape or dtype mismatch).
  static absl::StatusOr<std::unique_ptr<ZeroLlama>> Create(const LlamaConfig& config,
                                                           Collectives* collectives,
                                                           uint64_t seed,
                                                           const HfWeights* init = nullptr,
                                                           const ZeroOptions& options = {});

  // ids: [batch, seq] int64 token ids (seq <= max_position_embeddings). `layer_order` (optional)
  // lists the decoder layers to run, in order (default 0..L-1; tests use it to change the
  // module order). Returns logits [batch, seq, vocab] in the activation dtype (fp32, or bf16).
  // Throws CollectiveError / c10::Error.
  at::Tensor Forward(const at::Tensor& ids, const std::vector<int64_t>* layer_order = nullptr);

  // Training micro-steps: call BeginMicroStep before the forward (last = the last micro-step
  // of the optimizer step) and FinishMicroStep after backward (flushes and waits for gradient
  // reductions, frees gathered params). After the last micro-step, params()[i].grad holds the
  // data-parallel mean gradient (partition for stages 1-3, full for stage 0).
  void BeginMicroStep(bool last);
  void FinishMicroStep();
  // After the optimizer updated the fp32 masters: refreshes the compute copies (stage 0 cast,
  // stage 1/2 bucketed all-gather into the replicas, stage 3 shard cast and persistent params
  // released). Also used after loading a checkpoint. Collective for stages 1/2.
  void RefreshParams();
  // Drops the gradients (contiguous buffer zeroed and kept).
  void ClearGrads();
  // Σ ||grad||^2 (double) over this rank's gradient storage (padding is zero). Stages 1-3 need
  // an all-reduce SUM over ranks to get the global value; stage 0 holds it fully.
  double LocalGradSquaredNorm() const;
  bool any_nonfinite_grad() const;
  bool grads_partitioned() const { return options_.stage >= 1; }

  // The full parameter i as fp32 (a collective for stage 3), shape spec.shape.
  at::Tensor GatherFull(size_t i);
  // This rank's partition [p] of parameter i's master / exp_avg / exp_avg_sq (which = 0, 1, 2),
  // the checkpoint layout for every stage (stage 0 slices its full replica).
  at::Tensor CheckpointPartition(size_t i, int which) const;
  // Sets parameter i's master (which = 0), exp_avg (1) or exp_avg_sq (2) from this rank's
  // partition (p floats). Stage 0 all-gathers the full tensor (collective). Call RefreshParams
  // after the last.
  void LoadPartition(size_t i, int which, const float* src);

  std::vector<ZeroParam>& params() { return params_; }
  const ZeroOptions& options() const { return options_; }
  const LlamaConfig& config() const { return config_; }
  at::ScalarType activation_dtype() const;
  // Σ m * 4: bytes of this rank's fp32 master (= Σ p * 4 for stages 1-3, Σ n * 4 for stage 0).
  int64_t partition_bytes() const;
  MemoryTracker& memory() { return memory_; }
  Collectives& collectives() { return *collectives_; }
  // Stage-3 prefetch statistics since construction.
  int64_t prefetch_hits() const { return prefetch_hits_; }
  int64_t trace_invalidations() const { return trace_invalidations_; }
  int64_t on_demand_fetches() const { return on_demand_fetches_; }

  // RoPE tables (HF LlamaRotaryEmbedding): cos, sin [seq, head_dim] fp32 with
  // inv_freq = 1 / theta^(arange(0, d, 2) / d), emb = cat(freqs, freqs).
  static std::pair<at::Tensor, at::Tensor> RopeTables(int64_t seq, int64_t head_dim,
                                                      double theta);
  // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) on the last dim.
  // x: [batch, heads, seq, d]; cos/sin: [seq, d].
  static at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  // Internal, for the autograd functions: the full weight of parameter i in param dtype
  // (valid until the matching ReleaseFull), and the full gradient of parameter i ([shape],
  // any float dtype) of one backward.
  const at::Tensor& AcquireFull(size_t i);
  void ReleaseFull(size_t i);
  void AddGrad(size_t i, const at::Tensor& full_grad);
  // Stages 2/3, gradients computed in `compute_dtype` == fp32: a [shape] fp32 tensor to write
  // parameter i's full gradient of one backward into (a view of a zero-padded pooled [N*p]
  // buffer); call CommitGrad(i) once it is written. Undefined where the stage or dtype needs
  // AddGrad instead.
  at::Tensor GradDestination(size_t i, at::ScalarType compute_dtype);
  void CommitGrad(size_t i);

 private:
  struct Live {
    at::Tensor input;   // the fetched partition when it is not the shard (kept until done)
    at::Tensor buffer;  // [N*p]
    at::Tensor full;    // view [shape]
    std::unique_ptr<PendingCollective> pending;
    int uses = 0;
    bool prefetched_unused = false;
    MemoryKind kind = MemoryKind::kBuffers;
  };
  struct Reduction {
    std::unique_ptr<PendingCollective> pending;
    at::Tensor send;                   // stage 0: the concatenated bucket (all-reduced)
    std::vector<at::Tensor> fulls;     // stages 1-3: [N*p] per bucket entry
    std::vector<at::Tensor> parts;     // stages 1-3: [p] reduced partition per entry
    std::vector<char> direct;          // parts[b] is the gradient partition itself
    std::vector<size_t> ids;
    std::vector<int64_t> offsets;      // stage 0: each entry's offset in send
    int64_t bytes = 0;
  };
  enum class TraceMode { kRecord, kReplay, kOff };

  ZeroLlama(const LlamaConfig& config, Collectives* collectives, const ZeroOptions& options)
      : config_(config), collectives_(collectives), options_(options) {}
  std::map<size_t, Live>::iterator StartGather(size_t i);
  void Free(std::map<size_t, Live>::iterator it);
  void IssuePrefetches();
  void InvalidateTrace();
  bool ReusedSoon(size_t i) const;
  void EnsureGrad(ZeroParam& p);
  at::Tensor NewGradBuffer(size_t i);
  void Enqueue(size_t i, const at::Tensor& flat);
  void Flush();
  void CompleteOldest();

  LlamaConfig config_;
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
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> rope_cache_;

  // Gradient reduction.
  bool last_micro_ = true;
  bool in_micro_step_ = false;
  std::vector<int> grad_expected_, grad_seen_;  // per param, this micro-step (stages 0/1)
  std::vector<char> touched_;   // per param: got a gradient since the last ClearGrads
  std::vector<char> enqueued_;  // per param: queued for reduction in this micro-step
  std::vector<char> grad_written_;   // per param: grad holds a reduction since ClearGrads
  std::vector<at::Tensor> grad_out_;  // per param: the buffer GradDestination handed out
  std::vector<std::pair<size_t, at::Tensor>> bucket_;
  int64_t bucket_elems_ = 0;
  std::deque<Reduction> in_flight_;
  at::Tensor grad_flat_;  // contiguous_gradients storage

  // Stage-3 fetching.
  std::map<size_t, Live> live_;
  TraceMode trace_mode_ = TraceMode::kRecord;
  std::vector<size_t> trace_, recording_;
  size_t trace_pos_ = 0, prefetch_pos_ = 0, read_ahead_pos_ = 0;
  int64_t live_elems_ = 0, prefetch_elems_ = 0;
  int64_t prefetch_hits_ = 0, trace_invalidations_ = 0, on_demand_fetches_ = 0;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_LLAMA_H_
