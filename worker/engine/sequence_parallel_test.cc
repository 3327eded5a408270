// The sequence-parallel data path and loss convention (sequence_parallel.h) on real Gloo ranks
// (threads):
//   * ShardSample/ShiftLabels give DeepSpeed's AL-1 shards exactly (labels shifted before
//     sharding: the label at the shard boundary is kept);
//   * 4 ranks = 2 data-parallel x 2 sequence-parallel, ZeRO stages 1, 2 and 3 over all 4 ranks
//     with gradient_divide_factor = D: the loss, every reduced gradient partition and the global
//     gradient norm (the clipping input) equal the unsharded model's averaged over the two
//     samples (ReplicatedProvider on one rank with the default attention core and the full
//     sequence; fp32, |a-b| <= 1e-6 + 1e-4|b|), with padded labels and a shard whose labels
//     are all ignored (n_r = 0).
#include "worker/engine/sequence_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/collectives.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/replicated_provider.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;

TEST(ShardSampleTest, DeepSpeedAdapterShardsOfTheSixTokenSample) {
  const at::Tensor ids = at::tensor({1, 10, 10, 10, 2, 2}, at::kLong).view({1, 6});
  const at::Tensor targets = ShiftLabels(ids);  // HF: labels = ids, shifted here
  EXPECT_TRUE(at::equal(targets, at::tensor({10, 10, 10, 2, 2, -100}, at::kLong).view({1, 6})));
  SequenceShard r0 = ShardSample(ids, targets, 0, 2), r1 = ShardSample(ids, targets, 1, 2);
  EXPECT_TRUE(at::equal(r0.ids, at::tensor({1, 10, 10}, at::kLong).view({1, 3})));
  EXPECT_TRUE(at::equal(r0.positions, at::tensor({0, 1, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(r0.labels, at::tensor({10, 10, 10}, at::kLong).view({1, 3})));
  EXPECT_TRUE(at::equal(r1.ids, at::tensor({10, 2, 2}, at::kLong).view({1, 3})));
  EXPECT_TRUE(at::equal(r1.positions, at::tensor({3, 4, 5}, at::kLong)));
  EXPECT_TRUE(at::equal(r1.labels, at::tensor({2, 2, -100}, at::kLong).view({1, 3})));
  EXPECT_EQ(r0.valid, 3);
  EXPECT_EQ(r1.valid, 2);
  EXPECT_EQ(r0.global_valid, 5);
  EXPECT_THROW(ShardSample(ids, targets, 0, 4), c10::Error);  // 6 % 4 != 0
}

constexpr double kAtol = 1e-6, kRtol = 1e-4;

spec::LlamaConfig Tiny() { return testing::TinyLlamaConfig(); }

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
  at::Tensor ids, targets;  // [1, S]
};

TEST(SequenceParallelLossTest, LossGradientsAndNormEqualTheUnshardedModelForZeroStages123) {
  const spec::LlamaConfig c = Tiny();
  const uint64_t seed = 31;
  const int64_t s = 12;
  at::manual_seed(5);
  std::vector<Sample> samples(2);
  for (Sample& x : samples) {
    x.ids = at::randint(0, c.vocab_size, {1, s}, at::kLong);
    x.targets = at::randint(0, c.vocab_size, {1, s}, at::kLong);
  }
  samples[0].targets.narrow(1, 9, 3).fill_(kIgnoreLabel);  // right padding: n = 5 and 4
  samples[1].targets.narrow(1, 6, 6).fill_(kIgnoreLabel);  // SP rank 1's shard: n_r = 0

  // The reference: the unsharded model on each full sample, gradients averaged over the two.
  double ref_loss = 0;
  std::vector<at::Tensor> ref_grads;
  for (const Sample& x : samples) {
    auto rep = *ReplicatedProvider::Create(spec::LlamaParamSpecs(c), {seed, c.initializer_range});
    auto model = *LlamaModel::Create(c, rep.get());
    LossOutput out = model->Loss(x.ids, x.targets);
    (out.loss / 2.0).backward();
    ref_loss += out.loss.item<double>() / 2;
    for (size_t i = 0; i < rep->param_specs().size(); ++i) {
      if (ref_grads.size() <= i) {
        ref_grads.push_back(rep->grad(i).clone());
      } else {
        ref_grads[i] += rep->grad(i);
      }
    }
  }
  double ref_sq = 0;
  for (const at::Tensor& g : ref_grads) ref_sq += g.pow(2).sum().item<double>();

  for (int stage : {1, 2, 3}) {
    std::vector<absl::Status> st = RunGang(4, [&](int rank, Collectives& world) {
      absl::StatusOr<std::unique_ptr<ProcessGroups>> groups = ProcessGroups::Create(world, 2);
      if (!groups.ok()) return groups.status();
      ZeroOptions o;
      o.stage = stage;
      o.reduce_bucket_size = 300;
      o.param_persistence_threshold = 0;
      o.gradient_divide_factor = (*groups)->data_parallel_size();  // D, not D x P
      auto zero =
          *ZeroProvider::Create(spec::LlamaParamSpecs(c), &world, {seed, c.initializer_range}, o);
      auto model = *LlamaModel::Create(c, zero.get());
      absl::StatusOr<std::unique_ptr<SequenceParallelRunner>> sp = SequenceParallelRunner::Create(
          model.get(), (*groups)->sequence_parallel().collectives, false);
      if (!sp.ok()) return sp.status();
      const Sample& x = samples[(*groups)->data_parallel().rank()];
      zero->BeginMicroStep(true);
      SequenceParallelRunner::MicroStep m = (*sp)->Loss(x.ids, x.targets);
      m.backprop.backward();
      zero->FinishMicroStep();
      at::Tensor loss = at::full({1}, m.loss / 4, at::kDouble);  // mean over the world
      if (absl::Status s = world.AllReduce(loss, ReduceOp::kSum); !s.ok()) return s;
      EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-6 * ref_loss) << "stage " << stage;
      for (size_t i = 0; i < ref_grads.size(); ++i) {
        const ZeroParam& p = zero->params()[i];
        EXPECT_TRUE(p.grad.defined()) << p.spec.name;
        if (!p.grad.defined()) continue;
        EXPECT_TRUE(Close(p.grad, PartitionOf(ref_grads[i], p)))
            << "stage " << stage << " rank " << rank << " " << p.spec.name << " max |diff| "
            << (p.grad - PartitionOf(ref_grads[i], p)).abs().max().item<double>();
      }
      at::Tensor sq = at::full({1}, zero->LocalGradSquaredNorm(), at::kDouble);
      if (absl::Status s = world.AllReduce(sq, ReduceOp::kSum); !s.ok()) return s;
      EXPECT_NEAR(std::sqrt(sq.item<double>()), std::sqrt(ref_sq), 1e-5 * std::sqrt(ref_sq))
          << "stage " << stage << ": the clipping norm";
      // Outside the runner the Ulysses core is off: a full-sequence forward on every rank is
      // the plain model's.
      at::NoGradGuard no_grad;
      at::Tensor logits = model->Forward(x.ids);
      EXPECT_EQ(logits.size(1), s);
      return absl::OkStatus();
    });
    ASSERT_TRUE(FirstFailure(st).ok()) << "stage " << stage << ": " << FirstFailure(st);
  }
}

}  // namespace
}  // namespace loom::engine
