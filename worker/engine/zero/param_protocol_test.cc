// The ParamAccess protocol between LlamaModel and its providers (issue 12):
//   * LlamaModel over ZeroProvider stages 0-3 at world size 1 equals it over ReplicatedProvider
//     (loss and every gradient); on a 2-rank Gloo gang (threads) the ZeRO mean gradient equals
//     the replicated gradient of the concatenated batch (fp32, |a-b| <= 1e-6 + 1e-4 |b|).
//   * Gradient deferral: a linear used K=3 times inside one deferral gets the same gradient as
//     without, with exactly one reduction instead of K (stages 2/3; Collectives counts).
//   * gradient_divide_factor divides the reduced gradient.
//   * Partition gradient ready events: once per parameter, only in the last micro-step, after
//     its gradient partition is final.
//   * Parameters bound by name; explicit positions 0..S-1 equal the default.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <future>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/engine/collectives.h"
#include "worker/engine/gloo_collectives.h"
#include "worker/engine/model/autograd_ops.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/replicated_provider.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-4;  // fp32 reduction-order tolerance

spec::LlamaConfig Tiny(bool tied = false) { return testing::TinyLlamaConfig(tied); }

template <typename Body>
void RunThreads(int world, Body body) {
  std::promise<int> port;
  std::shared_future<int> port_f = port.get_future().share();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.bind_address = "127.0.0.1";  // in-process ranks: the gang's own address is loopback
      o.rank = r;
      o.world_size = world;
      o.timeout = absl::Seconds(60);
      if (r == 0) {
        o.on_listening = [&](int p) { port.set_value(p); };
      } else {
        o.master_port = port_f.get();
      }
      absl::StatusOr<std::unique_ptr<Collectives>> c = CreateGlooCollectives(o);
      ASSERT_TRUE(c.ok()) << c.status();
      body(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double worst = ((got - want).abs() - kRtol * want.abs()).max().item<double>();
  EXPECT_LE(worst, kAtol) << what << " max |diff| " << (got - want).abs().max().item<double>();
}

// This rank's partition [p] of a full fp32 tensor (the ZeroParam::grad layout for stages 1-3).
at::Tensor PartitionOf(const at::Tensor& full, const ZeroParam& p) {
  at::Tensor out = at::zeros({p.slice.partition_numel}, at::kFloat);
  if (p.slice.valid() > 0) {
    out.narrow(0, 0, p.slice.valid()).copy_(full.reshape({-1}).narrow(0, p.slice.begin,
                                                                        p.slice.valid()));
  }
  return out;
}

struct Reference {
  double loss;
  std::vector<at::Tensor> grads;
};

Reference ReplicatedRun(const spec::LlamaConfig& c, uint64_t seed, const at::Tensor& ids,
                        const at::Tensor& labels) {
  auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {seed, c.initializer_range});
  auto model = *LlamaModel::Create(c, rep.get());
  LossOutput out = model->Loss(ids, labels);
  out.loss.backward();
  Reference r{out.loss.item<double>(), {}};
  for (size_t i = 0; i < rep->param_specs().size(); ++i) r.grads.push_back(rep->grad(i));
  return r;
}

class ReplicatedReferenceTest : public ::testing::TestWithParam<int> {};

TEST_P(ReplicatedReferenceTest, ZeroAtWorldSizeOneEqualsReplicated) {
  const int stage = GetParam();
  for (bool tied : {false, true}) {
    const spec::LlamaConfig c = Tiny(tied);
    at::manual_seed(3);
    at::Tensor ids = at::randint(0, c.vocab_size, {2, 9}, at::kLong);
    at::Tensor labels = at::randint(0, c.vocab_size, {2, 9}, at::kLong);
    Reference ref = ReplicatedRun(c, 21, ids, labels);
    std::unique_ptr<Collectives> coll = CreateLocalCollectives();
    ZeroOptions o;
    o.stage = stage;
    o.reduce_bucket_size = 500;
    o.param_persistence_threshold = 0;
    auto zero =
        *ZeroProvider::Create(spec::LlamaParamSpecs(c), coll.get(), {21, c.initializer_range}, o);
    auto model = *LlamaModel::Create(c, zero.get());
    zero->BeginMicroStep(true);
    LossOutput out = model->Loss(ids, labels);
    EXPECT_EQ(out.token_count, 18);
    out.loss.backward();
    zero->FinishMicroStep();
    EXPECT_NEAR(out.loss.item<double>(), ref.loss, 1e-6 * ref.loss) << "tied " << tied;
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      const ZeroParam& p = zero->params()[i];
      ASSERT_TRUE(p.grad.defined()) << p.spec.name;
      ExpectClose(p.grad.view(p.spec.shape), ref.grads[i],
                  absl::StrCat("stage ", stage, " tied ", tied, " ", p.spec.name));
    }
  }
}

