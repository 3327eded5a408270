// Every collective of one ZeRO-3 optimizer step (two micro-steps: the first records the
// stage-3 fetch trace, the second replays it with prefetches, then reduces and refreshes) made
// to fail in turn with FailingCollectives: the step must throw CollectiveError carrying
// exactly the injected status (never crash, hang or swallow it), on one rank (local
// collectives) and on two ranks over real Gloo (the thread harness).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spec/model_config.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/testing/failing_collectives.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FailingCollectives;

spec::LlamaConfig TinyConfig() {
  spec::LlamaConfig c = testing::TinyLlamaConfig();
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 16;
  return c;
}

ZeroOptions Stage3() {
  ZeroOptions o;
  o.stage = 3;
  o.param_persistence_threshold = 0;  // every parameter is gathered
  o.reduce_bucket_size = 600;         // several reduce-scatter buckets, two in flight
  o.prefetch_bucket_size = 2000;      // replay prefetches
  o.max_reuse_distance = 0;           // backward gathers again
  return o;
}

// The ZeRO provider and the Llama model over it.
struct Model {
  std::unique_ptr<ZeroProvider> zero;
  std::unique_ptr<LlamaModel> llama;
};

absl::StatusOr<Model> Create(const spec::LlamaConfig& c, Collectives* coll, const ZeroOptions& o) {
  Model m;
  absl::StatusOr<std::unique_ptr<ZeroProvider>> z =
      ZeroProvider::Create(spec::LlamaParamSpecs(c), coll, {5, c.initializer_range, nullptr}, o);
  if (!z.ok()) return z.status();
  m.zero = std::move(*z);
  absl::StatusOr<std::unique_ptr<LlamaModel>> l = LlamaModel::Create(c, m.zero.get());
  if (!l.ok()) return l.status();
  m.llama = std::move(*l);
  return m;
}

// One optimizer step of two micro-steps through `m`.
void Step(Model& m) {
  ZeroProvider& model = *m.zero;
  at::Tensor ids = at::arange(12, at::kLong).remainder(64).view({2, 6});
  for (int micro = 0; micro < 2; ++micro) {
    model.BeginMicroStep(/*last=*/micro == 1);
    at::Tensor logits = m.llama->Forward(ids);
    torch::nn::functional::cross_entropy(logits.reshape({-1, 64}), ids.reshape({-1}))
        .backward();
    model.FinishMicroStep();
  }
  model.RefreshParams();
}

absl::Status Injected(int64_t k) {
  switch (k % 3) {
    case 0:
      return absl::DeadlineExceededError(absl::StrCat("injected timeout at ", k));
    case 1:
      return absl::UnavailableError(absl::StrCat("injected peer loss at ", k));
    default:
      return absl::InternalError(absl::StrCat("injected failure at ", k));
  }
}

// Counts the collectives of Create and of one step on `world`, then fails each of the step's
// in turn. Returns the number of step collectives (0 on a setup failure).
int64_t FailEachCollectiveOfOneStep(Collectives& world) {
  const spec::LlamaConfig c = TinyConfig();
  int64_t create_count = 0, step_count = 0;
  {
    FailingCollectives none(world, 0, absl::OkStatus());
    absl::StatusOr<Model> m = Create(c, &none, Stage3());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    create_count = none.started();
    Step(*m);
    step_count = none.started() - create_count;
    EXPECT_GT(m->zero->prefetch_hits(), 0) << "the second micro-step must replay with prefetch";
  }
  for (int64_t k = 1; k <= step_count; ++k) {
    const absl::Status want = Injected(k);
    FailingCollectives f(world, create_count + k, want);
    absl::StatusOr<Model> m = Create(c, &f, Stage3());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    bool threw = false;
    try {
      Step(*m);
    } catch (const CollectiveError& e) {
      threw = true;
      EXPECT_EQ(e.status(), want) << "collective " << k << " of " << step_count;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "collective " << k << ": not a CollectiveError: " << e.what();
      threw = true;
    }
    EXPECT_TRUE(threw) << "collective " << k << " of " << step_count << " failed silently";
    EXPECT_TRUE(f.failed()) << k;
  }
  return step_count;
}

TEST(ZeroCollectiveErrorTest, EveryCollectiveOfAStage3StepThrowsItsStatusOneRank) {
  std::unique_ptr<Collectives> local = CreateLocalCollectives();
  const int64_t n = FailEachCollectiveOfOneStep(*local);
  // 2 micro-steps x forward and backward gathers of 21 parameters (fewer where a parameter is
  // reused while still gathered); no gradient collective: on one rank the reduction is the
  // identity and none runs (zero_provider.h), so every collective here is a gather.
  EXPECT_GT(n, 2 * 21);
}

TEST(ZeroCollectiveErrorTest, EveryCollectiveOfAStage3StepThrowsItsStatusTwoRanks) {
  std::vector<int64_t> counts(2);
  std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& world) {
    counts[rank] = FailEachCollectiveOfOneStep(world);
    return absl::OkStatus();
  });
  EXPECT_TRUE(testing::FirstFailure(st).ok()) << testing::FirstFailure(st);
  EXPECT_EQ(counts[0], counts[1]);
  EXPECT_GT(counts[0], 2 * 2 * 21);
}

}  // namespace
}  // namespace loom::engine
