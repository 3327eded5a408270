// Accelerator binding end to end on one node (issue 16's acceptance; docs/scheduling.md "Device
// binding"): a real loom-scheduler and a real loom-worker started with the recorded nvidia-smi
// output of an 8x H100 80GB HBM3 node (--gpu_inventory_file) run two jobs at once (3 ranks, and
// 4 ranks with accelerators_per_node 4) whose rank processes are real processes
// (worker/testdata/env_trainer.sh) that record their environment. Every rank's environment is
// checked against values this test derives on its own: torchrun's variables, exactly one device
// in CUDA_VISIBLE_DEVICES, no device shared by two ranks, none of the worker's own
// CUDA_VISIBLE_DEVICES inherited, NCCL's interface settings from the worker's flags. A request
// for more accelerators per node than the node has is refused at submission naming the field.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/daemon.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tiny_job.h"

namespace loom {
namespace {

// Polls `done` every 50 ms until it holds; false after `timeout`.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  absl::Mutex mu;
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::MutexLock l(&mu);
    mu.AwaitWithTimeout(absl::Condition(+[](void*) { return false; }, nullptr),
                        absl::Milliseconds(50));
  }
  return true;
}

std::map<std::string, std::string> ReadEnv(const std::string& path) {
  std::map<std::string, std::string> env;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] += line.substr(eq + 1);
  }
  return env;
}

// tests/testing/tiny_job.h's job, on H100s, for one step without a checkpoint (the ranks are
// env_trainer.sh: they record their environment, they do not train).
loom::v1::JobSpec GpuJob(int ranks, int per_node) {
  loom::v1::JobSpec spec;
  EXPECT_TRUE(
      google::protobuf::util::JsonStringToMessage(testing::TinyJobSpecJson("gpu-env", ranks), &spec)
          .ok());
  spec.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_H100);
  spec.mutable_resources()->set_accelerators_per_node(per_node);
  spec.mutable_training()->set_steps(1);
  spec.clear_checkpoint();
  return spec;
}

class DeviceBindingProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = absl::StrCat(::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(::system(absl::StrCat("mkdir -p ", tmp_, "/ckpt ", tmp_, "/work").c_str()), 0);
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> scheduler = testing::StartDaemon(
        tmp_, "scheduler", "services/scheduler/loom-scheduler",
        {absl::StrCat("--db=", tmp_, "/loom.db"), absl::StrCat("--checkpoint_root=", tmp_, "/ckpt"),
         "--port=0", "--schedule_interval_ms=50"},
        &scheduler_info_);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(*scheduler);
    // The worker's own environment names every device: a rank must not inherit it.
    ::setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7", 1);
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> worker = testing::StartDaemon(
        tmp_, "worker", "services/worker/loom-worker",
        {absl::StrCat("--scheduler=", scheduler_info_.grpc_address), "--node_id=gpu-node",
         absl::StrCat("--gpu_inventory_file=",
                      testing::RunfilePath("worker/testdata/nvidia_smi_8x_h100_80gb_hbm3.csv")),
         absl::StrCat("--trainer=", testing::RunfilePath("worker/testdata/env_trainer.sh")),
         absl::StrCat("--work_dir=", tmp_, "/work"), "--heartbeat_interval=50ms",
         "--confine_paths=false", "--nccl_socket_ifname=eth0", "--nccl_ib_hca=mlx5_0,mlx5_1"},
        &worker_info_);
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
    jobs_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel(scheduler_info_.grpc_address, grpc::InsecureChannelCredentials()));
  }

  grpc::Status Submit(const loom::v1::JobSpec& spec, loom::v1::Job* job) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ctx.set_wait_for_ready(true);
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    loom::v1::SubmitJobResponse resp;
    grpc::Status s = jobs_->SubmitJob(&ctx, req, &resp);
    *job = resp.job();
    return s;
  }

  loom::v1::Job Get(const std::string& id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    loom::v1::GetJobRequest req;
    req.set_job_id(id);
    loom::v1::Job job;
    EXPECT_TRUE(jobs_->GetJob(&ctx, req, &job).ok());
    return job;
  }

  std::string EnvPath(const loom::v1::Job& job, int rank) const {
    return absl::StrCat(tmp_, "/work/", job.id(), "/attempt_1/env_rank_", rank, ".txt");
  }

  std::string Logs() const {
    return absl::StrCat("scheduler:\n", testing::Tail(scheduler_->log_path()), "\nworker:\n",
                        testing::Tail(worker_->log_path()));
  }

  std::string tmp_;
  ReadyInfo scheduler_info_, worker_info_;
  std::unique_ptr<testing::Subprocess> scheduler_, worker_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
};

