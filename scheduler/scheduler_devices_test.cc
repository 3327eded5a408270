// Device binding through the Scheduler facade (docs/scheduling.md "Device binding"): nodes that
// register devices get each rank bound to its own device; no two live ranks of any job share
// one; devices come back at job end and on preemption/failure and are reused; a restarted
// scheduler hands out the same devices; a request for more accelerators per node than any
// registered node has is refused at submission naming the field.
#include <set>

#include "gtest/gtest.h"
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

using loom::v1::RankAssignment;

// The start assignments of a heartbeat reply, as a value (a range-for over a temporary reply's
// start() would dangle).
std::vector<RankAssignment> Starts(const loom::v1::HeartbeatResponse& resp) {
  return {resp.start().begin(), resp.start().end()};
}

class SchedulerDevicesTest : public SchedulerTest {
 protected:
  void RegisterGpuNode(const std::string& node, int devices) {
    loom::v1::NodeInventory inv;
    inv.set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
    inv.set_slots(devices);
    inv.set_hostname(node);
    inv.set_address(absl::StrCat("addr-", node));
    inv.set_accelerator_memory_bytes(81559LL << 20);
    for (int i = 0; i < devices; ++i) {
      loom::v1::AcceleratorDevice* d = inv.add_devices();
      d->set_index(i);
      d->set_uuid(absl::StrCat("GPU-", node, "-", i));
      d->set_name("NVIDIA H100 80GB HBM3");
      d->set_memory_bytes(81559LL << 20);
    }
    ASSERT_TRUE(scheduler_->RegisterWorker(node, inv).ok());
  }

  absl::StatusOr<Job> SubmitGpu(int ranks, int per_node = 0) {
    loom::v1::JobSpec spec = TestJobSpecWithRanks(ranks);
    spec.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
    spec.mutable_resources()->set_accelerators_per_node(per_node);
    spec.set_max_restarts(0);
    spec.set_max_infra_restarts(0);
    return scheduler_->SubmitJob(spec);
  }

  // Drives `job` to RUNNING on `node` (all ranks there) and returns its start assignments.
  std::map<int, RankAssignment> StartAll(const std::string& node, const Job& submitted) {
    const Job job = Get(submitted.id());  // placed: its attempt
    std::map<int, RankAssignment> out;
    for (const RankAssignment& a : Starts(Beat(node))) {
      if (a.job_id() == job.id()) out[a.rank()] = a;
    }
    std::vector<RankStatus> st = {Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500)};
    Beat(node, st);
    for (const RankAssignment& a : Starts(Beat(node, st))) {
      if (a.job_id() == job.id()) out[a.rank()] = a;
    }
    return out;
  }
};

std::set<int> Devices(const std::map<int, RankAssignment>& assignments) {
  std::set<int> d;
  for (const auto& [rank, a] : assignments) {
    EXPECT_EQ(a.device_indices_size(), 1) << "rank " << rank;
    if (a.device_indices_size() == 1) d.insert(a.device_indices(0));
  }
  return d;
}

TEST_F(SchedulerDevicesTest, RanksOfEveryJobGetTheirOwnDevicesWhichAreFreedAndReused) {
  RegisterGpuNode("gpu-a", 8);
  absl::StatusOr<Job> a = SubmitGpu(3), b = SubmitGpu(4);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  Cycle();
  std::map<int, RankAssignment> sa;
  std::map<int, RankAssignment> sb;
  // Rank 0s first (the rest wait for their port), then every rank.
  for (const RankAssignment& x : Starts(Beat("gpu-a"))) (x.job_id() == a->id() ? sa : sb)[x.rank()] = x;
  std::vector<RankStatus> zeros = {Rank(Get(a->id()), 0, loom::v1::RANK_STATE_RUNNING, 29500),
                                   Rank(Get(b->id()), 0, loom::v1::RANK_STATE_RUNNING, 29501)};
  Beat("gpu-a", zeros);
  for (const RankAssignment& x : Starts(Beat("gpu-a", zeros))) {
    (x.job_id() == a->id() ? sa : sb)[x.rank()] = x;
  }
  ASSERT_EQ(sa.size(), 3u);
  ASSERT_EQ(sb.size(), 4u);
  EXPECT_EQ(Devices(sa), (std::set<int>{0, 1, 2}));
  EXPECT_EQ(Devices(sb), (std::set<int>{3, 4, 5, 6}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sa[r].device_indices(0), r);  // in rank order
    EXPECT_EQ(sa[r].local_rank(), r);
    EXPECT_EQ(sa[r].local_world_size(), 3);
  }
  EXPECT_EQ(sb[3].local_rank(), 3);
  EXPECT_EQ(sb[3].local_world_size(), 4);

  // A ends: its 3 devices are free; the next job gets exactly those (the lowest), not B's.
  Job ja = Get(a->id());
  std::vector<RankStatus> done;
  for (int r = 0; r < 3; ++r) done.push_back(Rank(ja, r, loom::v1::RANK_STATE_SUCCEEDED));
  Job jb = Get(b->id());
  for (int r = 0; r < 4; ++r) done.push_back(Rank(jb, r, loom::v1::RANK_STATE_RUNNING, r == 0 ? 29501 : 0));
  Beat("gpu-a", done);
  EXPECT_EQ(Get(a->id()).phase(), loom::v1::JOB_PHASE_SUCCEEDED);
  absl::StatusOr<Job> c = SubmitGpu(4);
  ASSERT_TRUE(c.ok());
  Cycle();
  std::map<int, RankAssignment> sc;
  std::vector<RankStatus> b_running;
  for (int r = 0; r < 4; ++r) b_running.push_back(Rank(jb, r, loom::v1::RANK_STATE_RUNNING, r == 0 ? 29501 : 0));
  for (const RankAssignment& x : Starts(Beat("gpu-a", b_running))) {
    if (x.job_id() == c->id()) sc[x.rank()] = x;
  }
  ASSERT_EQ(sc.size(), 1u);  // rank 0 until its port is known
  EXPECT_EQ(sc[0].device_indices(0), 0);

  // The scheduler restarts: C's ranks keep the devices it bound (persisted), and B's too.
  scheduler_.reset();
  Start();
  RegisterGpuNode("gpu-a", 8);
  std::vector<RankStatus> running;
  for (int r = 0; r < 4; ++r) running.push_back(Rank(jb, r, loom::v1::RANK_STATE_RUNNING, r == 0 ? 29501 : 0));
  Job jc = Get(c->id());
  running.push_back(Rank(jc, 0, loom::v1::RANK_STATE_RUNNING, 29502));
  Beat("gpu-a", running);
  std::map<int, RankAssignment> sc2;
  for (const RankAssignment& x : Starts(Beat("gpu-a", running))) {
    if (x.job_id() == c->id()) sc2[x.rank()] = x;
  }
  ASSERT_EQ(sc2.size(), 3u);  // ranks 1-3 now that rank 0's port is known
  std::map<int, RankAssignment> all_c = sc2;
  all_c[0] = sc[0];
  EXPECT_EQ(Devices(all_c), (std::set<int>{0, 1, 2, 7}));  // around B's 3-6
  EXPECT_EQ(Get(b->id()).phase(), loom::v1::JOB_PHASE_RUNNING);
}

