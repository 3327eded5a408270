// A Llama decoder (Hugging Face LlamaForCausalLM semantics) whose parameters are partitioned
// with ZeRO stage 3 (Rajbhandari et al., "ZeRO", SC'20; DeepSpeed stage3.py /
// partition_parameters.py; TECHNIQUES.md §1.3, §1.6).
//
// Every parameter is partitioned individually: with p = ceil(n/N), rank r keeps flat elements
// [r*p, min((r+1)p, n)) zero-padded to p as an fp32 leaf tensor [p] (requires_grad) plus Adam
// state for that partition only. Each linear / embedding / RMSNorm op is a custom autograd
// function that all-gathers its full weight just before use and frees it right after; in
// backward it gathers again, computes the full weight's gradient, pre-divides it by N (the
// data-parallel mean), reduce-scatters it and returns this rank's [p] slice, which autograd
// accumulates into partition.grad() across micro-batches. Activations are saved as usual;
// blocks are never recomputed (RMSNorm's backward is closed-form).
//
// Every rank must call Forward (and backward) on tensors of the same shapes in the same order:
// the gathers are collectives. Collective failures throw CollectiveError (catch at the engine
// boundary). Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_ZERO_LLAMA_H_
#define LOOM_WORKER_ENGINE_ZERO_LLAMA_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// Bytes of gathered (full, temporary) parameter and gradient tensors currently alive on this
// rank, and the peak since the last ResetPeak(). Thread-safe.
class GatherTracker {
 public:
  void Acquire(int64_t bytes);
  void Release(int64_t bytes);
  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_.store(current_.load()); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

struct ZeroParam {
  int64_t index = 0;  // position in ZeroLlama::params()
  ParamSpec spec;
  int64_t numel = 0;
  PartitionSlice slice;
  at::Tensor partition;   // [p] fp32 leaf, requires_grad; grad() = this rank's grad partition
  at::Tensor exp_avg;     // [p] fp32 Adam first moment (this partition only)
  at::Tensor exp_avg_sq;  // [p] fp32 Adam second moment
};

// Hooks for ZeRO-Offload (worker/engine/offload): who owns optimizer state, and where each
// parameter partition lives once built.
struct ZeroInitHooks {
  // false: exp_avg / exp_avg_sq stay undefined (an offloaded optimizer keeps them).
  bool allocate_optimizer_state = true;
  // Called with each parameter right after its partition is built (in parameter order); may
  // take the values and replace `partition` by a placeholder (e.g. a stride-0 [p] leaf) when
  // the partition lives on NVMe. An error aborts Create and is returned as it is.
  std::function<absl::Status(ZeroParam&)> on_param;
};

class ZeroLlama {
 public:
  // Builds the partitions. Parameter i's full tensor is drawn from a CPU generator seeded with
  // Mix64(seed ^ Mix64(i + 1)) — normal(0, initializer_range) for linear/embedding weights,
  // ones for norm weights — identically for every world size; this rank keeps its slice.
  // `collectives` must outlive the model. With `init` (fine-tuning), every parameter's slice is
  // read from that Hugging Face export instead (its errors returned as they are: NOT_FOUND for a
  // missing tensor, INVALID_ARGUMENT for a shape or dtype mismatch).
  static absl::StatusOr<std::unique_ptr<ZeroLlama>> Create(const LlamaConfig& config,
                                                           Collectives* collectives,
                                                           uint64_t seed,
                                                           const HfWeights* init = nullptr,
                                                           const ZeroInitHooks* hooks = nullptr);

  // Where all-gathers read a parameter's partition [p] from when it is not `partition` itself
  // (parameter offload to NVMe). May throw CollectiveError with the read's status.
  using PartitionSource = std::function<at::Tensor(const ZeroParam&)>;
  void SetPartitionSource(PartitionSource source) { runtime_.fetch = std::move(source); }

  // ids: [batch, seq] int64 token ids (seq <= max_position_embeddings).
  // Returns logits [batch, seq, vocab] fp32. Throws CollectiveError / c10::Error.
  at::Tensor Forward(const at::Tensor& ids);

  // The full parameter i (all-gathered; a collective every rank must call), shape spec.shape.
  at::Tensor GatherFull(size_t i);

  std::vector<ZeroParam>& params() { return params_; }
  const LlamaConfig& config() const { return config_; }
  // Σ p_i * 4: bytes of this rank's fp32 parameter partitions (Adam state is twice that).
  int64_t partition_bytes() const;
  GatherTracker& tracker() { return tracker_; }
  Collectives& collectives() { return *collectives_; }

  // RoPE tables (HF LlamaRotaryEmbedding): cos, sin [seq, head_dim] fp32 with
  // inv_freq = 1 / theta^(arange(0, d, 2) / d), emb = cat(freqs, freqs).
  static std::pair<at::Tensor, at::Tensor> RopeTables(int64_t seq, int64_t head_dim,
                                                      double theta);
  // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) on the last dim.
  // x: [batch, heads, seq, d]; cos/sin: [seq, d].
  static at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  // Shared with the autograd functions.
  struct Runtime {
    Collectives* collectives;
    GatherTracker* tracker;
    PartitionSource fetch;  // empty: read ZeroParam::partition
  };

 private:
  ZeroLlama(const LlamaConfig& config, Collectives* collectives)
      : config_(config), collectives_(collectives) {}
  ZeroParam& P(size_t i) { return params_[i]; }

  LlamaConfig config_;
  Collectives* collectives_;
  GatherTracker tracker_;
  Runtime runtime_{nullptr, nullptr};
  std::vector<ZeroParam> params_;
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> rope_cache_;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ZERO_LLAMA_H_