// Two ranks, each with half of the batch: the reduced mean gradient (each rank's partition)
// equals the replicated gradient of the whole batch (equal token counts per rank).
TEST_P(ReplicatedReferenceTest, TwoRankMeanGradientEqualsReplicatedConcatenatedBatch) {
  const int stage = GetParam();
  const spec::LlamaConfig c = Tiny(false);
  at::manual_seed(4);
  at::Tensor ids = at::randint(0, c.vocab_size, {4, 8}, at::kLong);
  at::Tensor labels = at::randint(0, c.vocab_size, {4, 8}, at::kLong);
  Reference ref = ReplicatedRun(c, 22, ids, labels);
  std::vector<double> losses(2);
  RunThreads(2, [&](int rank, Collectives& coll) {
    ZeroOptions o;
    o.stage = stage;
    o.reduce_bucket_size = 700;
    o.param_persistence_threshold = 0;
    auto zero =
        *ZeroProvider::Create(spec::LlamaParamSpecs(c), &coll, {22, c.initializer_range}, o);
    auto model = *LlamaModel::Create(c, zero.get());
    zero->BeginMicroStep(true);
    LossOutput out = model->Loss(ids.narrow(0, 2 * rank, 2), labels.narrow(0, 2 * rank, 2));
    out.loss.backward();
    zero->FinishMicroStep();
    losses[rank] = out.loss.item<double>();
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      const ZeroParam& p = zero->params()[i];
      ASSERT_TRUE(p.grad.defined()) << p.spec.name;
      const at::Tensor want = stage == 0 ? ref.grads[i].reshape({-1}) : PartitionOf(ref.grads[i], p);
      ExpectClose(p.grad, want, absl::StrCat("stage ", stage, " rank ", rank, " ", p.spec.name));
    }
  });
  EXPECT_NEAR((losses[0] + losses[1]) / 2, ref.loss, 1e-6 * ref.loss);
}

INSTANTIATE_TEST_SUITE_P(Stages, ReplicatedReferenceTest, ::testing::Values(0, 1, 2, 3));

// One linear W [4, 3] used K times on K inputs: y = Σ_k x_k W^T. Returns (W's reduced
// gradient on this rank, collectives issued by the micro-step).
std::pair<at::Tensor, int64_t> KUses(Collectives& coll, int stage, int k, bool defer) {
  ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 1;  // a reduction per enqueued gradient
  o.overlap_comm = false;
  o.param_persistence_threshold = 0;
  std::vector<spec::ParamSpec> specs = {{"w", {4, 3}, spec::ParamSpec::Kind::kLinear}};
  auto zero = *ZeroProvider::Create(specs, &coll, {5, 0.5}, o);
  zero->BeginMicroStep(true);
  const int64_t before = coll.collective_count();
  at::Tensor y;
  for (int t = 0; t < k; ++t) {
    // Deterministic per (use, rank): the ranks are threads, so no shared global generator.
    at::Tensor x = at::sin(at::arange(30, at::kFloat) * (0.3 + t + 0.7 * coll.rank()))
                       .reshape({2, 5, 3});
    zero->NoteUse(0);
    at::Tensor part = LinearOp(zero.get(), 0, x);
    y = t == 0 ? part : y + part;
  }
  at::Tensor loss = (y * y).sum();
  if (defer) {
    GradDeferral deferral(zero.get(), {0});
    loss.backward();
    deferral.Close();
  } else {
    loss.backward();
  }
  zero->FinishMicroStep();
  const int64_t count = coll.collective_count() - before;
  // Stage 3 also gathers W: once in forward and once in backward per use.
  const int64_t gathers = stage == 3 ? 2 * k : 0;
  return {zero->params()[0].grad.clone(), count - gathers};
}

TEST(GradDeferralTest, KUsesInsideOneDeferralReduceOnceWithTheSameGradient) {
  constexpr int kK = 3;
  for (int stage : {0, 1, 2, 3}) {
    RunThreads(2, [&](int rank, Collectives& coll) {
      auto [plain, plain_reductions] = KUses(coll, stage, kK, /*defer=*/false);
      auto [deferred, deferred_reductions] = KUses(coll, stage, kK, /*defer=*/true);
      ExpectClose(deferred, plain, absl::StrCat("stage ", stage, " rank ", rank));
      EXPECT_EQ(deferred_reductions, 1) << "stage " << stage;
      // Stages 0/1 reduce local accumulations once per step anyway; 2/3 once per contribution.
      EXPECT_EQ(plain_reductions, stage >= 2 ? kK : 1) << "stage " << stage;
    });
  }
}