TEST_F(DeviceBindingProcessTest, EveryRankSeesOnlyItsOwnDeviceAndTorchrunsVariables) {
  loom::v1::Job a, b;
  ASSERT_TRUE(Submit(GpuJob(3, 0), &a).ok());
  ASSERT_TRUE(Submit(GpuJob(4, 4), &b).ok());
  const std::vector<std::pair<loom::v1::Job, int>> jobs = {{a, 3}, {b, 4}};
  // Every rank of both jobs runs at once (the trainers wait for the release file).
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& [job, n] : jobs) {
          for (int r = 0; r < n; ++r) {
            if (::access(EnvPath(job, r).c_str(), R_OK) != 0) return false;
          }
        }
        return true;
      },
      absl::Seconds(60)))
      << Logs();

  std::map<int, std::string> device_owner;  // device index -> "job/rank"
  for (const auto& [job, n] : jobs) {
    // MASTER_PORT of ranks 1.. is the port rank 0 reported, which the scheduler shows.
    const loom::v1::Job now = Get(job.id());
    for (int r = 0; r < n; ++r) {
      std::map<std::string, std::string> env = ReadEnv(EnvPath(job, r));
      SCOPED_TRACE(absl::StrCat(job.id(), " rank ", r));
      EXPECT_EQ(env["RANK"], absl::StrCat(r));
      EXPECT_EQ(env["WORLD_SIZE"], absl::StrCat(n));
      // One node: every rank is local; local rank = rank.
      EXPECT_EQ(env["LOCAL_RANK"], absl::StrCat(r));
      EXPECT_EQ(env["LOCAL_WORLD_SIZE"], absl::StrCat(n));
      EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
      int port = -1;
      ASSERT_TRUE(absl::SimpleAtoi(env["MASTER_PORT"], &port)) << env["MASTER_PORT"];
      if (r == 0) {
        EXPECT_EQ(port, 0);  // rank 0 binds the rendezvous port itself and reports it
      } else {
        EXPECT_GE(port, 29500);
        EXPECT_LE(port, 29755);
      }
      EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth0");
      EXPECT_EQ(env["NCCL_IB_HCA"], "mlx5_0,mlx5_1");
      // Exactly one device, a device of the node, not the worker's "0,1,...,7".
      const std::string& visible = env["CUDA_VISIBLE_DEVICES"];
      int device = -1;
      ASSERT_TRUE(absl::SimpleAtoi(visible, &device)) << "CUDA_VISIBLE_DEVICES=" << visible;
      EXPECT_GE(device, 0);
      EXPECT_LT(device, 8);
      EXPECT_EQ(env["LOOM_ACCELERATOR_INDEX"], visible);
      auto [it, fresh] = device_owner.emplace(device, absl::StrCat(job.id(), "/", r));
      EXPECT_TRUE(fresh) << "device " << device << " also bound to " << it->second;
    }
    (void)now;
  }
  EXPECT_EQ(device_owner.size(), 7u);
  // No rank's environment names another rank's device anywhere.
  for (const auto& [job, n] : jobs) {
    for (int r = 0; r < n; ++r) {
      std::map<std::string, std::string> env = ReadEnv(EnvPath(job, r));
      const std::string mine = env["CUDA_VISIBLE_DEVICES"];
      for (const auto& [key, value] : env) {
        if (key.find("CUDA") == std::string::npos && key.find("GPU") == std::string::npos &&
            key.find("NVIDIA") == std::string::npos) {
          continue;
        }
        for (absl::string_view d : absl::StrSplit(value, ',')) {
          EXPECT_EQ(d, mine) << job.id() << " rank " << r << ": " << key << "=" << value;
        }
      }
    }
  }

  // Release the trainers: both jobs succeed, and their devices are free for the next job.
  std::ofstream(tmp_ + "/work/release") << "go\n";
  for (const auto& [job, n] : jobs) {
    ASSERT_TRUE(Eventually([&] { return Get(job.id()).phase() == loom::v1::JOB_PHASE_SUCCEEDED; },
                           absl::Seconds(60)))
        << Get(job.id()).DebugString() << Logs();
  }
  loom::v1::Job c;
  ASSERT_TRUE(Submit(GpuJob(8, 8), &c).ok());
  ASSERT_TRUE(Eventually([&] { return Get(c.id()).phase() == loom::v1::JOB_PHASE_SUCCEEDED; },
                         absl::Seconds(60)))
      << Get(c.id()).DebugString() << Logs();
  std::set<std::string> all;
  for (int r = 0; r < 8; ++r) all.insert(ReadEnv(EnvPath(c, r))["CUDA_VISIBLE_DEVICES"]);
  EXPECT_EQ(all, (std::set<std::string>{"0", "1", "2", "3", "4", "5", "6", "7"}));
}

TEST_F(DeviceBindingProcessTest, MoreAcceleratorsPerNodeThanAnyNodeHasIsRefused) {
  // Beyond what any h100 node can have.
  loom::v1::Job job;
  grpc::Status s = Submit(GpuJob(16, 16), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "resources.accelerators_per_node: 16 h100 accelerators per node requested, but a "
            "h100 node has at most 8");
  // Beyond the largest registered node of the kind: a GH200 node (one superchip, recorded
  // nvidia-smi output) registers; 2 GH200s per node are refused once it has.
  ReadyInfo gh200_info;
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> gh200 = testing::StartDaemon(
      tmp_, "gh200-worker", "services/worker/loom-worker",
      {absl::StrCat("--scheduler=", scheduler_info_.grpc_address), "--node_id=gh200-node",
       absl::StrCat("--gpu_inventory_file=",
                    testing::RunfilePath("worker/testdata/nvidia_smi_1x_gh200.csv")),
       absl::StrCat("--trainer=", testing::RunfilePath("worker/testdata/env_trainer.sh")),
       absl::StrCat("--work_dir=", tmp_, "/work-gh200"), "--heartbeat_interval=50ms",
       "--confine_paths=false"},
      &gh200_info);
  ASSERT_TRUE(gh200.ok()) << gh200.status();
  loom::v1::JobSpec two = GpuJob(2, 2);
  two.mutable_resources()->set_accelerator(loom::v1::ACCELERATOR_KIND_GH200);
  // Before the node registered the job could wait for a larger one; poll until it has.
  ASSERT_TRUE(Eventually(
      [&] {
        s = Submit(two, &job);
        return s.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
      },
      absl::Seconds(30)))
      << Logs();
  EXPECT_EQ(s.error_message(),
            "resources.accelerators_per_node: 2 gh200 accelerators per node requested, but the "
            "largest registered gh200 node has 1");
}

}  // namespace
}  // namespace loom
