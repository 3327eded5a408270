// ALST tiled compute (issue 13; docs/design/TECHNIQUES-TESTS.md §1.2 AL-13..AL-15, §2.3.4):
//   * TiledMlp equals the SwiGLU MLP written here with plain LibTorch autograd (AL-13 shapes:
//     hidden 128, seq 125 in 4 tiles 32/32/32/29, batch 1 and 2): forward within
//     |a-b| <= 1e-6 + 1e-6 |b| (not bit-equal: the BLAS's GEMM rounds per row count), gradients
//     of x and of every weight within |a-b| <= 1e-5 + 1e-5 |b| (fp32 summation order).
//   * TiledLogitsLoss equals cross_entropy(x W^T) (mean over labels != -100) written here
//     (AL-14 shapes: hidden 64, vocab 100, seq 425; batch 1 and 2; ignored labels; AL-15 label
//     layouts incl. a fully ignored tile and more tiles than rows): loss within 1e-6 relative
//     (bit-equal with one tile), gradients within 1e-5 + 1e-5 |b|; ignored rows get exactly 0.
//   * (k * loss).backward() gives k times every gradient, lm_head's included (DeepSpeed's
//     TiledFusedLogitsLoss reduces lm_head's gradient during forward and misses this).
//   * LlamaModel with both tiled ops equals the untiled model (fp32 and bf16 activations).
//   * 2-rank Gloo gang (threads), ZeroProvider stages 2 and 3: exactly one reduction per weight
//     per backward whatever the tile count (counted as param_protocol_test does); ranks with
//     different sequence lengths agree the tile count (all-reduce MAX), finish, issue the same
//     collective sequence and get the untiled model's gradients.
#include "worker/engine/model/tiled_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/loss.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/replicated_provider.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

void ExpectClose(const at::Tensor& got, const at::Tensor& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double worst = ((g - w).abs() - rtol * w.abs()).max().item<double>();
  EXPECT_LE(worst, atol) << what << ": max |diff| " << (g - w).abs().max().item<double>();
}

std::vector<spec::ParamSpec> MlpSpecs(int64_t hidden, int64_t inter) {
  return {{"gate", {inter, hidden}, spec::ParamSpec::Kind::kLinear},
          {"up", {inter, hidden}, spec::ParamSpec::Kind::kLinear},
          {"down", {hidden, inter}, spec::ParamSpec::Kind::kLinear}};
}

// The reference MLP: plain autograd on leaf copies of the weights.
struct MlpRef {
  at::Tensor y, dx, dg, du, dd;
};
MlpRef PlainMlp(const at::Tensor& x_in, const at::Tensor& wg_in, const at::Tensor& wu_in,
                const at::Tensor& wd_in, const at::Tensor& c) {
  at::Tensor x = x_in.detach().clone().requires_grad_(true);
  at::Tensor wg = wg_in.detach().clone().requires_grad_(true);
  at::Tensor wu = wu_in.detach().clone().requires_grad_(true);
  at::Tensor wd = wd_in.detach().clone().requires_grad_(true);
  at::Tensor y = at::matmul(at::silu(at::matmul(x, wg.t())) * at::matmul(x, wu.t()), wd.t());
  (y * c).sum().backward();
  return {y.detach(), x.grad(), wg.grad(), wu.grad(), wd.grad()};
}

