// ALST's tiled compute (issue 13; docs/design/TECHNIQUES.md §3.3; Bekman et al., "Arctic Long
// Sequence Training", arXiv 2506.13996, §3.2-3.3; DeepSpeed deepspeed/runtime/sequence_parallel/
// ulysses_sp.py TiledMLP and TiledFusedLogitsLoss): the decoder's SwiGLU MLP and the
// logits + cross-entropy head run over tiles of the sequence so that their large intermediates
// ([B,S,I] for the MLP, [B*S,V] fp32 logits for the head) exist one tile at a time.
//
// TiledMlp (an MlpCore): forward runs each sequence tile [B, s_t, H] under no autograd graph
// and saves only x; backward recomputes each tile's gate/up/silu and backpropagates the matching
// slice of the incoming gradient (closed form, below). Weights are acquired ONCE per forward and
// once per backward for all tiles (stage 3: one all-gather each, not one per tile). Each tile's
// weight gradient is one contribution (GradDestination/CommitGrad or AddGrad) inside a
// GradDeferral over {gate, up, down}, so the provider reduces each weight once per backward.
//
// TiledLogitsLoss (a LossHead): hidden [B,S,H] and labels [B,S] are flattened to N = B*S rows
// and cut into row tiles. Per tile, inside forward: logits = x W^T in fp32, loss_t =
// cross-entropy with reduction=sum (labels -100 ignored), and that tile's backward
// dlogits = (softmax - onehot) / n_valid, dx_t = dlogits W, dW += dlogits^T x_t. The loss is
// Σ_t loss_t / n_valid with n_valid the count of non-ignored labels over all tiles; the full
// [N, V] logits never exist. Unlike DeepSpeed's TiledFusedLogitsLoss (whose lm_head gradient is
// handed to ZeRO during forward, so a later loss scaling never reaches it:
// docs/design/TECHNIQUES-TESTS.md §2.3.4), dW is kept locally (fp32 [V,H]) and handed to the
// provider in backward multiplied by the upstream gradient, so (k * loss).backward() gives k times
// EVERY gradient (tested). Returns LossOutput{fp32 mean, token_count = n_valid}; n_valid = 0 gives
// loss 0 and zero gradients.
//
// Tile-count rule (both ops): local tiles T_r = max(1, ceil(L / tile_size)) with L the sequence
// length S (MLP; tile_size default = hidden_size, ArcticTraining's num_shards = ceil(seqlen /
// hidden)) or the row count B*S (loss; tile_size default = the rows whose fp32 logits fill
// kDefaultLossTileBytes, ArcticTraining sizes shards by logits bytes too). Then T = all-reduce
// MAX of T_r over `group` (every rank of a ZeRO group agrees; DeepSpeed's rule against mismatched
// ZeRO-3 gathers), and tiles are torch.chunk-like: ceil(L / T) each, the last shorter, trailing
// tiles empty when L is small (a rank with fewer real tiles runs empty ones: no compute, no
// contribution). The MLP's T is saved for its backward (no second all-reduce).
//
// Shapes/dtypes: x, hidden in the provider's activation dtype (fp32 or bf16); labels int64; the
// MLP computes in x's dtype (as the untiled LinearOps do); the loss computes logits and softmax
// in fp32. Errors: CollectiveError (tile agreement, provider), c10::Error (LibTorch). Not
// thread-safe; every rank of `group` must call the ops in the same order.
#ifndef LOOM_WORKER_ENGINE_MODEL_TILED_OPS_H_
#define LOOM_WORKER_ENGINE_MODEL_TILED_OPS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "spec/tiled_compute_options.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/model/param_access.h"

namespace loom::engine {

// Default bytes of one loss tile's fp32 logits: 64 MiB (1024 rows at vocab 16384, 524 rows at
// the 32000-token vocabulary). ArcticTraining uses about 1 GiB on an 80 GB accelerator; Loom's
// CPU ranks are capped near 1 GiB, so a tile must be a small part of that.
inline constexpr int64_t kDefaultLossTileBytes = int64_t{64} << 20;

// max(1, ceil(length / tile_size)); tile_size >= 1.
int64_t LocalTileCount(int64_t length, int64_t tile_size);
// All-reduce MAX of `local` over `group` (null or one rank: `local`). Throws CollectiveError.
int64_t AgreeTileCount(Collectives* group, int64_t local);

class TiledMlp : public MlpCore {
 public:
  // tile_size: tokens of the sequence per tile (0: config hidden_size). `group` (may be null)
  // agrees the count; not owned, must outlive the op.
  TiledMlp(ParamAccess* access, Collectives* group, int64_t tile_size)
      : access_(access), group_(group), tile_size_(tile_size) {}
  at::Tensor Forward(const at::Tensor& x, ParamId gate, ParamId up, ParamId down) override;
  // The agreed tile count of the last Forward (tests).
  int64_t last_tile_count() const { return last_tiles_; }

 private:
  ParamAccess* access_;
  Collectives* group_;
  int64_t tile_size_;
  int64_t last_tiles_ = 0;
};

class TiledLogitsLoss : public LossHead {
 public:
  // head: the lm_head (or tied embedding) id [V,H]; tile_size: rows (tokens) per tile, 0: the
  // kDefaultLossTileBytes rule.
  TiledLogitsLoss(ParamAccess* access, Collectives* group, ParamId head, int64_t tile_size);
  LossOutput Forward(const at::Tensor& hidden, const at::Tensor& labels) override;
  int64_t last_tile_count() const { return last_tiles_; }

 private:
  ParamAccess* access_;
  Collectives* group_;
  ParamId head_;
  int64_t tile_size_;
  int64_t last_tiles_ = 0;
};

// Installs the tiled ops `options` asks for into `model` (its access() and head_id()), with
// `group` the ranks that must agree tile counts (the ZeRO partition group). No-op when both are
// off. INVALID_ARGUMENT for a negative tile size (naming the training.* field).
absl::Status InstallTiledCompute(const spec::TiledComputeOptions& options, Collectives* group,
                                 LlamaModel* model);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_TILED_OPS_H_