TEST(GradientDivideFactorTest, ReducedGradientIsDividedByTheFactor) {
  const spec::LlamaConfig c = Tiny(false);
  at::manual_seed(5);
  at::Tensor ids = at::randint(0, c.vocab_size, {2, 6}, at::kLong);
  at::Tensor labels = at::randint(0, c.vocab_size, {2, 6}, at::kLong);
  Reference ref = ReplicatedRun(c, 23, ids, labels);
  for (int stage : {0, 1, 2, 3}) {
    std::unique_ptr<Collectives> coll = CreateLocalCollectives();
    ZeroOptions o;
    o.stage = stage;
    o.gradient_divide_factor = 4;
    auto zero =
        *ZeroProvider::Create(spec::LlamaParamSpecs(c), coll.get(), {23, c.initializer_range}, o);
    auto model = *LlamaModel::Create(c, zero.get());
    zero->BeginMicroStep(true);
    model->Loss(ids, labels).loss.backward();
    zero->FinishMicroStep();
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      const ZeroParam& p = zero->params()[i];
      ExpectClose(p.grad.view(p.spec.shape), ref.grads[i] / 4,
                  absl::StrCat("stage ", stage, " ", p.spec.name));
    }
  }
}

// Records each event with a copy of the gradient partition at that moment.
class Recorder : public GradReadyListener {
 public:
  explicit Recorder(ZeroProvider** zero) : zero_(zero) {}
  void OnPartitionGradReady(ParamId i) override {
    order.push_back(i);
    at_event[i] = (*zero_)->params()[i].grad.clone();
  }
  std::vector<ParamId> order;
  std::map<ParamId, at::Tensor> at_event;

 private:
  ZeroProvider** zero_;
};

TEST(GradReadyTest, OncePerParamInTheLastMicroStepAfterItsGradientIsFinal) {
  for (bool tied : {false, true}) {
    const spec::LlamaConfig c = Tiny(tied);
    for (int stage : {0, 1, 2, 3}) {
      for (bool overlap : {false, true}) {
        RunThreads(2, [&](int rank, Collectives& coll) {
          ZeroProvider* raw = nullptr;
          Recorder rec(&raw);
          ZeroOptions o;
          o.stage = stage;
          o.overlap_comm = overlap;
          o.reduce_bucket_size = 300;
          o.param_persistence_threshold = 0;
          o.grad_ready_listener = &rec;
          auto zero =
              *ZeroProvider::Create(spec::LlamaParamSpecs(c), &coll, {24, c.initializer_range}, o);
          raw = zero.get();
          auto model = *LlamaModel::Create(c, zero.get());
          at::manual_seed(9 + rank);
          for (int micro = 0; micro < 2; ++micro) {
            at::Tensor ids = at::randint(0, c.vocab_size, {2, 7}, at::kLong);
            zero->BeginMicroStep(micro == 1);
            model->Loss(ids, ids).loss.backward();
            if (micro == 0) {
              zero->FinishMicroStep();
              EXPECT_TRUE(rec.order.empty()) << "events before the last micro-step";
            }
          }
          zero->FinishMicroStep();
          const std::string what = absl::StrCat("stage ", stage, " overlap ", overlap, " tied ",
                                                tied, " rank ", rank);
          ASSERT_EQ(rec.order.size(), zero->params().size()) << what;
          for (size_t i = 0; i < zero->params().size(); ++i) {
            ASSERT_EQ(rec.at_event.count(i), 1u) << what << " param " << i;
            EXPECT_TRUE(at::equal(rec.at_event[i], zero->params()[i].grad))
                << what << ": " << zero->params()[i].spec.name << " changed after its event";
          }
        });
      }
    }
  }
}

TEST(LlamaModelBindingTest, MissingParameterIsNamedAndPositionsDefaultToArange) {
  const spec::LlamaConfig c = Tiny(false);
  std::vector<spec::ParamSpec> specs = spec::LlamaParamSpecs(c);
  specs.pop_back();  // no lm_head.weight
  auto partial = *ReplicatedProvider::Create(specs, {1, 0.2});
  absl::StatusOr<std::unique_ptr<LlamaModel>> bad = LlamaModel::Create(c, partial.get());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("lm_head.weight"), std::string::npos) << bad.status();

  // Bound by name, not by position in the table: a reversed table gives the same logits.
  auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {1, 0.2});
  const std::vector<spec::ParamSpec> forward_specs = spec::LlamaParamSpecs(c);
  std::vector<spec::ParamSpec> reversed(forward_specs.rbegin(), forward_specs.rend());
  auto rev = *ReplicatedProvider::Create(reversed, {1, 0.2});
  const size_t n = reversed.size();
  for (size_t i = 0; i < n; ++i) rev->param(n - 1 - i).copy_(rep->param(i));
  auto model = *LlamaModel::Create(c, rep.get());
  auto model_rev = *LlamaModel::Create(c, rev.get());
  at::NoGradGuard no_grad;
  at::Tensor ids = at::randint(0, c.vocab_size, {1, 10}, at::kLong);
  at::Tensor a = model->Forward(ids);
  EXPECT_TRUE(at::equal(a, model_rev->Forward(ids)));
  EXPECT_TRUE(at::equal(a, model->Forward(ids, nullptr, at::arange(10, at::kLong))));
  // Shifted global positions (a sequence-parallel shard) change RoPE, so the logits.
  EXPECT_FALSE(at::allclose(a, model->Forward(ids, nullptr, at::arange(10, at::kLong) + 5)));
}

}  // namespace
}  // namespace loom::engine