TEST(TiledMlpTest, EqualsPlainAutogradWithAnUnevenLastTileAndBatchTwo) {
  constexpr int64_t kHidden = 128, kInter = 256, kSeq = 125;
  for (int64_t batch : {1, 2}) {
    auto rep = *ReplicatedProvider::Create(MlpSpecs(kHidden, kInter), {42, 0.05});
    TiledMlp mlp(rep.get(), nullptr, /*tile_size=*/32);  // 125 = 32 + 32 + 32 + 29
    at::manual_seed(42);
    at::Tensor x = at::rand({batch, kSeq, kHidden}).requires_grad_(true);
    at::Tensor c = at::randn({batch, kSeq, kHidden});
    at::Tensor y = mlp.Forward(x, 0, 1, 2);
    EXPECT_EQ(mlp.last_tile_count(), 4);
    (y * c).sum().backward();
    MlpRef ref = PlainMlp(x, rep->param(0), rep->param(1), rep->param(2), c);
    const std::string what = absl::StrCat("batch ", batch);
    // Not bit-equal here: the BLAS's GEMM rounds differently for a 32-row tile than for the
    // whole sequence (measured max |diff| 1.0e-7 at batch 1, 1.3e-7 at batch 2).
    ExpectClose(y.detach(), ref.y, 1e-6, 1e-6, what + " forward");
    ExpectClose(x.grad(), ref.dx, 1e-5, 1e-5, what + " dx");
    ExpectClose(rep->grad(0), ref.dg, 1e-5, 1e-5, what + " d gate");
    ExpectClose(rep->grad(1), ref.du, 1e-5, 1e-5, what + " d up");
    ExpectClose(rep->grad(2), ref.dd, 1e-5, 1e-5, what + " d down");
    // 4 tiles x 3 weights, all local to the provider (the deferral makes them one reduction).
    EXPECT_EQ(rep->add_grad_calls(), 12) << what;
  }
}

TEST(TiledMlpTest, TileCountRuleIsCeilOfLengthOverTileSize) {
  EXPECT_EQ(LocalTileCount(125, 32), 4);
  EXPECT_EQ(LocalTileCount(128, 32), 4);
  EXPECT_EQ(LocalTileCount(129, 32), 5);
  EXPECT_EQ(LocalTileCount(3, 32), 1);
  // Regression: (length + tile - 1) overflowed int64 for a tile size near INT64_MAX.
  EXPECT_EQ(LocalTileCount(125, std::numeric_limits<int64_t>::max()), 1);
  EXPECT_EQ(LocalTileCount(std::numeric_limits<int64_t>::max(), 2), (int64_t{1} << 62));
  // The default tile is hidden_size: ArcticTraining's num_shards = ceil(seqlen / hidden).
  auto rep = *ReplicatedProvider::Create(MlpSpecs(8, 12), {1, 0.1});
  TiledMlp mlp(rep.get(), nullptr, 0);
  at::NoGradGuard no_grad;
  mlp.Forward(at::rand({1, 20, 8}), 0, 1, 2);
  EXPECT_EQ(mlp.last_tile_count(), 3);
}

std::vector<spec::ParamSpec> HeadSpecs(int64_t vocab, int64_t hidden) {
  return {{"lm_head.weight", {vocab, hidden}, spec::ParamSpec::Kind::kLinear}};
}

struct LossRef {
  at::Tensor loss, dx, dw;
};
LossRef PlainLoss(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& labels,
                  double k = 1.0) {
  at::Tensor x = x_in.detach().clone().requires_grad_(true);
  at::Tensor w = w_in.detach().clone().requires_grad_(true);
  at::Tensor logits = at::matmul(x, w.t()).to(at::kFloat);
  at::Tensor loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, w.size(0)}), labels.reshape({-1}));  // mean over labels != -100
  (loss * k).backward();
  return {loss.detach(), x.grad(), w.grad()};
}

// Runs the tiled loss over a fresh ReplicatedProvider; returns loss, dx, dW.
LossRef Tiled(const at::Tensor& x_in, const at::Tensor& labels, int64_t vocab, int64_t tile,
              int64_t* tiles = nullptr, double k = 1.0, at::Tensor* w_out = nullptr,
              int64_t* count = nullptr) {
  auto rep = *ReplicatedProvider::Create(HeadSpecs(vocab, x_in.size(-1)), {7, 0.2});
  TiledLogitsLoss head(rep.get(), nullptr, 0, tile);
  at::Tensor x = x_in.detach().clone().requires_grad_(true);
  LossOutput out = head.Forward(x, labels);
  (out.loss * k).backward();
  if (tiles != nullptr) *tiles = head.last_tile_count();
  if (w_out != nullptr) *w_out = rep->param(0).clone();
  if (count != nullptr) *count = out.token_count;
  return {out.loss.detach(), x.grad(), rep->grad(0)};
}

