// SequenceParallelRunner::EvalLoss (sequence_parallel.h) on real Gloo ranks (threads, 2 ranks =
// one sequence-parallel group, ZeRO-3 over both): the held-out loss goes through the installed
// loss head, so with the tiled logits+loss head (training.tiled_logits_loss) eval never builds
// the shard's [B, S/P, V] logits. Before this, EvalLoss always ran the model's logits forward
// and cross_entropy, which at a 32,000-token vocabulary is S/P x 128 KB of fp32 logits (plus
// log-softmax's copy) and OOM-killed the ALST benchmark's tiled rungs in the trainer's first
// evaluation (bench/alst_search.py). Checked: the tiled head ran (its tile count) and the loss
// equals the independent reference, the unsharded model's logits on one rank and LibTorch's
// cross_entropy over the valid tokens (fp32, |a-b| <= 1e-6 |b|), with and without padded labels.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>

#include <memory>
#include <vector>

#include "worker/engine/collectives.h"
#include "worker/engine/model/tiled_ops.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/sequence_parallel.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/replicated_provider.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;

TEST(SequenceParallelEvalTest, EvalLossRunsThroughTheTiledHeadAndEqualsTheUnshardedLoss) {
  const spec::LlamaConfig c = testing::TinyLlamaConfig();
  const uint64_t seed = 17;
  const int64_t s = 12;
  at::manual_seed(3);
  const at::Tensor ids = at::randint(0, c.vocab_size, {1, s}, at::kLong);
  const at::Tensor full = at::randint(0, c.vocab_size, {1, s}, at::kLong);
  at::Tensor padded = full.clone();
  padded.narrow(1, 8, 4).fill_(kIgnoreLabel);  // rank 1's shard: 2 of 6 labels valid

  for (const at::Tensor& targets : {full, padded}) {
    // Reference: one unsharded model, its [1, S, V] logits, LibTorch's mean cross-entropy
    // (ignore_index -100) over the valid tokens.
    auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {seed, c.initializer_range});
    auto ref_model = *LlamaModel::Create(c, rep.get());
    at::NoGradGuard ref_no_grad;
    const double ref = torch::nn::functional::cross_entropy(
                           ref_model->Forward(ids).reshape({-1, c.vocab_size}),
                           targets.reshape({-1}))
                           .item<double>();

    std::vector<absl::Status> st = RunGang(2, [&](int rank, Collectives& world) {
      absl::StatusOr<std::unique_ptr<ProcessGroups>> groups = ProcessGroups::Create(world, 2);
      if (!groups.ok()) return groups.status();
      ZeroOptions o;
      o.stage = 3;
      o.param_persistence_threshold = 0;
      o.gradient_divide_factor = (*groups)->data_parallel_size();
      auto zero =
          *ZeroProvider::Create(spec::LlamaParamSpecs(c), &world, {seed, c.initializer_range}, o);
      auto model = *LlamaModel::Create(c, zero.get());
      // 4-token tiles: 2 tiles of the 6-token shard.
      auto head = std::make_unique<TiledLogitsLoss>(zero.get(), &world, model->head_id(), 4);
      TiledLogitsLoss* tiled = head.get();
      model->set_loss_head(std::move(head));
      absl::StatusOr<std::unique_ptr<SequenceParallelRunner>> sp = SequenceParallelRunner::Create(
          model.get(), (*groups)->sequence_parallel().collectives, false);
      if (!sp.ok()) return sp.status();
      const double got = (*sp)->EvalLoss(ids, targets);
      EXPECT_EQ(tiled->last_tile_count(), 2) << "rank " << rank << ": eval bypassed the head";
      EXPECT_NEAR(got, ref, 1e-6 * ref) << "rank " << rank;
      return absl::OkStatus();
    });
    ASSERT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
  }
}

}  // namespace
}  // namespace loom::engine
