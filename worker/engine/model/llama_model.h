// A Llama decoder (Hugging Face LlamaForCausalLM semantics; with config.model_type qwen2,
// Qwen2ForCausalLM: the same decoder plus q/k/v projection biases; qwen3, Qwen3ForCausalLM: plus
// an RMSNorm over each head of q and k before RoPE; mistral, MistralForCausalLM whose window does
// not bind: the Llama decoder) written against ParamAccess: it
// holds no parameters and no ZeRO code; parameters are bound BY NAME from the provider's
// parameter table (LlamaParamSpecs names, e.g. "model.layers.3.self_attn.q_proj.weight").
// Parallelism (ZeRO stages 0-3: worker/engine/zero) is the provider's business.
//
// Modules: embedding -> DecoderLayer x L (RMSNorm, attention with a pluggable AttentionCore,
// RMSNorm, SwiGLU MLP; residuals) -> final RMSNorm -> head. Qwen2 adds q/k/v = x W^T + b
// (model/bias_op.h) before RoPE; Qwen3 q = q_norm(q), k = k_norm(k) on [B,S,heads,d] before
// RoPE (transformers' Qwen3Attention); nothing else differs. The head is either the logits head
// (Forward: [B,S,V]) or a LossHead (Loss: cross-entropy from hidden states and labels), so a
// tiled logits+loss (ALST, issue 13) can replace the loss without materialising [B,S,V].
//
// Shapes: ids, labels [B,S] int64; hidden [B,S,H]; q [B,Hq,S,d], k/v [B,Hkv,S,d] with
// d = head_dim; activations in the provider's activation dtype (fp32 or bf16).
// Positions: optional int64 [S] global positions of the S tokens (RoPE angle and causal mask:
// token j is visible to token i iff positions[j] <= positions[i]); default 0..S-1. Sequence
// parallelism (issue 13) passes the global positions of its shard. Document ids: optional
// int64 [S]; tokens of different documents of a packed sample never attend to each other.
// Every rank must run the same calls on tensors of the same shapes (the provider's collectives).
// Errors: CollectiveError / c10::Error thrown. Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_MODEL_LLAMA_MODEL_H_
#define LOOM_WORKER_ENGINE_MODEL_LLAMA_MODEL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/model_config.h"
#include "worker/engine/model/activation_checkpoint.h"
#include "worker/engine/model/param_access.h"

namespace loom::engine {

// RoPE tables (HF LlamaRotaryEmbedding.forward): cos, sin [S, d] fp32 for the positions
// (default 0..S-1): freqs = positions x inv_freq, emb = cat(freqs, freqs), cos = cos(emb) *
// attention_scaling, sin likewise. inv_freq and attention_scaling: spec::ComputeRopeFrequencies
// (every rope_scaling type; float64, rounded to fp32; "default" in fp32 exactly as transformers'
// compute_default_rope_parameters) for a sequence of max(positions) + 1
// positions (S by default), as transformers' dynamic_rope_update takes max(position_ids) + 1
// (under sequence parallelism, each shard's own positions, as in transformers).
std::pair<at::Tensor, at::Tensor> RopeTables(const spec::LlamaConfig& config, int64_t seq,
                                             const at::Tensor& positions = at::Tensor());
// The same without scaling (rope_type "default") for head_dim and theta.
std::pair<at::Tensor, at::Tensor> RopeTables(int64_t seq, int64_t head_dim, double theta,
                                             const at::Tensor& positions = at::Tensor());
// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) on the last dim.
// x: [B, heads, S, d]; cos/sin: [S, d].
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Which keys each query may attend to, from the S tokens' global positions and, for packed
// samples, their document ids: key j is visible to query i iff positions[j] <= positions[i]
// and (document_ids undefined or document_ids[j] == document_ids[i]). Sequence parallelism
// (issue 13) passes the global positions of its (gathered) shard. No [S,S] tensor exists
// unless a core asks for Dense(). Not thread-safe (Dense() caches).
struct AttentionMask {
  at::Tensor positions;     // int64 [S], required
  at::Tensor document_ids;  // int64 [S], optional (undefined: one document)
  // [S,S] bool, true = NOT visible (materialising cores only); built once, then cached.
  const at::Tensor& Dense() const;

 private:
  mutable at::Tensor dense_;
};

// The attention core: softmax(q k^T / sqrt(d) + mask) v with grouped KV heads.
// q [B,Hq,S,d], k, v [B,Hkv,S,d] (RoPE applied; Hq a multiple of Hkv) and the mask ->
// [B,Hq,S,d] in the activation dtype `act`. Implementations: MaterializedCausalAttention
// (default), BlockwiseCausalAttention (model/blockwise_attention.h, FlashAttention-2);
// Ulysses (issue 13) wraps an inner core.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  virtual at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionMask& mask, at::ScalarType act) = 0;
};

// Materialises the [B,Hq,S,S] scores and mask.Dense(); softmax in fp32 (HF eager attention).
class MaterializedCausalAttention : public AttentionCore {
 public:
  at::Tensor Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask, at::ScalarType act) override;
};

