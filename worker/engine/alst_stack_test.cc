// The whole ALST stack as bench/alst_search.py's `sp2` rung and a job with every issue-13 key
// turn it on, composed on real Gloo ranks (threads, RunGang), against the plain unsharded model:
//   Ulysses sequence parallelism (SequenceParallelRunner, fp32 wire) wrapping the blockwise
//   (FlashAttention-2) core with a block that divides neither S nor the shard, TiledMlp and
//   TiledLogitsLoss with uneven last tiles (tile counts agreed over the ZeRO group), per-layer
//   activation checkpointing with the checkpointed inputs offloaded to host memory, and ZeRO
//   over dp x sp with gradient_divide_factor = D (ProcessGroups' kShareOfSample, as the Trainer
//   builds it).
// Reference: one rank, ReplicatedProvider, the default materialised attention, untiled MLP and
// loss head, no checkpointing, each full sample; its gradients averaged over the D samples.
// Checked (fp32, |a-b| <= 1e-6 + 1e-4 |b|; loss and clipping norm 1e-5 relative): the loss,
// every reduced gradient partition, and the global gradient norm used for clipping, for
//   * 4 ranks = 2 data x 2 sequence ranks, ZeRO stages 1, 2 and 3, with a padded sample and a
//     shard whose labels are all ignored (n_r = 0), and the backprop multiplied by k = 1/2
//     (GAS 2's 1/GAS): every gradient, lm_head's included, is k x the reference's;
//   * 4 ranks = 1 data x 4 sequence ranks with 2 KV heads (fewer than P: replicated), stage 3;
//   * a packed sample of two documents (per-document positions) on 2 sequence ranks, stage 3:
//     equal to each document alone (no attention across the boundary).
// Also: the tiled ops ran (tile counts > 1) and the offloaded checkpoint bytes are counted after
// the forward and released by the backward.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/activation_checkpoint.h"
#include "worker/engine/model/blockwise_attention.h"
#include "worker/engine/model/tiled_ops.h"
#include "worker/engine/model/ulysses_attention.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/sequence_parallel.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/memory_tracker.h"
#include "worker/engine/zero/replicated_provider.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;
using spec::LlamaConfig;
using spec::LlamaParamSpecs;
using spec::ParamSpec;

constexpr double kAtol = 1e-6, kRtol = 1e-4;
constexpr uint64_t kSeed = 41;

bool Close(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).abs() - kRtol * want.abs()).max().item<double>() <= kAtol;
}

at::Tensor PartitionOf(const at::Tensor& full, const ZeroParam& p) {
  at::Tensor out = at::zeros({p.slice.partition_numel}, at::kFloat);
  if (p.slice.valid() > 0) {
    out.narrow(0, 0, p.slice.valid())
        .copy_(full.reshape({-1}).narrow(0, p.slice.begin, p.slice.valid()));
  }
  return out;
}

struct Sample {
  at::Tensor ids, targets;  // [1, S] int64; targets already shifted, -100 ignored
};

struct Layout {
  int sp;                      // sequence-parallel degree P (world 4, D = 4 / P)
  int64_t seq;                 // S
  int64_t mlp_tile, loss_tile, attn_block;
  double k;                    // the backprop is multiplied by k (GAS's 1/GAS)
};

struct Reference {
  double loss = 0;                 // mean over the D samples
  std::vector<at::Tensor> grads;   // k x the mean over the D samples of the full gradients
  double norm = 0;                 // of `grads`
};

Reference Unsharded(const LlamaConfig& c, const std::vector<Sample>& samples, double k) {
  Reference r;
  const double d = static_cast<double>(samples.size());
  for (const Sample& x : samples) {
    auto rep = *ReplicatedProvider::Create(LlamaParamSpecs(c), {kSeed, c.initializer_range});
    auto model = *LlamaModel::Create(c, rep.get());
    LossOutput out = model->Loss(x.ids, x.targets);
    (out.loss * (k / d)).backward();
    r.loss += out.loss.item<double>() / d;
    for (size_t i = 0; i < rep->param_specs().size(); ++i) {
      if (r.grads.size() <= i) {
        r.grads.push_back(rep->grad(i).clone());
      } else {
        r.grads[i] += rep->grad(i);
      }
    }
  }
  double sq = 0;
  for (const at::Tensor& g : r.grads) sq += g.pow(2).sum().item<double>();
  r.norm = std::sqrt(sq);
  return r;
}

