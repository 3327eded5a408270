// RankEnvironment (worker/rank_env.h): the expected entries are written out by hand.
#include "worker/rank_env.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using ::testing::ElementsAre;

loom::v1::NodeInventory EightGpus() {
  loom::v1::NodeInventory node;
  node.set_slots(8);
  for (int i = 0; i < 8; ++i) node.add_devices()->set_index(i);
  return node;
}

TEST(RankEnvTest, BoundRankGetsTorchrunsVariablesAndOnlyItsDevice) {
  loom::v1::RankAssignment a;
  a.set_job_id("j");
  a.set_rank(5);
  a.set_world_size(16);
  a.set_master_addr("10.0.0.7");
  a.set_master_port(29511);
  a.add_device_indices(6);
  a.set_local_rank(1);
  a.set_local_world_size(4);
  absl::StatusOr<std::vector<std::string>> env =
      RankEnvironment(a, EightGpus(), /*fallback_index=*/0, {"eth0", "mlx5_0"});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, ElementsAre("RANK=5", "WORLD_SIZE=16", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
                                "MASTER_ADDR=10.0.0.7", "MASTER_PORT=29511",
                                "LOOM_ACCELERATOR_INDEX=6", "CUDA_VISIBLE_DEVICES=6",
                                "NCCL_SOCKET_IFNAME=eth0", "NCCL_IB_HCA=mlx5_0"));
}

TEST(RankEnvTest, UnboundRankOnAGpuNodeGetsTheWorkersSlotAndACpuNodeNoDevices) {
  loom::v1::RankAssignment a;
  a.set_rank(0);
  a.set_world_size(1);
  absl::StatusOr<std::vector<std::string>> gpu = RankEnvironment(a, EightGpus(), 3, {});
  ASSERT_TRUE(gpu.ok());
  EXPECT_THAT(*gpu, ElementsAre("RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
                                "MASTER_ADDR=127.0.0.1", "MASTER_PORT=0",
                                "LOOM_ACCELERATOR_INDEX=3", "CUDA_VISIBLE_DEVICES=3"));
  loom::v1::NodeInventory cpu;
  cpu.set_slots(2);
  absl::StatusOr<std::vector<std::string>> c = RankEnvironment(a, cpu, 1, {});
  ASSERT_TRUE(c.ok());
  for (const std::string& e : *c) EXPECT_EQ(e.find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST(RankEnvTest, ADeviceTheNodeDoesNotHaveIsRefused) {
  loom::v1::RankAssignment a;
  a.set_job_id("j");
  a.set_rank(2);
  a.add_device_indices(8);
  absl::StatusOr<std::vector<std::string>> env = RankEnvironment(a, EightGpus(), 0, {});
  EXPECT_EQ(env.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(env.status().message(),
            "device_indices: rank 2 of j was bound to device 8, which this node does not have (8 "
            "devices)");
  loom::v1::NodeInventory cpu;
  cpu.set_slots(1);
  EXPECT_EQ(RankEnvironment(a, cpu, 0, {}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace loom::worker