TEST(TiledLogitsLossTest, EqualsFullCrossEntropyWithIgnoredLabelsAndBatchTwo) {
  constexpr int64_t kHidden = 64, kVocab = 100, kSeq = 425;
  for (int64_t batch : {1, 2}) {
    at::manual_seed(3 + batch);
    at::Tensor x = at::randn({batch, kSeq, kHidden});
    at::Tensor labels = at::randint(0, kVocab, {batch, kSeq}, at::kLong);
    labels.narrow(1, 0, 17).fill_(-100);  // ignored: a prompt
    labels.narrow(1, 300, 5).fill_(-100);
    int64_t tiles = 0, count = 0;
    at::Tensor w;
    LossRef got = Tiled(x, labels, kVocab, /*tile=*/213, &tiles, 1.0, &w, &count);
    EXPECT_EQ(tiles, batch == 1 ? 2 : 4);  // 425 rows -> 213 + 212; 850 -> 4 x 213 (last 211)
    EXPECT_EQ(count, batch * (kSeq - 22));
    LossRef ref = PlainLoss(x, w, labels);
    const std::string what = absl::StrCat("batch ", batch);
    EXPECT_NEAR(got.loss.item<double>(), ref.loss.item<double>(),
                1e-6 * ref.loss.item<double>())
        << what;
    ExpectClose(got.dx, ref.dx, 1e-5, 1e-5, what + " dx");
    ExpectClose(got.dw, ref.dw, 1e-5, 1e-5, what + " d lm_head");
    // Ignored positions get exactly zero gradient.
    EXPECT_EQ(got.dx.narrow(1, 0, 17).abs().max().item<float>(), 0.f) << what;
    // One tile: the same ops in the same order as the full cross-entropy: bit-equal loss.
    LossRef one = Tiled(x, labels, kVocab, /*tile=*/batch * kSeq, &tiles);
    EXPECT_EQ(tiles, 1);
    EXPECT_TRUE(at::equal(one.loss, ref.loss))
        << what << ": one tile " << one.loss.item<double>() << " vs " << ref.loss.item<double>();
  }
}

TEST(TiledLogitsLossTest, Al15LabelLayouts) {
  // docs/design/TECHNIQUES-TESTS.md AL-15 (vocab 7): a fully ignored tile, uneven valid counts per
  // tile, more tiles than labels, and a control. {labels, tile size}.
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{1, 2, 3, 4, -100, -100, -100, -100}, 4},
      {{1, 2, 3, 4, 5, -100, -100, 6}, 4},
      {{1, 2, 3, -100, -100, -100, -100, -100}, 2},
      {{1, 2, 3, 4, 5, 6, 0, 1}, 2}};
  for (size_t c = 0; c < cases.size(); ++c) {
    at::manual_seed(11);
    at::Tensor labels = at::tensor(cases[c].first, at::kLong).view({1, 8});
    at::Tensor x = at::randn({1, 8, 5});
    at::Tensor w;
    LossRef got = Tiled(x, labels, 7, cases[c].second, nullptr, 1.0, &w);
    LossRef ref = PlainLoss(x, w, labels);
    const std::string what = absl::StrCat("layout ", c);
    EXPECT_NEAR(got.loss.item<double>(), ref.loss.item<double>(), 1e-6) << what;
    ExpectClose(got.dx, ref.dx, 1e-6, 1e-5, what + " dx");
    ExpectClose(got.dw, ref.dw, 1e-6, 1e-5, what + " dW");
    at::Tensor ignored = labels.view({-1}).eq(-100);
    if (ignored.any().item<bool>()) {
      EXPECT_EQ(got.dx.view({8, 5}).index({ignored}).abs().max().item<float>(), 0.f) << what;
    }
  }
  // Three rows in tiles of one.
  at::Tensor labels = at::tensor({1, -100, 2}, at::kLong).view({1, 3});
  at::Tensor x = at::randn({1, 3, 5});
  auto rep = *ReplicatedProvider::Create(HeadSpecs(7, 5), {7, 0.2});
  TiledLogitsLoss head(rep.get(), nullptr, 0, 1);
  LossOutput out = head.Forward(x, labels);
  EXPECT_EQ(head.last_tile_count(), 3);
  LossRef ref = PlainLoss(x, rep->param(0), labels);
  EXPECT_NEAR(out.loss.item<double>(), ref.loss.item<double>(), 1e-6);
  EXPECT_EQ(out.token_count, 2);
  // Every label ignored: loss 0, not NaN.
  LossOutput none = head.Forward(x, at::full({1, 3}, -100, at::kLong));
  EXPECT_EQ(none.loss.item<float>(), 0.f);
  EXPECT_EQ(none.token_count, 0);
}