// One micro-step of the full stack on 4 ranks; expectations against `ref`.
void ExpectStackEqualsUnsharded(const LlamaConfig& c, const Layout& l, int stage,
                                const std::vector<Sample>& samples, const Reference& ref) {
  std::vector<absl::Status> st = RunGang(4, [&](int rank, Collectives& world) {
    const std::string what = absl::StrCat("P ", l.sp, " stage ", stage, " rank ", rank);
    absl::StatusOr<std::unique_ptr<ProcessGroups>> groups =
        ProcessGroups::Create(world, l.sp, SequenceLoss::kShareOfSample);
    if (!groups.ok()) return groups.status();
    EXPECT_EQ((*groups)->data_parallel_size(), static_cast<int>(samples.size())) << what;
    ZeroOptions o;
    o.stage = stage;
    o.reduce_bucket_size = 300;
    o.param_persistence_threshold = 0;
    o.gradient_divide_factor = (*groups)->zero_partition().grad_divide_factor;  // D
    auto zero = *ZeroProvider::Create(LlamaParamSpecs(c), &world, {kSeed, c.initializer_range}, o);
    auto model = *LlamaModel::Create(c, zero.get());
    // The Trainer's order: checkpointing, tiled ops (tile counts agreed over the ZeRO group),
    // then the runner, which wraps the blockwise core in Ulysses.
    ActivationCheckpointOptions ck;
    ck.enabled = true;
    ck.cpu_offload = true;
    ck.memory = &zero->memory();
    model->set_activation_checkpointing(ck);
    auto mlp = std::make_unique<TiledMlp>(zero.get(), &world, l.mlp_tile);
    TiledMlp* mlp_op = mlp.get();
    model->set_mlp_core(std::move(mlp));
    auto head = std::make_unique<TiledLogitsLoss>(zero.get(), &world, model->head_id(), l.loss_tile);
    TiledLogitsLoss* head_op = head.get();
    model->set_loss_head(std::move(head));
    absl::StatusOr<std::unique_ptr<SequenceParallelRunner>> sp = SequenceParallelRunner::Create(
        model.get(), (*groups)->sequence_parallel().collectives, /*bf16_wire=*/false,
        std::make_unique<BlockwiseCausalAttention>(l.attn_block));
    if (!sp.ok()) return sp.status();

    const Sample& x = samples[(*groups)->data_parallel().rank()];
    zero->BeginMicroStep(true);
    SequenceParallelRunner::MicroStep m = (*sp)->Loss(x.ids, x.targets);
    const int64_t offloaded = zero->memory().current(MemoryKind::kActivationOffload);
    (m.backprop * l.k).backward();
    zero->FinishMicroStep();

    const int64_t shard = l.seq / l.sp;
    EXPECT_EQ(offloaded, c.num_hidden_layers * shard * c.hidden_size * 4) << what;
    EXPECT_EQ(zero->memory().current(MemoryKind::kActivationOffload), 0) << what;
    EXPECT_EQ(mlp_op->last_tile_count(), LocalTileCount(shard, l.mlp_tile)) << what;
    EXPECT_EQ(head_op->last_tile_count(), LocalTileCount(shard, l.loss_tile)) << what;
    EXPECT_GT(mlp_op->last_tile_count(), 1) << what;
    EXPECT_GT(head_op->last_tile_count(), 1) << what;

    at::Tensor loss = at::full({1}, m.loss / 4, at::kDouble);  // every rank: its sample's loss
    if (absl::Status s = world.AllReduce(loss, ReduceOp::kSum); !s.ok()) return s;
    EXPECT_NEAR(loss.item<double>(), ref.loss, 1e-5 * ref.loss) << what;
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      const ZeroParam& p = zero->params()[i];
      EXPECT_TRUE(p.grad.defined()) << what << " " << p.spec.name;
      if (!p.grad.defined()) continue;
      const at::Tensor want = PartitionOf(ref.grads[i], p);
      EXPECT_TRUE(Close(p.grad, want)) << what << " " << p.spec.name << " max |diff| "
                                       << (p.grad - want).abs().max().item<double>();
    }
    at::Tensor sq = at::full({1}, zero->LocalGradSquaredNorm(), at::kDouble);
    if (absl::Status s = world.AllReduce(sq, ReduceOp::kSum); !s.ok()) return s;
    EXPECT_NEAR(std::sqrt(sq.item<double>()), ref.norm, 1e-5 * ref.norm)
        << what << ": the clipping norm";
    return absl::OkStatus();
  });
  ASSERT_TRUE(FirstFailure(st).ok()) << "P " << l.sp << " stage " << stage << ": "
                                     << FirstFailure(st);
}

