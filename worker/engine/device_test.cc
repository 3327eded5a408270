// ResolveRankDevice's rules, and that this binary's LibTorch has libtorch_cuda loaded (the link
// keeps it with --no-as-needed; without that its CUDA hooks never register and every GPU rank
// would silently lack CUDA). The versions themselves are checked against the venv's PyTorch by
// //worker/trainer:trainer_libtorch_test, which shares no code with device.cc.
#include "worker/engine/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/testing/status_matchers.h"

namespace loom::engine {
namespace {

using ::loom::testing::StatusIs;

TEST(ResolveRankDeviceTest, CpuKindsComputeOnTheHostWhateverTheDevices) {
  for (const char* kind : {"cpu", ""}) {
    for (int devices : {0, 1, 8}) {
      absl::StatusOr<RankDevice> d = ResolveRankDevice(kind, 3, devices);
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_FALSE(d->cuda);
      EXPECT_EQ(d->ToString(), "cpu");
    }
  }
}

TEST(ResolveRankDeviceTest, AGpuKindWithoutACudaDeviceIsAConfigurationErrorNamingTheField) {
  for (const char* kind : {"h100", "h200", "gh200"}) {
    EXPECT_THAT(ResolveRankDevice(kind, 0, 0),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         std::string("resources.accelerator: ") + kind + " needs a CUDA device"));
  }
}

TEST(ResolveRankDeviceTest, OneVisibleDeviceIsTheRanksOwnWhateverItsLocalRank) {
  absl::StatusOr<RankDevice> d = ResolveRankDevice("h100", 5, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->cuda);
  EXPECT_EQ(d->index, 0);
  EXPECT_EQ(d->ToString(), "cuda:0");
}

TEST(ResolveRankDeviceTest, SeveralVisibleDevicesAreIndexedByLocalRank) {
  absl::StatusOr<RankDevice> d = ResolveRankDevice("h200", 6, 8);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ToString(), "cuda:6");
  EXPECT_THAT(ResolveRankDevice("h200", 8, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, "local rank 8 has no CUDA device"));
  EXPECT_THAT(ResolveRankDevice("h200", -1, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, "local rank -1"));
}

TEST(ResolveRankDeviceTest, AnUnknownKindIsNamed) {
  EXPECT_THAT(ResolveRankDevice("tpu", 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "resources.accelerator: \"tpu\" is not one of cpu, h100, h200, gh200"));
}

TEST(DescribeLibTorchTest, TheCudaBuildOfLibTorchIsLinkedWithItsKernelsRegistered) {
  const LibTorchInfo info = DescribeLibTorch();
  EXPECT_THAT(info.torch_version, ::testing::StartsWith("2."));
  EXPECT_TRUE(info.cuda_linked) << LibTorchInfoLine(info);
  EXPECT_GE(info.cuda_runtime_version, 13000);
  EXPECT_GT(info.nccl_version, 0);
  EXPECT_GE(info.cuda_devices, 0);
  EXPECT_THAT(LibTorchInfoLine(info), ::testing::HasSubstr("CUDA devices: "));
}

}  // namespace
}  // namespace loom::engine
