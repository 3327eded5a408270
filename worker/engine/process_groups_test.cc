// ProcessGroups: DeepSpeed's sequence/data-parallel layout checked against the layout written
// out by hand, real collectives over the groups (ranks as threads over Gloo), the divide
// factors, and that P = 1 creates no process group.
#include "worker/engine/process_groups.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "worker/engine/collectives.h"
#include "worker/engine/testing/thread_gang.h"

namespace loom::engine {
namespace {

using testing::FirstFailure;
using testing::RunGang;

TEST(ProcessGroupsLayoutTest, ConsecutiveRanksFormASequenceParallelGroup) {
  // World 8, P = 4: sp groups {0..3}, {4..7}; dp groups {0,4}, {1,5}, {2,6}, {3,7}.
  EXPECT_EQ(ProcessGroups::SequenceParallelRanks(6, 8, 4), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(ProcessGroups::SequenceParallelRanks(3, 8, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ProcessGroups::DataParallelRanks(6, 8, 4), (std::vector<int>{2, 6}));
  EXPECT_EQ(ProcessGroups::DataParallelRanks(1, 8, 4), (std::vector<int>{1, 5}));
  // P = 1: sp is the rank alone, dp the world.
  EXPECT_EQ(ProcessGroups::SequenceParallelRanks(2, 3, 1), (std::vector<int>{2}));
  EXPECT_EQ(ProcessGroups::DataParallelRanks(2, 3, 1), (std::vector<int>{0, 1, 2}));
}

TEST(ProcessGroupsTest, SequenceParallelSizeMustDivideTheWorldSize) {
  std::unique_ptr<Collectives> local = CreateLocalCollectives();
  for (int p : {0, -1, 2}) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> g = ProcessGroups::Create(*local, p);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << p;
    EXPECT_NE(g.status().message().find("sequence_parallel_size"), absl::string_view::npos)
        << g.status();
  }
  std::vector<absl::Status> st = RunGang(3, [](int, Collectives& world) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> g = ProcessGroups::Create(world, 2);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(world.collective_count(), 0) << "refused before any collective";
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

TEST(ProcessGroupsTest, OneSequenceParallelRankCreatesNoProcessGroup) {
  std::vector<absl::Status> st = RunGang(2, [](int rank, Collectives& world) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> g = ProcessGroups::Create(world, 1);
    if (!g.ok()) return g.status();
    const ProcessGroups& pg = **g;
    EXPECT_EQ(pg.created_process_groups(), 0);
    EXPECT_EQ(world.collective_count(), 0) << "not even a NewSubgroup call";
    EXPECT_EQ(pg.data_parallel().collectives, &world);
    EXPECT_EQ(pg.zero_partition().collectives, &world);
    EXPECT_EQ(pg.sequence_parallel().collectives->world_size(), 1);
    EXPECT_EQ(pg.sequence_parallel().ranks, (std::vector<int>{rank}));
    // Today's ZeRO divide: the world size.
    EXPECT_EQ(pg.world().grad_divide_factor, 2.0);
    EXPECT_EQ(pg.zero_partition().grad_divide_factor, 2.0);
    EXPECT_EQ(pg.data_parallel().grad_divide_factor, 2.0);
    EXPECT_EQ(pg.sequence_parallel().grad_divide_factor, 1.0);
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

// World 4, P = 2: sp groups {0,1}, {2,3}; dp groups {0,2}, {1,3}; partition = world. A sum of
// 2^rank over each group tells exactly which ranks it contains.
TEST(ProcessGroupsTest, FourRanksTwoWaySequenceParallel) {
  std::vector<absl::Status> st = RunGang(4, [](int rank, Collectives& world) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> g = ProcessGroups::Create(world, 2);
    if (!g.ok()) return g.status();
    const ProcessGroups& pg = **g;
    EXPECT_EQ(pg.created_process_groups(), 2);
    EXPECT_EQ(pg.sequence_parallel_size(), 2);
    EXPECT_EQ(pg.data_parallel_size(), 2);
    auto mask_sum = [&](const ProcessGroup& group) {
      at::Tensor t = at::full({1}, static_cast<double>(1 << rank), at::kDouble);
      absl::Status s = group.collectives->AllReduce(t, ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << group.name << ": " << s;
      return static_cast<int>(t.item<double>());
    };
    const int sp_want = rank < 2 ? 0b0011 : 0b1100;
    const int dp_want = rank % 2 == 0 ? 0b0101 : 0b1010;
    EXPECT_EQ(mask_sum(pg.sequence_parallel()), sp_want) << "rank " << rank;
    EXPECT_EQ(mask_sum(pg.data_parallel()), dp_want) << "rank " << rank;
    EXPECT_EQ(mask_sum(pg.zero_partition()), 0b1111);
    EXPECT_EQ(pg.sequence_parallel().rank(), rank % 2);
    EXPECT_EQ(pg.data_parallel().rank(), rank / 2);
    EXPECT_EQ(pg.sequence_parallel().ranks,
              (rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    EXPECT_EQ(pg.zero_partition().grad_divide_factor, 4.0);  // dp x sp
    EXPECT_EQ(pg.data_parallel().grad_divide_factor, 2.0);
    EXPECT_EQ(pg.sequence_parallel().grad_divide_factor, 2.0);
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

// The trainer's convention (loss_r * n_r / N, sequence_parallel.h): the group's local gradients
// sum to the sample's, so the sequence factor is 1 and ZeRO divides by D only (DeepSpeed #5248).
TEST(ProcessGroupsTest, ShareOfSampleLossDividesByTheDataParallelSizeOnly) {
  std::vector<absl::Status> st = RunGang(4, [](int, Collectives& world) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> g =
        ProcessGroups::Create(world, 2, SequenceLoss::kShareOfSample);
    if (!g.ok()) return g.status();
    EXPECT_EQ((*g)->zero_partition().grad_divide_factor, 2.0);  // D, not D x P
    EXPECT_EQ((*g)->sequence_parallel().grad_divide_factor, 1.0);
    EXPECT_EQ((*g)->data_parallel().grad_divide_factor, 2.0);
    EXPECT_EQ((*g)->world().grad_divide_factor, 4.0);
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
  // P = 1 (a data-parallel job): either convention divides by the world size.
  st = RunGang(2, [](int, Collectives& world) {
    for (SequenceLoss loss : {SequenceLoss::kMeanPerShard, SequenceLoss::kShareOfSample}) {
      absl::StatusOr<std::unique_ptr<ProcessGroups>> g = ProcessGroups::Create(world, 1, loss);
      if (!g.ok()) return g.status();
      EXPECT_EQ((*g)->zero_partition().grad_divide_factor, 2.0);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

TEST(ProcessGroupsTest, SequenceParallelOverTheWholeWorldReusesIt) {
  std::vector<absl::Status> st = RunGang(3, [](int, Collectives& world) {
    absl::StatusOr<std::unique_ptr<ProcessGroups>> g = ProcessGroups::Create(world, 3);
    if (!g.ok()) return g.status();
    EXPECT_EQ((*g)->created_process_groups(), 0);
    EXPECT_EQ((*g)->sequence_parallel().collectives, &world);
    EXPECT_EQ((*g)->data_parallel().collectives->world_size(), 1);
    return absl::OkStatus();
  });
  EXPECT_TRUE(FirstFailure(st).ok()) << FirstFailure(st);
}

}  // namespace
}  // namespace loom::engine
