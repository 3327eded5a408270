// FitOnNodes on plans with hand-written terms (the arithmetic by hand below), and
// CheckJobFitsMemory / SuggestMemoryFit on real plans: a refusal's suggestion, applied, fits; a
// full-size 7B model on two 24 GiB CPU workers (issue 48's example) is refused with no way out.
#include "spec/memory_fit.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spec/llama_shape_for_tests.h"

namespace loom::spec {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr loom::v1::AcceleratorKind kCpu = loom::v1::ACCELERATOR_KIND_CPU;
constexpr loom::v1::AcceleratorKind kH100 = loom::v1::ACCELERATOR_KIND_H100;

RankMemoryPlan CpuPlan() {  // 1.5 GiB a rank; with the 15% margin 1.725 GiB
  RankMemoryPlan p;
  p.cpu_rank = true;
  p.host = {{"optimizer states", kGiB, "", true}, {"parameters", kGiB / 2, "", true}};
  return p;
}

NodeShape Node(loom::v1::AcceleratorKind kind, int slots, int64_t host, int64_t accel = 0,
               int count = 1) {
  NodeShape n;
  n.kind = kind;
  n.slots = slots;
  n.host_memory_bytes = host;
  n.accelerator_memory_bytes = accel;
  n.count = count;
  return n;
}

TEST(MemoryFitTest, NodesHoldAsManyRanksAsSlotsAndMemoryAllow) {
  const RankMemoryPlan plan = CpuPlan();
  // 24 GiB / 1.725 GiB = 13 ranks by memory, 2 by slots: 2 per node, 4 on two nodes.
  const std::vector<NodeShape> roomy = {Node(kCpu, 2, 24 * kGiB, 0, 2)};
  EXPECT_TRUE(FitOnNodes(plan, 4, kCpu, 0, roomy).fits);
  EXPECT_EQ(FitOnNodes(plan, 4, kCpu, 0, roomy).ranks_held, 4);
  // 3 GiB holds one 1.725 GiB rank: two such nodes hold 2 of 3 ranks.
  const std::vector<NodeShape> small = {Node(kCpu, 2, 3 * kGiB, 0, 2)};
  const MemoryFit fit = FitOnNodes(plan, 3, kCpu, 0, small);
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.ranks_held, 2);
  EXPECT_EQ(fit.place, "host");
  EXPECT_EQ(fit.need_bytes, 1852204647);  // ceil(1610612736 x 1.15) = ceil(1852204646.4)
  EXPECT_EQ(fit.room_bytes, 3 * kGiB);
  EXPECT_EQ(fit.largest.name, "optimizer states");
  // With accelerators_per_node 2 a node holds 2 ranks or none: none here.
  EXPECT_EQ(FitOnNodes(plan, 2, kCpu, 2, small).ranks_held, 0);
  // Memory not reported never refuses; other kinds are not counted; no node of the kind: fits.
  EXPECT_TRUE(FitOnNodes(plan, 3, kCpu, 0, {Node(kCpu, 2, 0, 0, 2)}).fits);
  EXPECT_EQ(FitOnNodes(plan, 2, kCpu, 0, {Node(kH100, 8, 24 * kGiB), Node(kCpu, 2, 3 * kGiB)})
                .ranks_held,
            1);
  EXPECT_TRUE(FitOnNodes(plan, 64, kCpu, 0, {Node(kH100, 8, 3 * kGiB)}).fits);
}

TEST(MemoryFitTest, AnAcceleratorRankMustFitItsDeviceAndItsShareOfTheHost) {
  RankMemoryPlan plan;
  plan.cpu_rank = false;
  plan.device = {{"parameters", 50 * kGiB, "", true}, {"activations", 20 * kGiB, "", false}};
  plan.host = {{"optimizer states (offloaded)", 100 * kGiB, "", true}};
  // Device: 70 GiB x 1.15 = 80.5 GiB > 80 GiB: no H100 holds a rank.
  const MemoryFit on_h100 = FitOnNodes(plan, 8, kH100, 0, {Node(kH100, 8, 2048 * kGiB, 80 * kGiB)});
  EXPECT_FALSE(on_h100.fits);
  EXPECT_EQ(on_h100.place, "device");
  EXPECT_EQ(on_h100.room_bytes, 80 * kGiB);
  EXPECT_EQ(on_h100.largest.name, "parameters");
  // 141 GiB accelerators hold it; 1 TiB of host holds floor(1024 / 115) = 8 ranks' offload.
  EXPECT_EQ(FitOnNodes(plan, 8, kH100, 0, {Node(kH100, 8, 1024 * kGiB, 141 * kGiB)}).ranks_held, 8);
  // 512 GiB of host holds 4 of them: the host binds.
  const MemoryFit host_bound =
      FitOnNodes(plan, 8, kH100, 0, {Node(kH100, 8, 512 * kGiB, 141 * kGiB)});
  EXPECT_EQ(host_bound.ranks_held, 4);
  EXPECT_EQ(host_bound.place, "host");
}

MemoryPlanInput Job(const LlamaConfig& model, int stage, int ranks, int64_t micro,
                    int64_t sequence) {
  MemoryPlanInput in;
  in.model = model;
  in.ds.zero.stage = stage;
  in.ds.train_micro_batch_size_per_gpu = micro;
  in.world_size = ranks;
  in.sequence_length = sequence;
  return in;
}

int64_t HostNeed(const MemoryPlanInput& in) {
  absl::StatusOr<RankMemoryPlan> p = PlanRankMemory(in);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? static_cast<int64_t>(p->host_bytes() * (1 + kAdmissionMargin)) + 1 : 0;
}

