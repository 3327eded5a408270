// Blockwise causal attention with an online softmax: FlashAttention-2 (Dao 2023, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", Algorithm 1 forward with the
// saved logsumexp, Algorithm 2 backward recomputing the scores per block), as a LibTorch custom
// autograd function on the CPU. Attention memory grows with S, not S²: no [S,S] scores, mask or
// probabilities exist; the largest temporaries are one [B,Hq,block,block] fp32 tile.
//
// Shapes: q [B,Hq,S,d], k, v [B,Hkv,S,d] with Hq a multiple of Hkv (GQA/MQA: query head h uses
// KV head h / (Hq/Hkv), as HF's repeat_kv; K/V are not repeated, the Hq/Hkv query heads of a
// group are stacked against their KV head) -> [B,Hq,S,d] in `act`.
// Mask (AttentionMask): key j is visible to query i iff positions[j] <= positions[i] and, when
// document ids are given, document_ids[j] == document_ids[i] (packed samples). Positions need
// not start at 0 or be sorted (a sequence shard's global positions); blocks in which no pair is
// visible are skipped, blocks in which every pair is visible run unmasked.
// Dtypes: fp32 or bf16 q/k/v; scores, softmax statistics and all accumulations in fp32; the
// gradients are returned in the inputs' dtypes. Saved for backward: q, k, v, the output and the
// fp32 logsumexp [B,Hq,S].
// Block size: `block_size` queries x `block_size` keys per tile (job spec
// model.attn_block_size, default 128; docs/job-spec.md). A last block shorter than block_size is
// handled (S need not be a multiple).
// Errors: c10::Error (TORCH_CHECK) for inconsistent shapes or a block size < 1. Thread-safety:
// stateless apart from the block size; Forward may be called from one thread at a time per
// autograd graph (LibTorch's rule).
#ifndef LOOM_WORKER_ENGINE_MODEL_BLOCKWISE_ATTENTION_H_
#define LOOM_WORKER_ENGINE_MODEL_BLOCKWISE_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "worker/engine/model/llama_model.h"

namespace loom::engine {

inline constexpr int64_t kDefaultAttentionBlockSize = 128;

// The function itself (differentiable in q, k, v). positions int64 [S]; document_ids int64 [S]
// or undefined.
at::Tensor BlockwiseAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& positions, const at::Tensor& document_ids,
                              int64_t block_size, at::ScalarType act);

// The attention core of `model.attn_implementation: flash_attention_2` (the default): the
// function above when the sequence spans more than one block; when q and k both fit in one
// block (S <= block_size) the single tile runs as MaterializedCausalAttention (bit-identical
// to `eager`, and faster there; at most one [B, Hq, block, block] tile as well).
class BlockwiseCausalAttention : public AttentionCore {
 public:
  explicit BlockwiseCausalAttention(int64_t block_size = kDefaultAttentionBlockSize)
      : block_size_(block_size) {}
  at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask, at::ScalarType act) override;
  int64_t block_size() const { return block_size_; }

 private:
  int64_t block_size_;
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_BLOCKWISE_ATTENTION_H_
