// ZeroOptionsFor (trainer_zero_options.h): the ZeRO provider divides gradients by the factor the
// ProcessGroups carry for the partition group (DeepSpeed issue #5248's caveat,
// docs/design/TECHNIQUES.md §3.2). Two ranks as threads over real Gloo: each hands the provider a
// known gradient, and the reduced gradient is checked against the sum written out in the test: a
// data-parallel job (P = 1) gets the mean over the 2 ranks, a sequence-parallel job (P = 2, D = 1,
// the trainer's loss_r * n_r / N convention) the sum, for every ZeRO stage.
#include "worker/engine/trainer_zero_options.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/collectives.h"
#include "worker/engine/partition.h"
#include "worker/engine/process_groups.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;

constexpr int64_t kNumel = 5;  // odd: rank 1's partition is padded

// Rank r's local gradient: element k is (k + 1) * (r + 1) + 0.25 * r.
std::vector<float> LocalGrad(int rank) {
  std::vector<float> g(kNumel);
  for (int64_t k = 0; k < kNumel; ++k) g[k] = (k + 1) * (rank + 1) + 0.25f * rank;
  return g;
}

// Runs one last micro-step on 2 ranks with sequence_parallel_size `sp` and checks that every
// rank's reduced gradient (its partition; stage 0 the whole) is (g_0 + g_1) / want_factor.
void ExpectReducedBy(int sp, double want_factor) {
  for (int stage : {0, 1, 2, 3}) {
    std::vector<absl::Status> st = RunGang(2, [&](int rank, Collectives& world) {
      absl::StatusOr<std::unique_ptr<ProcessGroups>> groups =
          ProcessGroups::Create(world, sp, SequenceLoss::kShareOfSample);
      if (!groups.ok()) return groups.status();
      spec::DeepSpeedConfig ds;
      ds.zero.stage = stage;
      const ZeroOptions o = ZeroOptionsFor(ds, **groups);
      EXPECT_EQ(o.gradient_divide_factor, want_factor) << "stage " << stage;
      spec::ParamSpec spec{"w", {kNumel}, spec::ParamSpec::Kind::kLinear};
      absl::StatusOr<std::unique_ptr<ZeroProvider>> zero =
          ZeroProvider::Create({spec}, &world, {7, 0.02}, o);
      if (!zero.ok()) return zero.status();
      std::vector<float> mine = LocalGrad(rank);
      (*zero)->BeginMicroStep(/*last=*/true);
      (*zero)->AddGrad(0, at::from_blob(mine.data(), {kNumel}, at::kFloat).clone());
      (*zero)->FinishMicroStep();
      const at::Tensor got = (*zero)->params()[0].grad.contiguous();
      const PartitionSlice slice = ComputePartition(kNumel, 2, rank);
      const int64_t begin = stage == 0 ? 0 : slice.begin, end = stage == 0 ? kNumel : slice.end;
      const std::vector<float> g0 = LocalGrad(0), g1 = LocalGrad(1);
      for (int64_t k = begin; k < end; ++k) {
        const double want = (static_cast<double>(g0[k]) + g1[k]) / want_factor;
        EXPECT_NEAR(got[k - begin].item<double>(), want, 1e-6 * std::abs(want))
            << "stage " << stage << " rank " << rank << " element " << k;
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(FirstFailure(st).ok()) << "stage " << stage << ": " << FirstFailure(st);
  }
}

TEST(TrainerZeroOptionsTest, DataParallelJobAveragesOverTheWorld) { ExpectReducedBy(1, 2.0); }

// P = 2 on 2 ranks: D = 1, the group's local gradients already sum to the sample's gradient, so
// the reduction must not divide (dividing by the world size would halve every gradient).
TEST(TrainerZeroOptionsTest, SequenceParallelJobDividesByTheDataParallelSize) {
  ExpectReducedBy(2, 1.0);
}

TEST(TrainerZeroOptionsTest, DeepSpeedKeysReachTheProvider) {
  std::unique_ptr<Collectives> local = CreateLocalCollectives();
  absl::StatusOr<std::unique_ptr<ProcessGroups>> groups = ProcessGroups::Create(*local, 1);
  ASSERT_TRUE(groups.ok()) << groups.status();
  spec::DeepSpeedConfig ds;
  ds.zero.stage = 3;
  ds.bf16_enabled = true;
  ds.zero.reduce_bucket_size = 123;
  ds.zero.allgather_bucket_size = 456;
  ds.zero.stage3_prefetch_bucket_size = 789;
  ds.zero.stage3_param_persistence_threshold = 11;
  ds.zero.stage3_max_live_parameters = 12;
  ds.zero.stage3_max_reuse_distance = 13;
  const ZeroOptions o = ZeroOptionsFor(ds, **groups);
  EXPECT_EQ(o.stage, 3);
  EXPECT_EQ(o.param_dtype, at::kBFloat16);
  EXPECT_EQ(o.reduce_bucket_size, 123);
  EXPECT_EQ(o.allgather_bucket_size, 456);
  EXPECT_EQ(o.prefetch_bucket_size, 789);
  EXPECT_EQ(o.param_persistence_threshold, 11);
  EXPECT_EQ(o.max_live_parameters, 12);
  EXPECT_EQ(o.max_reuse_distance, 13);
  EXPECT_EQ(o.gradient_divide_factor, 1.0);  // a one-rank world
  EXPECT_EQ(o.communication_dtype, at::ScalarType::Undefined);  // absent: the provider's default
  for (const auto& [name, want] : std::vector<std::pair<std::string, at::ScalarType>>{
           {"fp32", at::kFloat}, {"bf16", at::kBFloat16}, {"fp16", at::kHalf}}) {
    ds.communication_data_type = name;
    EXPECT_EQ(ZeroOptionsFor(ds, **groups).communication_dtype, want) << name;
  }
}

}  // namespace
}  // namespace loom::engine
