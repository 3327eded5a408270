// Held-out evaluation through the loss head (HeldOutLossOf, SequenceParallelRunner::EvalLoss;
// sequence_parallel.h): with TiledLogitsLoss installed (training.tiled_logits_loss) the
// evaluation runs the tiled head — its agreed tile count is the one the rule gives, so the
// [B, S, V] logits were never built — and its loss equals the untiled evaluation and an
// independent reference (log_softmax + gather over the logits head's output, written here),
// fp32, |a - b| <= 1e-6 |b|. Ignored targets (-100) are not counted. One rank
// (ReplicatedProvider), and SP = 2 on a 2-rank Gloo gang (threads) with ZeRO-3 over both ranks
// against the unsharded model on the full sample.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <memory>
#include <mutex>
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

constexpr uint64_t kSeed = 17;

// Token-mean cross-entropy over targets != -100, from [B, S, V] logits: plain LibTorch ops.
double ReferenceLoss(const at::Tensor& logits, const at::Tensor& targets) {
  at::Tensor lp = at::log_softmax(logits.to(at::kDouble), -1);
  at::Tensor valid = targets.ne(-100);
  at::Tensor picked = lp.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  return -(picked * valid).sum().item<double>() / valid.sum().item<double>();
}

struct Sample {
  at::Tensor ids, targets;
};
Sample MakeSample(int64_t b, int64_t s, int64_t vocab) {
  at::manual_seed(3);
  Sample x{at::randint(0, vocab, {b, s}, at::kLong), at::randint(0, vocab, {b, s}, at::kLong)};
  x.targets.narrow(1, s - 3, 3).fill_(-100);  // right padding
  return x;
}

TEST(HeldOutLossTest, TiledHeadEvaluationEqualsUntiledAndTheReference) {
  const spec::LlamaConfig c = testing::TinyLlamaConfig();
  const Sample x = MakeSample(2, 13, c.vocab_size);  // 26 rows, 20 valid
  auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {kSeed, c.initializer_range});
  auto model = *LlamaModel::Create(c, rep.get());
  double ref = 0;
  {
    at::NoGradGuard no_grad;
    ref = ReferenceLoss(model->Forward(x.ids), x.targets);
  }
  const HeldOutLoss plain = HeldOutLossOf(model.get(), x.ids, x.targets);
  EXPECT_EQ(plain.tokens, 20);
  EXPECT_NEAR(plain.sum / plain.tokens, ref, 1e-6 * ref);

  auto head = std::make_unique<TiledLogitsLoss>(rep.get(), nullptr, model->head_id(), 5);
  TiledLogitsLoss* tiled_head = head.get();
  model->set_loss_head(std::move(head));
  const HeldOutLoss tiled = HeldOutLossOf(model.get(), x.ids, x.targets);
  EXPECT_EQ(tiled_head->last_tile_count(), 6);  // ceil(26 / 5): the tiled head ran
  EXPECT_EQ(tiled.tokens, 20);
  EXPECT_NEAR(tiled.sum / tiled.tokens, ref, 1e-6 * ref);
  EXPECT_NEAR(tiled.sum, plain.sum, 1e-6 * plain.sum);
  EXPECT_FALSE(rep->grad(model->head_id()).defined() &&
               rep->grad(model->head_id()).abs().sum().item<double>() != 0)
      << "evaluation must not leave a head gradient";
}

TEST(HeldOutLossTest, SequenceParallelEvaluationThroughTheTiledHeadEqualsTheUnshardedModel) {
  const spec::LlamaConfig c = testing::TinyLlamaConfig();
  const int64_t s = 12;
  const Sample x = MakeSample(1, s, c.vocab_size);  // shards of 6 rows: 6 and 3 valid
  double ref = 0;
  {
    auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {kSeed, c.initializer_range});
    auto model = *LlamaModel::Create(c, rep.get());
    at::NoGradGuard no_grad;
    ref = ReferenceLoss(model->Forward(x.ids), x.targets);
  }
  std::mutex mu;
  std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& world) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> groups = ProcessGroups::Create(world, 2);
    if (!groups.ok()) return groups.status();
    ZeroOptions o;
    o.stage = 3;
    o.param_persistence_threshold = 0;
    auto zero =
        *ZeroProvider::Create(spec::LlamaParamSpecs(c), &world, {kSeed, c.initializer_range}, o);
    auto model = *LlamaModel::Create(c, zero.get());
    auto sp = SequenceParallelRunner::Create(model.get(),
                                             (*groups)->sequence_parallel().collectives, false);
    if (!sp.ok()) return sp.status();
    const double plain = (*sp)->EvalLoss(x.ids, x.targets);
    auto head = std::make_unique<TiledLogitsLoss>(zero.get(), &world, model->head_id(), 4);
    TiledLogitsLoss* tiled_head = head.get();
    model->set_loss_head(std::move(head));
    const double tiled = (*sp)->EvalLoss(x.ids, x.targets);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(tiled_head->last_tile_count(), 2) << "rank " << rank;  // ceil(6 / 4)
    EXPECT_NEAR(plain, ref, 1e-6 * ref) << "rank " << rank;
    EXPECT_NEAR(tiled, ref, 1e-6 * ref) << "rank " << rank;
    return absl::OkStatus();
  });
  EXPECT_TRUE(testing::FirstFailure(st).ok()) << testing::FirstFailure(st);
}

}  // namespace
}  // namespace loom::engine