TEST(MemoryFitTest, ARefusalSuggestsTheNextZeroStageAndTheSuggestionFits) {
  // ~110M parameters: 16 bytes each unsharded (fp32 weights, gradients, Adam's two moments).
  const MemoryPlanInput stage0 = Job(LlamaShape(768, 2048, 12, 12, 4, 32000), 0, 2, 2, 256);
  MemoryPlanInput in = stage0;
  in.ds.zero.stage = 2;
  MemoryPlanInput stage3 = in;
  stage3.ds.zero.stage = 3;
  ASSERT_LT(HostNeed(stage3), HostNeed(in));
  ASSERT_LT(HostNeed(in), HostNeed(stage0));
  // Stage 0 on room for stage 2: stage 2 is offered first.
  const std::vector<NodeShape> for_stage2 = {
      Node(kCpu, 1, (HostNeed(in) + HostNeed(stage0)) / 2, 0, 2)};
  EXPECT_THAT(std::string(CheckJobFitsMemory(stage0, kCpu, 0, for_stage2).message()),
              HasSubstr("Would fit: deepspeed_config.zero_optimization.stage: 2 (then"));
  // Room for stage 3's rank and not stage 0's, on two one-slot nodes.
  const int64_t room = (HostNeed(stage3) + HostNeed(in)) / 2;
  const std::vector<NodeShape> nodes = {Node(kCpu, 1, room, 0, 2)};
  const absl::Status refused = CheckJobFitsMemory(in, kCpu, 0, nodes);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              StartsWith("memory: 2 cpu ranks would run out of memory"));
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("Would fit: deepspeed_config.zero_optimization.stage: 3 (then"));
  EXPECT_TRUE(CheckJobFitsMemory(stage3, kCpu, 0, nodes).ok());
  // Queued capacity aside, nothing to say when the nodes do not report memory.
  EXPECT_TRUE(CheckJobFitsMemory(in, kCpu, 0, {Node(kCpu, 1, 0, 0, 2)}).ok());
}

TEST(MemoryFitTest, OneRankWithLongSequencesIsToldToCheckpointActivationsFirst) {
  const MemoryPlanInput in = Job(LlamaShape(512, 1408, 8, 8, 8, 32000), 0, 1, 4, 4096);
  MemoryPlanInput checkpointed = in;
  checkpointed.exec.activation_checkpointing = true;
  ASSERT_LT(HostNeed(checkpointed), HostNeed(in));
  const std::vector<NodeShape> nodes = {
      Node(kCpu, 1, (HostNeed(checkpointed) + HostNeed(in)) / 2)};
  const std::optional<MemorySuggestion> s = SuggestMemoryFit(in, kCpu, 0, nodes);
  ASSERT_TRUE(s.has_value());
  EXPECT_THAT(s->change, StartsWith("deepspeed_config.activation_checkpointing: {}"));
  EXPECT_EQ(s->num_ranks, 1);
  EXPECT_TRUE(CheckJobFitsMemory(checkpointed, kCpu, 0, nodes).ok());
}

TEST(MemoryFitTest, MoreRanksWhenTheNodesHaveSlotsForThem) {
  const MemoryPlanInput in = Job(LlamaShape(768, 2048, 12, 12, 4, 32000), 3, 2, 1, 128);
  MemoryPlanInput eight = in;
  eight.world_size = 8;
  MemoryPlanInput four = in;
  four.world_size = 4;
  ASSERT_LT(HostNeed(eight), HostNeed(four));
  // Checkpointing and a smaller micro-batch do not help (micro-batch 1, short sequences);
  // 8 ranks on 8 one-slot nodes with room for an 8-way shard, not a 4-way one.
  MemoryPlanInput checkpointed = in;
  checkpointed.exec.activation_checkpointing = true;
  const int64_t room = (HostNeed(eight) + HostNeed(four)) / 2;
  ASSERT_GT(HostNeed(checkpointed), room);
  const std::vector<NodeShape> nodes = {Node(kCpu, 1, room, 0, 8)};
  const std::optional<MemorySuggestion> s = SuggestMemoryFit(in, kCpu, 0, nodes);
  ASSERT_TRUE(s.has_value());
  EXPECT_THAT(s->change, StartsWith("resources.num_ranks: 8 (train_batch_size, if set"));
  EXPECT_EQ(s->num_ranks, 8);
  EXPECT_TRUE(CheckJobFitsMemory(eight, kCpu, 0, nodes).ok());
}

TEST(MemoryFitTest, AFullSize7BModelOnTwo24GiBWorkersIsRefusedWithNoWayOut) {
  // Qwen2.5-7B's shape (7.6B parameters): 16 bytes a parameter is 122 GB, 61 GB a rank at ZeRO-3
  // on 2 ranks, against 24 GiB nodes.
  const MemoryPlanInput in = Job(LlamaShape(3584, 18944, 28, 28, 4, 152064), 3, 2, 1, 1024);
  const absl::Status refused = CheckJobFitsMemory(in, kCpu, 0, {Node(kCpu, 1, 24 * kGiB, 0, 2)});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), StartsWith("memory: 2 cpu ranks would run out of memory: one "
                                            "rank needs "));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("No change found fits these nodes: even with ZeRO "
                                           "stage 3, activation checkpointing, micro-batch 1 and "
                                           "2 ranks a rank needs "));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("the roomiest has 24.00 GiB"));
}

}  // namespace
}  // namespace loom::spec