TEST(TiledLogitsLossTest, ScalingTheLossByKScalesEveryGradientIncludingLmHead) {
  at::manual_seed(5);
  at::Tensor x = at::randn({2, 50, 16});
  at::Tensor labels = at::randint(0, 30, {2, 50}, at::kLong);
  LossRef base = Tiled(x, labels, 30, 16);
  for (double k : {0.5, 3.0, 1.0 / 64}) {
    LossRef scaled = Tiled(x, labels, 30, 16, nullptr, k);
    const std::string what = absl::StrCat("k ", k);
    ExpectClose(scaled.dx, base.dx * k, 1e-9, 1e-6, what + " dx");
    ExpectClose(scaled.dw, base.dw * k, 1e-9, 1e-6, what + " d lm_head");
  }
}

spec::LlamaConfig Tiny(bool tied) { return testing::TinyLlamaConfig(tied); }

struct RunOut {
  double loss = 0;
  std::vector<at::Tensor> grads;  // this rank's reduced gradient (partition) per parameter
  int64_t mlp_tiles = 0, loss_tiles = 0;
  uint64_t hash = 0;
  int64_t collectives = 0;
};

// One training micro-step of LlamaModel over ZeroProvider; tiled when mlp_tile/loss_tile > 0.
RunOut RunModel(const spec::LlamaConfig& c, Collectives& coll, int stage, at::ScalarType dtype,
                const at::Tensor& ids, const at::Tensor& labels, int64_t mlp_tile,
                int64_t loss_tile) {
  ZeroOptions o;
  o.stage = stage;
  o.param_dtype = dtype;
  o.reduce_bucket_size = 300;
  o.param_persistence_threshold = 0;
  auto zero = *ZeroProvider::Create(spec::LlamaParamSpecs(c), &coll, {31, c.initializer_range}, o);
  auto model = *LlamaModel::Create(c, zero.get());
  TiledMlp* mlp = nullptr;
  TiledLogitsLoss* head = nullptr;
  if (mlp_tile > 0) {
    auto m = std::make_unique<TiledMlp>(zero.get(), &coll, mlp_tile);
    mlp = m.get();
    model->set_mlp_core(std::move(m));
  }
  if (loss_tile > 0) {
    auto h = std::make_unique<TiledLogitsLoss>(zero.get(), &coll, model->head_id(), loss_tile);
    head = h.get();
    model->set_loss_head(std::move(h));
  }
  const int64_t before = coll.collective_count();
  zero->BeginMicroStep(true);
  LossOutput out = model->Loss(ids, labels);
  (out.loss / 2.0).backward();  // GAS 2's 1/GAS reaches every gradient
  zero->FinishMicroStep();
  RunOut r;
  r.loss = out.loss.item<double>();
  for (const ZeroParam& p : zero->params()) r.grads.push_back(p.grad.clone());
  r.mlp_tiles = mlp ? mlp->last_tile_count() : 0;
  r.loss_tiles = head ? head->last_tile_count() : 0;
  r.hash = coll.collective_hash();
  r.collectives = coll.collective_count() - before;
  return r;
}

