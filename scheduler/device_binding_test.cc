// Device binding (device_binding.h), gang placement with accelerators_per_node (placement.h)
// and the submission check of accelerators_per_node (job_spec_validation_accelerators.h), as
// pure functions. The expected values are written out by hand.
#include "scheduler/device_binding.h"

#include "gtest/gtest.h"
#include "scheduler/job_spec_validation_accelerators.h"
#include "scheduler/placement.h"

namespace loom {
namespace {

TEST(DeviceBindingTest, LowestFreeDevicesInRankOrderAroundHeldOnes) {
  const std::map<std::string, std::vector<int32_t>> devices = {
      {"a", {0, 1, 2, 3, 4, 5, 6, 7}}, {"b", {0, 1, 2, 3, 4, 5, 6, 7}}};
  const std::map<std::string, std::set<int32_t>> held = {{"a", {0, 2}}, {"b", {}}};
  absl::StatusOr<std::vector<int32_t>> bound =
      BindDevices({"a", "b", "a", "a", "cpu-node"}, devices, held);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, (std::vector<int32_t>{1, 0, 3, 4, -1}));
  // More ranks than free devices: refused, naming the node.
  absl::StatusOr<std::vector<int32_t>> full =
      BindDevices({"a", "a", "a", "a", "a", "a", "a"}, devices, held);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("node a: no free device for rank 6"), std::string::npos)
      << full.status();
}

TEST(DeviceBindingTest, LocalRanks) {
  const std::vector<std::string> placement = {"a", "b", "a", "c", "b", "a"};
  EXPECT_EQ(LocalRank(placement, 0), std::make_pair(0, 3));
  EXPECT_EQ(LocalRank(placement, 2), std::make_pair(1, 3));
  EXPECT_EQ(LocalRank(placement, 5), std::make_pair(2, 3));
  EXPECT_EQ(LocalRank(placement, 4), std::make_pair(1, 2));
  EXPECT_EQ(LocalRank(placement, 3), std::make_pair(0, 1));
}

PoolNode Node(const std::string& id, int slots) {
  PoolNode n;
  n.id = id;
  n.inventory.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  n.inventory.set_slots(slots);
  return n;
}