std::vector<Sample> RandomSamples(const LlamaConfig& c, int n, int64_t s) {
  at::manual_seed(9);  // on the test thread; the rank threads only read the samples
  std::vector<Sample> samples(n);
  for (Sample& x : samples) {
    x.ids = at::randint(0, c.vocab_size, {1, s}, at::kLong);
    x.targets = at::randint(0, c.vocab_size, {1, s}, at::kLong);
  }
  return samples;
}

TEST(AlstStackTest, TwoDataByTwoSequenceRanksEqualTheUnshardedModelForZeroStages123) {
  const LlamaConfig c = testing::TinyLlamaConfig();  // 4 heads, 2 KV heads, hidden 16
  // S = 14: shards of 7 tokens; MLP tiles 3+3+1, loss tiles 5+2, attention blocks of 5 over the
  // full 14-token sequence (5+5+4) after the all-to-all.
  const Layout l{2, 14, 3, 5, 5, 0.5};
  std::vector<Sample> samples = RandomSamples(c, 2, l.seq);
  samples[0].targets.narrow(1, 11, 3).fill_(kIgnoreLabel);  // right padding
  samples[1].targets.narrow(1, 7, 7).fill_(kIgnoreLabel);   // SP rank 1's shard: n_r = 0
  const Reference ref = Unsharded(c, samples, l.k);
  for (int stage : {1, 2, 3}) ExpectStackEqualsUnsharded(c, l, stage, samples, ref);
}

TEST(AlstStackTest, FourSequenceRanksWithFewerKvHeadsThanRanksEqualTheUnshardedModel) {
  const LlamaConfig c = testing::TinyLlamaConfig();  // 2 KV heads < P = 4: replicated
  // S = 20: shards of 5 tokens; MLP tiles 2+2+1, loss tiles 3+2, attention blocks of 6.
  const Layout l{4, 20, 2, 3, 6, 1.0};
  const std::vector<Sample> samples = RandomSamples(c, 1, l.seq);
  const Reference ref = Unsharded(c, samples, l.k);
  ExpectStackEqualsUnsharded(c, l, 3, samples, ref);
}