// Loss from the final hidden states: mean token cross-entropy of head(hidden) against labels.
struct LossOutput {
  at::Tensor loss;          // fp32 scalar: mean over token_count tokens (loss_sum / count)
  int64_t token_count = 0;  // tokens the mean is over (B*S)
};
class LossHead {
 public:
  virtual ~LossHead() = default;
  // hidden [B,S,H] (after the final norm), labels [B,S] int64.
  virtual LossOutput Forward(const at::Tensor& hidden, const at::Tensor& labels) = 0;
};

// The SwiGLU MLP of a decoder layer: down(silu(gate(x)) * up(x)), x [B,S,H] in the activation
// dtype -> [B,S,H]; gate/up [I,H], down [H,I] parameter ids. Default (no core set): three
// LinearOps. Implementation: TiledMlp (model/tiled_ops.h; ALST, issue 13). The core does its own
// NoteUse bookkeeping.
class MlpCore {
 public:
  virtual ~MlpCore() = default;
  virtual at::Tensor Forward(const at::Tensor& x, ParamId gate, ParamId up, ParamId down) = 0;
};

class LlamaModel {
 public:
  // Binds every parameter LlamaParamSpecs(config) names to its id in access->param_specs();
  // NOT_FOUND names a missing tensor, INVALID_ARGUMENT a shape mismatch. `access` must outlive
  // the model.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const spec::LlamaConfig& config,
                                                            ParamAccess* access);

  // ids [B,S] (S <= max_position_embeddings) -> logits [B,S,V] in the activation dtype.
  // `layer_order` (optional) lists the decoder layers to run, in order (default 0..L-1; tests
  // use it to change the module order). `positions`: see the file comment.
  at::Tensor Forward(const at::Tensor& ids, const std::vector<int64_t>* layer_order = nullptr,
                     const at::Tensor& positions = at::Tensor(),
                     const at::Tensor& document_ids = at::Tensor());
  // The training loss: hidden states -> loss head (default: logits head + cross-entropy in
  // fp32, the same ops as Forward followed by cross_entropy). labels [B,S] int64.
  LossOutput Loss(const at::Tensor& ids, const at::Tensor& labels,
                  const std::vector<int64_t>* layer_order = nullptr,
                  const at::Tensor& positions = at::Tensor(),
                  const at::Tensor& document_ids = at::Tensor());
  // Final hidden states [B,S,H] (after the final norm).
  at::Tensor Hidden(const at::Tensor& ids, const std::vector<int64_t>* layer_order = nullptr,
                    const at::Tensor& positions = at::Tensor(),
                    const at::Tensor& document_ids = at::Tensor());

  // Replaces the attention core of every layer (default MaterializedCausalAttention) / the
  // loss head (default: full logits + cross-entropy). Null restores the default.
  void set_attention_core(std::unique_ptr<AttentionCore> core);
  void set_loss_head(std::unique_ptr<LossHead> head);
  // Replaces every layer's MLP (default: untiled LinearOps); null restores the default.
  void set_mlp_core(std::unique_ptr<MlpCore> core) { mlp_core_ = std::move(core); }
  // Per-decoder-layer activation checkpointing (model/activation_checkpoint.h); default off.
  void set_activation_checkpointing(const ActivationCheckpointOptions& options) {
    checkpointing_ = options;
  }

  const spec::LlamaConfig& config() const { return config_; }
  ParamAccess* access() const { return access_; }
  // The lm_head (or the tied embedding) parameter id.
  ParamId head_id() const { return head_; }

 private:
  static constexpr ParamId kNoParam = static_cast<ParamId>(-1);
  struct DecoderLayer {
    ParamId input_norm, q, k, v, o, post_norm, gate, up, down;
    ParamId q_bias = kNoParam, k_bias = kNoParam, v_bias = kNoParam;  // Qwen2 only
    ParamId q_norm = kNoParam, k_norm = kNoParam;                     // Qwen3 only
  };
  LlamaModel(const spec::LlamaConfig& config, ParamAccess* access);
  // NoteUse(i) as the current phase wants it: as is; forced on (the no-grad forward of a
  // checkpointed layer, so each forward use still counts once); skipped (its recompute).
  void NoteUse(ParamId i);
  at::Tensor Linear(const at::Tensor& x, ParamId i);
  // Linear(x, i) + bias (when bias != kNoParam).
  at::Tensor Linear(const at::Tensor& x, ParamId i, ParamId bias);
  at::Tensor Norm(const at::Tensor& x, ParamId i);
  at::Tensor Layer(const DecoderLayer& l, const at::Tensor& h, const at::Tensor& cos,
                   const at::Tensor& sin, const AttentionMask& mask);

  spec::LlamaConfig config_;
  ParamAccess* access_;
  ParamId embed_ = 0, final_norm_ = 0, head_ = 0;
  std::vector<DecoderLayer> layers_;
  std::unique_ptr<AttentionCore> core_;
  std::unique_ptr<LossHead> loss_head_;
  std::unique_ptr<MlpCore> mlp_core_;  // null: the untiled MLP
  ActivationCheckpointOptions checkpointing_;
  CheckpointPhase phase_ = CheckpointPhase::kNone;
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> rope_cache_;  // default positions
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_LLAMA_MODEL_H_