TEST(DeviceBindingTest, AcceleratorsPerNodePlacesExactlyThatManyOnEachNode) {
  NodePool pool({Node("a", 8), Node("b", 8), Node("c", 2)});
  loom::v1::ResourceSpec r;
  r.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  r.set_num_ranks(8);
  r.set_accelerators_per_node(4);
  Eligibility e = ComputeEligibility(pool, r);
  EXPECT_EQ(e.member, (std::vector<char>{1, 1, 0}));  // c has 2 slots < 4
  EXPECT_NE(e.narrowed_by.find("accelerators_per_node 4 matches 2 of 3 nodes"), std::string::npos)
      << e.narrowed_by;
  // Without the key the 8 ranks would share a node with 8 free slots; with it, 4 + 4.
  std::vector<int> p = PlaceGang(pool, e, {8, 8, 2}, 8);
  EXPECT_EQ(p, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  // a has only 3 free: b alone cannot take 8 at 4 per node.
  EXPECT_TRUE(PlaceGang(pool, e, {3, 8, 2}, 8).empty());
  // 4 ranks: one node, the whole unit.
  EXPECT_EQ(PlaceGang(pool, e, {3, 8, 2}, 4), (std::vector<int>{1, 1, 1, 1}));
  r.set_accelerators_per_node(0);
  EXPECT_NE(EligibilityKey(r), [&] {
    loom::v1::ResourceSpec r4 = r;
    r4.set_accelerators_per_node(4);
    return EligibilityKey(r4);
  }());
}

TEST(DeviceBindingTest, AcceleratorsPerNodeRefusedNamingTheField) {
  loom::v1::ResourceSpec r;
  r.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  r.set_num_ranks(16);
  r.set_accelerators_per_node(16);
  const std::map<loom::v1::AcceleratorKind, int> none;
  absl::Status s = ValidateAcceleratorsPerNode(r, none);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "resources.accelerators_per_node: 16 h100 accelerators per node requested, but a "
            "h100 node has at most 8");
  r.set_accelerators_per_node(8);
  EXPECT_TRUE(ValidateAcceleratorsPerNode(r, none).ok());
  EXPECT_TRUE(ValidateAcceleratorsPerNode(r, {{loom::v1::ACCELERATOR_KIND_H100, 8}}).ok());
  s = ValidateAcceleratorsPerNode(r, {{loom::v1::ACCELERATOR_KIND_H100, 4},
                                      {loom::v1::ACCELERATOR_KIND_H200, 8}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "resources.accelerators_per_node: 8 h100 accelerators per node requested, but the "
            "largest registered h100 node has 4");
  r.set_accelerator(loom::v1::ACCELERATOR_KIND_GH200);
  r.set_num_ranks(2);
  r.set_accelerators_per_node(2);
  EXPECT_TRUE(ValidateAcceleratorsPerNode(r, none).ok());  // a quad GH200 node may register
  EXPECT_NE(ValidateAcceleratorsPerNode(r, {{loom::v1::ACCELERATOR_KIND_GH200, 1}})
                .message()
                .find("largest registered gh200 node has 1"),
            std::string::npos);
  r.set_accelerators_per_node(5);
  EXPECT_NE(ValidateAcceleratorsPerNode(r, none).message().find("gh200 node has at most 4"),
            std::string::npos);
  r.set_num_ranks(6);
  r.set_accelerators_per_node(4);
  EXPECT_EQ(ValidateAcceleratorsPerNode(r, none).message(),
            "resources.accelerators_per_node: resources.num_ranks 6 is not a multiple of 4");
  r.set_accelerators_per_node(-1);
  EXPECT_EQ(ValidateAcceleratorsPerNode(r, none).code(), absl::StatusCode::kInvalidArgument);
}

// Admission that tells at once (issue 49): 8 ranks on two 1-slot nodes used to be accepted and
// wait forever.
TEST(DeviceBindingTest, AGangMoreThanTheRegisteredNodesCouldHoldIsRefusedAtOnce) {
  using K = loom::v1::AcceleratorKind;
  loom::v1::ResourceSpec r;
  r.set_num_ranks(8);  // accelerator unspecified: cpu
  const NodesBySlots two_one_slot = {{{K::ACCELERATOR_KIND_CPU, 1}, 2}};
  EXPECT_EQ(MaxGangRanks(r, two_one_slot), 2);
  absl::Status s = CheckGangFitsRegisteredNodes(r, two_one_slot);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message().substr(0, 109),
            "resources.num_ranks: 8 cpu ranks can never be placed: the registered cpu nodes have "
            "2 slots (2 node(s)), so t");
  EXPECT_NE(s.message().find("wait_for_capacity"), absl::string_view::npos) << s.message();
  r.set_num_ranks(2);
  EXPECT_TRUE(CheckGangFitsRegisteredNodes(r, two_one_slot).ok());
  // No node registered at all (a cluster starting): the job waits, as before.
  r.set_num_ranks(64);
  EXPECT_TRUE(CheckGangFitsRegisteredNodes(r, {}).ok());
  // Lost nodes are not in the map; a count of 0 is no node.
  EXPECT_TRUE(CheckGangFitsRegisteredNodes(r, {{{K::ACCELERATOR_KIND_CPU, 4}, 0}}).ok());

  // Other kinds' slots do not count.
  r.set_accelerator(K::ACCELERATOR_KIND_H100);
  r.set_num_ranks(8);
  const NodesBySlots mixed = {{{K::ACCELERATOR_KIND_CPU, 16}, 3},
                              {{K::ACCELERATOR_KIND_H100, 8}, 1},
                              {{K::ACCELERATOR_KIND_H100, 2}, 1}};
  EXPECT_EQ(MaxGangRanks(r, mixed), 10);
  EXPECT_TRUE(CheckGangFitsRegisteredNodes(r, mixed).ok());
  r.set_num_ranks(12);
  EXPECT_EQ(CheckGangFitsRegisteredNodes(r, mixed).code(), absl::StatusCode::kFailedPrecondition);
  r.set_accelerator(K::ACCELERATOR_KIND_GH200);
  r.set_num_ranks(1);
  s = CheckGangFitsRegisteredNodes(r, mixed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no registered node has gh200 slots (5 node(s) of other kinds)"),
            absl::string_view::npos)
      << s.message();

  // accelerators_per_node k: k ranks on each node with at least k slots, once per gang.
  r.set_accelerator(K::ACCELERATOR_KIND_H100);
  r.set_accelerators_per_node(4);
  EXPECT_EQ(MaxGangRanks(r, mixed), 4);  // the 8-slot node holds one group of 4; 2 slots: none
  r.set_num_ranks(8);
  s = CheckGangFitsRegisteredNodes(r, mixed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("can hold 4 (4 per node with accelerators_per_node 4, 2 node(s), "
                             "10 slots)"),
            absl::string_view::npos)
      << s.message();
}

}  // namespace
}  // namespace loom