// A packed sample of two documents (9 + 7 tokens, per-document positions restarting at 0; SP rank
// 1's shard holds the last token of document 1 and all of document 2) through the same stack on
// 2 ranks (one sequence-parallel group, ZeRO-3): equal to each document run alone through the
// plain model, the loss weighted by tokens (Σ loss_d n_d / Σ n_d), so no token attends across
// the boundary. The test gives the Ulysses core and the model the packed positions itself and
// weights the backprop n_r / N as the runner does (the runner's own packed path, fed by the
// trainer's dataset.pack_documents windows, is checked end to end by
// //worker/trainer:sp_compose_test against the 1-rank packed job).
TEST(AlstStackTest, PackedTwoDocumentsThroughTheStackEqualEachDocumentAlone) {
  const LlamaConfig c = testing::TinyLlamaConfig();
  const int64_t la = 9, lb = 7, s = la + lb, shard = s / 2;
  at::manual_seed(13);
  const at::Tensor ids = at::randint(0, c.vocab_size, {1, s}, at::kLong);
  const at::Tensor targets = at::randint(0, c.vocab_size, {1, s}, at::kLong);
  const at::Tensor positions = at::cat({at::arange(la, at::kLong), at::arange(lb, at::kLong)});

  Reference ref;
  {
    auto rep = *ReplicatedProvider::Create(LlamaParamSpecs(c), {kSeed, c.initializer_range});
    auto model = *LlamaModel::Create(c, rep.get());
    at::Tensor total = at::zeros({}, at::kFloat);
    const std::pair<int64_t, int64_t> documents[] = {{0, la}, {la, lb}};  // (start, length)
    for (const auto& [start, len] : documents) {
      LossOutput out = model->Loss(ids.narrow(1, start, len), targets.narrow(1, start, len));
      total = total + out.loss * (static_cast<double>(len) / s);
    }
    total.backward();
    ref.loss = total.item<double>();
    double sq = 0;
    for (size_t i = 0; i < rep->param_specs().size(); ++i) {
      ref.grads.push_back(rep->grad(i).clone());
      sq += rep->grad(i).pow(2).sum().item<double>();
    }
    ref.norm = std::sqrt(sq);
  }

  std::vector<absl::Status> st = RunGang(2, [&](int rank, Collectives& world) {
    const std::string what = absl::StrCat("packed rank ", rank);
    ZeroOptions o;
    o.stage = 3;
    o.reduce_bucket_size = 300;
    o.param_persistence_threshold = 0;
    o.gradient_divide_factor = 1;  // D = 1
    auto zero = *ZeroProvider::Create(LlamaParamSpecs(c), &world, {kSeed, c.initializer_range}, o);
    auto model = *LlamaModel::Create(c, zero.get());
    ActivationCheckpointOptions ck;
    ck.enabled = true;
    ck.cpu_offload = true;
    ck.memory = &zero->memory();
    model->set_activation_checkpointing(ck);
    model->set_mlp_core(std::make_unique<TiledMlp>(zero.get(), &world, 3));
    model->set_loss_head(
        std::make_unique<TiledLogitsLoss>(zero.get(), &world, model->head_id(), 5));
    absl::StatusOr<std::unique_ptr<UlyssesAttention>> core = UlyssesAttention::Create(
        &world, {c.num_attention_heads, c.num_key_value_heads, at::kFloat},
        std::make_unique<BlockwiseCausalAttention>(5));
    if (!core.ok()) return core.status();
    UlyssesAttention* ulysses = core->get();
    model->set_attention_core(std::move(*core));

    const at::Tensor local = positions.narrow(0, rank * shard, shard);
    ulysses->SetLocalPositions(local);
    EXPECT_TRUE(at::equal(ulysses->global_positions(), positions)) << what;
    zero->BeginMicroStep(true);
    LossOutput out = model->Loss(ids.narrow(1, rank * shard, shard),
                                 targets.narrow(1, rank * shard, shard), nullptr, local);
    at::Tensor backprop = out.loss * (static_cast<double>(shard) / s);  // n_r / N
    backprop.backward();
    zero->FinishMicroStep();

    at::Tensor loss = at::full({1}, backprop.item<double>(), at::kDouble);
    if (absl::Status st2 = world.AllReduce(loss, ReduceOp::kSum); !st2.ok()) return st2;
    EXPECT_NEAR(loss.item<double>(), ref.loss, 1e-5 * ref.loss) << what;
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      const ZeroParam& p = zero->params()[i];
      EXPECT_TRUE(p.grad.defined()) << what << " " << p.spec.name;
      if (!p.grad.defined()) continue;
      const at::Tensor want = PartitionOf(ref.grads[i], p);
      EXPECT_TRUE(Close(p.grad, want)) << what << " " << p.spec.name << " max |diff| "
                                       << (p.grad - want).abs().max().item<double>();
    }
    at::Tensor sq = at::full({1}, zero->LocalGradSquaredNorm(), at::kDouble);
    if (absl::Status st2 = world.AllReduce(sq, ReduceOp::kSum); !st2.ok()) return st2;
    EXPECT_NEAR(std::sqrt(sq.item<double>()), ref.norm, 1e-5 * ref.norm) << what;
    return absl::OkStatus();
  });
  ASSERT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

}  // namespace
}  // namespace loom::engine
