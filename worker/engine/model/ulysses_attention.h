// DeepSpeed-Ulysses sequence parallelism as an AttentionCore (docs/design/TECHNIQUES.md §3.1;
// Jacobs et al. 2023, "DeepSpeed Ulysses", §3; DeepSpeed's runtime/sequence_parallel/ulysses_sp.py,
// UlyssesSPAttentionHF). It wraps any inner AttentionCore (the materialised one, a blockwise
// one): the inner core sees the full sequence for H/P heads and needs no change.
//
// Layout, with P = sequence parallel degree (the sequence-parallel group's world size), S the
// global sequence length, Sl = S/P, H / Hkv query / KV heads, d the head dim, b the batch:
//   * rank r of the group holds the contiguous sequence chunk [r·Sl, (r+1)·Sl) for all heads:
//     q [b, H, Sl, d], k, v [b, Hkv, Sl, d] (RoPE already applied at the global positions);
//   * an all-to-all over the group gives rank r the full sequence for query heads
//     [r·H/P, (r+1)·H/P): q [b, H/P, S, d] (and KV heads [r·Hkv/P, (r+1)·Hkv/P));
//   * GQA/MQA with P > Hkv (requires P % Hkv == 0): K and V heads are repeat-interleaved
//     f = P/Hkv times before the all-to-all, so rank r gets KV head ⌊r/f⌋, the group of its
//     query heads; the repeat's backward sums the replicas' gradients;
//   * the inner core runs on [b, H/P, S, d] with the mask of the GLOBAL positions;
//   * an all-to-all back gives [b, H, Sl, d] for the local chunk.
// Autograd: the backward of each all-to-all is the reverse all-to-all of the incoming gradient
// (the equal-split exchange is a permutation, so its adjoint is its inverse).
//
// Masks: SetLocalPositions(positions [Sl] int64) all-gathers the global positions of the
// group's chunks (one int64 all-reduce over the group) and builds the [S, S] mask once for every
// layer of the forward: key j is visible to query i iff j and i are in the same document and
// pos[j] <= pos[i], where a new document starts wherever the position does not increase
// (pos[i] <= pos[i-1], e.g. packed samples whose position ids restart at 0). The mask passed to
// Forward (built by the model from the local positions) is ignored. Without SetLocalPositions
// the positions are 0..S-1.
//
// Communication dtype (`seq_parallel_communication_data_type`): fp32 (default) moves q/k/v and
// the output as fp32; bf16 rounds them to bf16 for the wire and back to the activation dtype
// after it (less traffic, not exact). With fp32 activations and fp32 wire the exchange is
// bit-exact.
//
// Every rank of the group must call with tensors of the same shapes, in the same order.
// Errors: INVALID_ARGUMENT statuses from Create (heads not divisible by P, bad Hkv/P ratio);
// Forward throws CollectiveError for failed collectives and c10::Error for shape errors (Sl
// different from the positions' length, heads different from the options). Not thread-safe
// (one training thread; autograd's CPU backward runs on the same thread).
#ifndef LOOM_WORKER_ENGINE_MODEL_ULYSSES_ATTENTION_H_
#define LOOM_WORKER_ENGINE_MODEL_ULYSSES_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"

namespace loom::engine {

// The preconditions of §3.1 for heads: H % P == 0 and (Hkv % P == 0 or P % Hkv == 0).
// INVALID_ARGUMENT naming the config fields (num_attention_heads, num_key_value_heads,
// sequence_parallel_size) and their values (CheckSequenceParallelHeads,
// spec/sequence_parallel_config.h, which the scheduler's validation runs too).
absl::Status CheckUlyssesHeads(int64_t num_heads, int64_t num_kv_heads, int64_t sp_size);

// The mask of a packed sequence: positions [S] int64 as given, document_ids [S] int64 counting
// from 1 and advancing wherever the position does not increase (see the file comment).
AttentionMask PackedAttentionMask(const at::Tensor& positions);

// Its [S, S] bool form (PackedAttentionMask(positions).Dense()): true = key j NOT visible to
// query i.
at::Tensor PackedCausalMask(const at::Tensor& positions);

// The two all-to-alls, differentiable. `group` has P ranks; wire dtype kFloat or kBFloat16.
// SeqToHeads: x [b, H, Sl, d] (H % P == 0) -> [b, H/P, P·Sl, d], rank r's head block r.
// HeadsToSeq: y [b, H/P, P·Sl, d] -> [b, H, Sl, d] (the inverse).
// The result has x's dtype. Throws CollectiveError when the all-to-all fails.
at::Tensor UlyssesSeqToHeads(const at::Tensor& x, Collectives* group, at::ScalarType wire);
at::Tensor UlyssesHeadsToSeq(const at::Tensor& y, Collectives* group, at::ScalarType wire);

struct UlyssesOptions {
  int64_t num_heads = 0;     // H (num_attention_heads)
  int64_t num_kv_heads = 0;  // Hkv (num_key_value_heads)
  at::ScalarType communication_dtype = at::kFloat;  // kFloat or kBFloat16
};

class UlyssesAttention : public AttentionCore {
 public:
  // `group`: the sequence-parallel group (must outlive the core); `inner`: the core that runs on
  // the full sequence (null: MaterializedCausalAttention).
  static absl::StatusOr<std::unique_ptr<UlyssesAttention>> Create(
      Collectives* group, const UlyssesOptions& options, std::unique_ptr<AttentionCore> inner);

  // positions [Sl] int64: the global positions of this rank's chunk (the same tensor the model's
  // RoPE gets). Collective over the group (every rank calls it before the forward).
  // Throws CollectiveError.
  void SetLocalPositions(const at::Tensor& positions);

  // q [b, H, Sl, d], k, v [b, Hkv, Sl, d] -> [b, H, Sl, d] in `act`. `mask` (the model's, over
  // the local chunk) is ignored when enabled: the inner core gets the group's global mask (the
  // gathered positions, and document ids where the positions restart); used as given when
  // disabled.
  at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask, at::ScalarType act) override;

  // The global [S] positions of the last SetLocalPositions (undefined before).
  const at::Tensor& global_positions() const { return global_positions_; }

  // Disabled, Forward runs the inner core on the tensors as given, with the model's mask (a
  // full sequence on every rank, e.g. final logits; DeepSpeed's disable_in_eval). Default on.
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }

 private:
  UlyssesAttention(Collectives* group, const UlyssesOptions& options,
                   std::unique_ptr<AttentionCore> inner);
  Collectives* group_;
  UlyssesOptions options_;
  std::unique_ptr<AttentionCore> inner_;
  at::Tensor global_positions_;
  AttentionMask mask_;  // over the global sequence; positions undefined until first use
  bool enabled_ = true;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_ULYSSES_ATTENTION_H_