// fp32: elementwise |a-b| <= atol + rtol |b|. bf16 (atol < 0): ||a-b|| <= rtol ||b|| per
// tensor, since bf16 rounding of small elements is large relative to them.
void ExpectSameRun(const RunOut& got, const RunOut& want, double loss_rtol, double atol,
                   double rtol, const std::string& what) {
  EXPECT_NEAR(got.loss, want.loss, loss_rtol * std::abs(want.loss)) << what << " loss";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) {
    const std::string w = absl::StrCat(what, " grad ", i);
    if (atol >= 0) {
      ExpectClose(got.grads[i], want.grads[i], atol, rtol, w);
    } else {
      const double err = (got.grads[i] - want.grads[i]).norm().item<double>();
      EXPECT_LE(err, rtol * want.grads[i].norm().item<double>()) << w;
    }
  }
}

TEST(TiledModelTest, TiledLlamaEqualsUntiledFp32AndBf16) {
  for (bool tied : {false, true}) {
    const spec::LlamaConfig c = Tiny(tied);
    at::manual_seed(8);
    at::Tensor ids = at::randint(0, c.vocab_size, {2, 13}, at::kLong);
    at::Tensor labels = at::randint(0, c.vocab_size, {2, 13}, at::kLong);
    labels.narrow(1, 0, 3).fill_(-100);
    std::unique_ptr<Collectives> coll = CreateLocalCollectives();
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      const bool bf16 = dt == at::kBFloat16;
      RunOut plain = RunModel(c, *coll, 0, dt, ids, labels, 0, 0);
      // 13 tokens in tiles of 4 (4+4+4+1); 26 rows in tiles of 5 (5x5 + 1).
      RunOut tiled = RunModel(c, *coll, 0, dt, ids, labels, 4, 5);
      EXPECT_EQ(tiled.mlp_tiles, 4);
      EXPECT_EQ(tiled.loss_tiles, 6);
      const std::string what = absl::StrCat(bf16 ? "bf16" : "fp32", " tied ", tied);
      // bf16: the tiles round their matmuls and weight-gradient sums differently.
      ExpectSameRun(tiled, plain, bf16 ? 1e-2 : 1e-6, bf16 ? -1 : 1e-6, bf16 ? 3e-2 : 1e-5,
                    what);
    }
  }
}

// One backward of TiledMlp (4 tiles) or TiledLogitsLoss (5 tiles) over a ZeroProvider holding
// only that op's weights; returns the reductions it issued (collectives minus the tile
// agreement and stage 3's gathers: one per weight in forward and one in backward).
int64_t OpReductions(Collectives& coll, int stage, bool loss_op) {
  ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 1;  // a reduction per enqueued gradient
  o.overlap_comm = false;
  o.param_persistence_threshold = 0;
  const std::vector<spec::ParamSpec> specs = loss_op ? HeadSpecs(30, 8) : MlpSpecs(8, 12);
  auto zero = *ZeroProvider::Create(specs, &coll, {5, 0.3}, o);
  zero->BeginMicroStep(true);
  const int64_t before = coll.collective_count();
  at::Tensor x = at::sin(at::arange(2 * 20 * 8, at::kFloat) * (0.3 + 0.7 * coll.rank()))
                     .reshape({2, 20, 8})
                     .requires_grad_(true);
  at::Tensor loss;
  if (loss_op) {
    TiledLogitsLoss head(zero.get(), &coll, 0, /*tile=*/8);  // 40 rows -> 5 tiles
    at::Tensor labels = at::arange(40, at::kLong).remainder(30).view({2, 20});
    loss = head.Forward(x, labels).loss;
    EXPECT_EQ(head.last_tile_count(), 5);
  } else {
    TiledMlp mlp(zero.get(), &coll, /*tile=*/5);  // 20 tokens -> 4 tiles
    loss = mlp.Forward(x, 0, 1, 2).pow(2).sum();
    EXPECT_EQ(mlp.last_tile_count(), 4);
  }
  loss.backward();
  zero->FinishMicroStep();
  // Stage 3 gathers each weight once per op: the MLP in forward and again in backward (3 + 3),
  // the loss only in forward (its backward needs no weight).
  const int64_t gathers = stage == 3 ? (loss_op ? 1 : 6) : 0;
  return coll.collective_count() - before - /*tile agreement*/ 1 - gathers;
}