TEST_F(SchedulerDevicesTest, AFailedJobsDevicesAreFreed) {
  RegisterGpuNode("gpu-a", 2);
  absl::StatusOr<Job> a = SubmitGpu(2);
  ASSERT_TRUE(a.ok());
  Cycle();
  std::map<int, RankAssignment> sa = StartAll("gpu-a", *a);
  EXPECT_EQ(Devices(sa), (std::set<int>{0, 1}));
  absl::StatusOr<Job> b = SubmitGpu(2);
  ASSERT_TRUE(b.ok());
  Cycle();
  EXPECT_EQ(Get(b->id()).phase(), loom::v1::JOB_PHASE_PENDING);  // every device is held
  Job ja = Get(a->id());
  Beat("gpu-a", {Rank(ja, 0, loom::v1::RANK_STATE_FAILED), Rank(ja, 1, loom::v1::RANK_STATE_FAILED)});
  EXPECT_EQ(Get(a->id()).phase(), loom::v1::JOB_PHASE_FAILED);
  Cycle();
  std::map<int, RankAssignment> sb = StartAll("gpu-a", *b);
  EXPECT_EQ(Devices(sb), (std::set<int>{0, 1}));
}

TEST_F(SchedulerDevicesTest, MoreAcceleratorsPerNodeThanAnyNodeIsRefusedAtSubmission) {
  RegisterGpuNode("gpu-a", 4);
  RegisterGpuNode("gpu-b", 4);
  absl::StatusOr<Job> too_many = SubmitGpu(8, 8);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(too_many.status().message(),
            "resources.accelerators_per_node: 8 h100 accelerators per node requested, but the "
            "largest registered h100 node has 4");
  EXPECT_EQ(SubmitGpu(16, 16).status().code(), absl::StatusCode::kInvalidArgument);
  // 4 per node fits: both nodes, ranks 0-3 on one and 4-7 on the other, local ranks 0-3 each.
  absl::StatusOr<Job> fits = SubmitGpu(8, 4);
  ASSERT_TRUE(fits.ok()) << fits.status();
  Cycle();
  Job job = Get(fits->id());
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_STARTING);
}

// Admission that tells at once (issue 49): through the gRPC API (wait_for_capacity false) a gang
// more than the registered nodes could hold is refused; asked to wait for capacity, it queues.
TEST_F(SchedulerDevicesTest, AGangLargerThanTheClusterIsRefusedUnlessItWaitsForCapacity) {
  RegisterGpuNode("gpu-a", 4);
  RegisterGpuNode("gpu-b", 4);
  loom::v1::JobSpec spec = TestJobSpecWithRanks(12);
  spec.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  absl::StatusOr<Job> refused = SubmitWaitingForAnswer(spec, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "resources.num_ranks: 12 h100 ranks can never be placed: the registered h100 "
                "nodes have 8 slots (2 node(s))"),
            absl::string_view::npos)
      << refused.status();
  EXPECT_EQ(scheduler_->DryRunSubmission(spec, "default", false).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<Job>> jobs = scheduler_->ListJobs(loom::v1::JOB_PHASE_UNSPECIFIED);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());

  absl::StatusOr<Job> queued = SubmitWaitingForAnswer(spec, true);
  ASSERT_TRUE(queued.ok()) << queued.status();
  Cycle();
  EXPECT_EQ(Get(queued->id()).phase(), loom::v1::JOB_PHASE_PENDING);
  // A third node registers: the queued job's capacity came.
  RegisterGpuNode("gpu-c", 4);
  Cycle();
  EXPECT_EQ(Get(queued->id()).phase(), loom::v1::JOB_PHASE_STARTING);

  spec.mutable_resources()->set_num_ranks(4);  // fits the registered nodes: admitted
  absl::StatusOr<Job> fits = SubmitWaitingForAnswer(spec, false);
  EXPECT_TRUE(fits.ok()) << fits.status();
}

}  // namespace
}  // namespace loom
