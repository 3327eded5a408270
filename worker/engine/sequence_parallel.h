// The long-sequence data path of Ulysses sequence parallelism (issue 13; docs/design/TECHNIQUES.md
// §3.2, DeepSpeed's UlyssesSPDataLoaderAdapter and its loss averaging). The P ranks of a
// sequence-parallel group train on the SAME sample, each on a contiguous 1/P of its tokens; the
// data-parallel group (ranks with equal r % P) sees different samples.
//
// Per sample (ids [B, S], labels [B, S] int64, labels[b][i] the target of ids[b][i] — i.e.
// already shifted, BEFORE sharding, so the label of a shard's last token, which is the next
// shard's first token, is not lost; -100 = ignored):
//   rank r of P gets tokens [r·S/P, (r+1)·S/P) of ids, labels and global positions (0..S-1,
//   or a packed sample's per-document positions [S], restarting at 0 at each document start:
//   the Ulysses core then keeps every document's attention to itself, ulysses_attention.h).
// Loss convention (fixes DeepSpeed #5248's ambiguity, docs/design/TECHNIQUES-TESTS.md §2.3.5): rank
// r backpropagates loss_r · n_r / N, with loss_r its shard's token-mean cross-entropy, n_r its
// valid labels and N = Σ_r n_r (the sample's valid labels, known on every rank without
// communication). Summed over the group this is the unsharded model's token-mean loss, and the
// all-to-all backward carries every other rank's share, so the SUM over the group of the local
// gradients is the unsharded gradient. ZeRO's reduction over dp × sp therefore divides by the
// data-parallel size D (ZeroOptions::gradient_divide_factor = D, not D·P): the reduced
// gradients, and the global norm used for clipping, equal those of the unsharded model
// averaged over the D samples (tested for ZeRO stages 1-3). A rank with n_r = 0 backpropagates
// an exact zero through the same graph (its all-to-alls must still run; no NaN·0).
// The reported loss is Σ_r loss_r·n_r / max(N, 1), all-reduced over the group (fp64).
//
// Every rank of the group must call with the same sample, in the same order. Errors:
// CollectiveError (thrown) from the group's collectives; INVALID_ARGUMENT from Create.
// Not thread-safe (the training thread).
#ifndef LOOM_WORKER_ENGINE_SEQUENCE_PARALLEL_H_
#define LOOM_WORKER_ENGINE_SEQUENCE_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/model/ulysses_attention.h"

namespace loom::engine {

inline constexpr int64_t kIgnoreLabel = -100;

// labels [B, S] of ids (HF convention: labels[i] = ids[i]) -> the targets of ids [B, S]:
// labels shifted left by one, the last position -100 (DeepSpeed's shift_labels).
at::Tensor ShiftLabels(const at::Tensor& labels);

struct SequenceShard {
  at::Tensor ids;        // [B, S/P] int64
  at::Tensor labels;     // [B, S/P] int64 targets, -100 = ignored
  at::Tensor positions;  // [S/P] int64 global positions r·S/P ... (or the packed slice)
  int64_t valid = 0;         // n_r: labels != -100 in this shard
  int64_t global_valid = 0;  // N: labels != -100 in the whole sample
};
// Rank `rank`'s contiguous chunk of a sample. S % sp_size must be 0 (TORCH_CHECK otherwise).
// `positions`: optional int64 [S] (packed samples); undefined = 0..S-1.
SequenceShard ShardSample(const at::Tensor& ids, const at::Tensor& targets, int64_t rank,
                          int64_t sp_size, const at::Tensor& positions = at::Tensor());

// Held-out (no-grad) loss of ids/targets [B, S] (targets already shifted, -100 ignored)
// through the model's loss head: the tiled logits+loss head when training.tiled_logits_loss
// installed it (model/tiled_ops.h), so evaluation never builds the [B, S, V] logits either;
// otherwise the default head (full logits + cross-entropy, fp32). positions: optional global
// positions [S] and document ids [S] (packed samples, llama_model.h). Every rank that shares a tile-count group or a ZeRO-3 partition must call it
// equally often. Throws CollectiveError / c10::Error.
struct HeldOutLoss {
  double sum = 0;      // Σ token cross-entropy over the valid targets (fp64 from the fp32 mean)
  int64_t tokens = 0;  // valid targets (0: sum is 0)
};
HeldOutLoss HeldOutLossOf(LlamaModel* model, const at::Tensor& ids, const at::Tensor& targets,
                          const at::Tensor& positions = at::Tensor(),
                          const at::Tensor& document_ids = at::Tensor());

class SequenceParallelRunner {
 public:
  // Installs a UlyssesAttention over `group` wrapping `inner` (null: the materialised core) in
  // `model`, disabled outside the runner's calls (Forward of full sequences, e.g. the final
  // logits, run `inner` on the full sequence). `model` and `group` must outlive the runner.
  static absl::StatusOr<std::unique_ptr<SequenceParallelRunner>> Create(
      LlamaModel* model, Collectives* group, bool bf16_wire,
      std::unique_ptr<AttentionCore> inner = nullptr);

  struct MicroStep {
    at::Tensor backprop;  // fp32 scalar: loss_r · n_r / N (see the file comment)
    double loss = 0;      // the sample's token-mean loss (every rank of the group)
  };
  // One micro-step's forward on this rank's shard of the sample ids/targets [B, S].
  // positions: optional int64 [S] of a packed sample (see ShardSample).
  MicroStep Loss(const at::Tensor& ids, const at::Tensor& targets,
                 const std::vector<int64_t>* layer_order = nullptr,
                 const at::Tensor& positions = at::Tensor());
  // Held-out loss of a sample (no gradient): its token-mean cross-entropy, every rank, through
  // the model's loss head (HeldOutLossOf on this rank's shard, summed over the group).
  double EvalLoss(const at::Tensor& ids, const at::Tensor& targets,
                  const at::Tensor& positions = at::Tensor());

  Collectives* group() const { return group_; }

 private:
  SequenceParallelRunner(LlamaModel* model, Collectives* group, UlyssesAttention* core)
      : model_(model), group_(group), core_(core) {}
  double SumOverGroup(double local);
  LlamaModel* model_;
  Collectives* group_;
  UlyssesAttention* core_;  // owned by model_
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_SEQUENCE_PARALLEL_H_