TEST(TiledGangTest, ExactlyOneReductionPerWeightPerBackward) {
  for (int stage : {2, 3}) {
    std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& coll) {
      EXPECT_EQ(OpReductions(coll, stage, /*loss_op=*/false), 3) << "MLP stage " << stage;
      EXPECT_EQ(OpReductions(coll, stage, /*loss_op=*/true), 1) << "loss stage " << stage;
      return absl::OkStatus();
    });
    EXPECT_TRUE(testing::FirstFailure(st).ok()) << testing::FirstFailure(st);
  }
}

TEST(TiledGangTest, RanksWithDifferentLengthsAgreeTileCountsAndMatchUntiled) {
  const spec::LlamaConfig c = Tiny(false);
  for (int stage : {2, 3}) {
    std::vector<RunOut> tiled_runs(2);
    std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& coll) {
      // Rank 0: 13 tokens (4 MLP tiles of 4, 26 loss rows = 6 tiles of 5); rank 1: 6 tokens
      // (2 MLP tiles, 12 rows = 3 loss tiles) -> both run 4 and 6 tiles.
      const int64_t seq = rank == 0 ? 13 : 6;
      at::Tensor ids = (at::arange(2 * seq, at::kLong) * (5 + rank)).remainder(c.vocab_size)
                           .view({2, seq});
      at::Tensor labels = (ids * 3 + 1).remainder(c.vocab_size);
      RunOut plain = RunModel(c, coll, stage, at::kFloat, ids, labels, 0, 0);
      RunOut tiled = RunModel(c, coll, stage, at::kFloat, ids, labels, 4, 5);
      ExpectSameRun(tiled, plain, 1e-6, 1e-6, 1e-5,
                    absl::StrCat("stage ", stage, " rank ", rank));
      tiled_runs[rank] = tiled;
      return absl::OkStatus();
    });
    ASSERT_TRUE(testing::FirstFailure(st).ok()) << testing::FirstFailure(st);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(tiled_runs[rank].mlp_tiles, 4) << "stage " << stage << " rank " << rank;
      EXPECT_EQ(tiled_runs[rank].loss_tiles, 6) << "stage " << stage << " rank " << rank;
    }
    EXPECT_EQ(tiled_runs[0].hash, tiled_runs[1].hash) << "collective sequences differ";
    EXPECT_EQ(tiled_runs[0].collectives, tiled_runs[1].collectives);
  }
}

TEST(InstallTiledComputeTest, NegativeTileSizeIsRefusedNamingTheField) {
  const spec::LlamaConfig c = Tiny(false);
  auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {1, 0.1});
  auto model = *LlamaModel::Create(c, rep.get());
  spec::TiledComputeOptions o;
  o.mlp = true;
  o.mlp_tile_size = -1;
  absl::Status st = InstallTiledCompute(o, nullptr, model.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("training.tiled_mlp_tile_size"), std::string::npos) << st;
}

}  // namespace
}  // namespace loom::engine
