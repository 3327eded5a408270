// A -0.0 gradient element keeps its sign through the ZeRO gradient sink, as in PyTorch (autograd's
// AccumulateGrad takes a parameter's first gradient as it is, and DDP's sum of -0.0 over ranks is
// -0.0): the reduced mean is what IEEE arithmetic gives for the sum, over ranks and micro-steps,
// of the contributions divided by the world size. The reference is computed in the test with
// plain float arithmetic. Stage 1's pooled local accumulator (zero_grads.cc NewLocalGrad) and
// stage 0's gradient used to be zero-filled and then added to, which turns -0.0 into +0.0
// (+0.0 + -0.0 == +0.0); the first contribution is now copied. Two ranks as threads over real
// Gloo, stages 0-3, through AddGrad and (fp32, stages 1-3) through GradDestination/CommitGrad,
// with 1 and 2 micro-steps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/engine/collectives.h"
#include "worker/engine/partition.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;
using spec::LlamaConfig;
using spec::LlamaParamSpecs;
using spec::ParamSpec;

// contribution[rank][element]; every value is exact in fp32 at every step of every order.
const std::vector<std::vector<float>> kContribution = {
    {-0.0f, -0.0f, +0.0f, 1.0f, -0.0f, -2.0f, -0.0f},
    {-0.0f, +0.0f, +0.0f, -1.0f, 1.0f, -4.0f, -0.0f}};
constexpr int64_t kNumel = 7;  // odd: rank 1's partition is zero-padded

// The mean over 2 ranks of `micros` identical contributions per rank, by plain float arithmetic.
float Reference(int64_t k, int micros) {
  float sum = 0;
  for (int r = 0; r < 2; ++r) {
    float local = kContribution[r][k];
    for (int m = 1; m < micros; ++m) local = local + kContribution[r][k];
    sum = r == 0 ? local / 2 : sum + local / 2;
  }
  return sum;
}

void RunStage(int stage, bool destination, int micros) {
  const std::string what = absl::StrCat(
      "stage ", stage, destination ? " GradDestination" : " AddGrad", ", ", micros, " micro-steps");
  std::vector<absl::Status> st = RunGang(2, [&](int rank, Collectives& world) -> absl::Status {
    ZeroOptions o;
    o.stage = stage;
    o.param_persistence_threshold = 0;
    ParamSpec spec{"w", {kNumel}, ParamSpec::Kind::kLinear};
    absl::StatusOr<std::unique_ptr<ZeroProvider>> zero =
        ZeroProvider::Create({spec}, &world, {7, 0.02}, o);
    if (!zero.ok()) return zero.status();
    const at::Tensor mine = at::tensor(kContribution[rank], at::kFloat);
    for (int m = 0; m < micros; ++m) {
      (*zero)->BeginMicroStep(/*last=*/m == micros - 1);
      at::Tensor dest = destination ? (*zero)->GradDestination(0, at::kFloat) : at::Tensor();
      if (dest.defined()) {
        dest.copy_(mine);
        (*zero)->CommitGrad(0);
      } else {
        (*zero)->AddGrad(0, mine.clone());
      }
      (*zero)->FinishMicroStep();
    }
    const at::Tensor got = (*zero)->params()[0].grad.contiguous();
    const PartitionSlice slice = ComputePartition(kNumel, 2, rank);
    const int64_t begin = stage == 0 ? 0 : slice.begin, end = stage == 0 ? kNumel : slice.end;
    for (int64_t k = begin; k < end; ++k) {
      const float want = Reference(k, micros);
      const float g = got[k - begin].item<float>();
      EXPECT_EQ(g, want) << what << " rank " << rank << " element " << k;
      EXPECT_EQ(std::signbit(g), std::signbit(want))
          << what << " rank " << rank << " element " << k << ": got " << g << ", want " << want;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << what << ": " << FirstFailure(st);
}

TEST(SignedZeroGradTest, AddGradKeepsTheSignOfZero) {
  for (int stage : {0, 1, 2, 3}) {
    for (int micros : {1, 2}) RunStage(stage, /*destination=*/false, micros);
  }
}

TEST(SignedZeroGradTest, GradDestinationKeepsTheSignOfZero) {
  for (int stage : {1, 2, 3}) {
    for (int micros : {1, 2}) RunStage(stage, /*destination=*/true, micros);
  }
}

}  // namespace
}  // namespace loom::engine
