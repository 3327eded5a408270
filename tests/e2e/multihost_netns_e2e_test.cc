// Across hosts, not only loopback (issue 16): the scheduler and loom-checkpoint in one network
// namespace, a loom-worker in each of two others, joined by veth pairs into a bridge on a
// private 10.213.<x>.0/24 the test picks (tests/e2e/testing/netns.h). Every daemon binds the
// address it is given and advertises the address it is given: the scheduler binds 0.0.0.0 and
// advertises its host's address; worker-1 binds 0.0.0.0 with --advertise_address; worker-2
// binds its host's address (advertised by default). A 2-rank job (tiny model, CPU, Gloo across
// the two worker namespaces) trains, checkpoints and is consolidated mid-run; then the link of
// the host running rank 0 (the TCPStore's host) goes down (`ip link set v<i> down` on the hub's
// bridge), a replacement worker registers from a fresh namespace, and the job resumes from its
// last committed checkpoint on the remaining worker and the replacement, and finishes.
//
// Needs root and `ip netns`: otherwise the test skips, saying why. Waits are conditions with
// deadlines. Self-check of the test: with --test_env=LOOM_NETNS_E2E_WORKER_ADVERTISE=127.0.0.1
// the workers advertise loopback (as every daemon did by default before) and the job cannot
// rendezvous across hosts, so the test fails.
#include <grpcpp/grpcpp.h>

#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "storage/safetensors/safetensors.h"
#include "tests/e2e/testing/e2e_cluster.h"
#include "tests/e2e/testing/netns.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using ::loom::e2e::NetnsNetwork;
using ::loom::testing::RunfilePath;

constexpr int kSteps = 200;
constexpr int kInterval = 20;

std::string JobYaml() {
  return absl::StrCat("name: multihost", e2e::kTinyModelYaml, R"(deepspeed_config:
  train_micro_batch_size_per_gpu: 4
  gradient_accumulation_steps: 1
  optimizer: {type: AdamW, params: {lr: 0.003}}
  zero_optimization: {stage: 3}
resources: {num_ranks: 2, accelerator: cpu}
training: {steps: )", kSteps, R"(, sequence_length: 32, seed: 5, eval_batches: 1}
checkpoint: {interval_steps: )", kInterval, R"(}
max_restarts: 2
max_infra_restarts: 2
)");
}

// The trainer's --flag=value in /proc/<pid>/cmdline ("" if absent).
std::string TrainerFlag(pid_t pid, const std::string& flag) {
  auto cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  if (!cmdline.ok()) return "";
  for (absl::string_view a : absl::StrSplit(*cmdline, '\0')) {
    if (absl::StartsWith(a, absl::StrCat("--", flag, "="))) {
      return std::string(a.substr(flag.size() + 3));
    }
  }
  return "";
}

class MultihostNetnsE2ETest : public e2e::E2EClusterTest {
 protected:
  void SetUp() override {
    E2EClusterTest::SetUp();
    if (absl::Status a = NetnsNetwork::Available(); !a.ok()) {
      GTEST_SKIP() << "multi-host test needs network namespaces: " << a.message();
    }
    NetnsNetwork::RemoveStale();
    auto net = NetnsNetwork::Create(tmp_);
    ASSERT_TRUE(net.ok()) << net.status();
    net_ = std::move(*net);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(net_->AddHost().ok());
    ckpt_root_ = absl::StrCat(tmp_, "/checkpoints");  // one directory every host sees
    ASSERT_TRUE(MakeDirs(ckpt_root_).ok());
    auto checkpoint = net_->StartDaemon(
        0, "checkpoint", "services/checkpoint/loom-checkpoint",
        {absl::StrCat("--checkpoint_root=", ckpt_root_), absl::StrCat("--host=", net_->address(0))},
        &checkpoint_info_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = std::move(*checkpoint);
    auto scheduler = net_->StartDaemon(
        0, "scheduler", "services/scheduler/loom-scheduler",
        {absl::StrCat("--db=", tmp_, "/loom.db"), absl::StrCat("--checkpoint_root=", ckpt_root_),
         absl::StrCat("--checkpoint_service=", checkpoint_info_.grpc_address), "--port=0",
         "--host=0.0.0.0", absl::StrCat("--advertise_address=", net_->address(0)),
         "--heartbeat_timeout_s=3"},
        &scheduler_info_);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(*scheduler);
    workers_.resize(4);
    ASSERT_TRUE(StartWorker(1, /*wildcard_bind=*/true).ok());
    ASSERT_TRUE(StartWorker(2, /*wildcard_bind=*/false).ok());
    auto channel =
        grpc::CreateChannel(scheduler_info_.grpc_address, grpc::InsecureChannelCredentials());
    jobs_ = loom::v1::JobService::NewStub(channel);
    checkpoints_ = loom::v1::CheckpointService::NewStub(
        grpc::CreateChannel(checkpoint_info_.grpc_address, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    // The daemons stop while their namespaces still exist; then every namespace goes. A rank cut
    // off from its gang would wait out its collective timeout after its worker's SIGTERM: kill it.
    for (const std::string& id : job_ids_) {
      for (const auto& [rank, pid] : e2e::TrainerPids(id)) ::kill(pid, SIGKILL);
    }
    for (auto& w : workers_) w.reset();
    scheduler_.reset();
    checkpoint_.reset();
    net_.reset();
  }

  // loom-worker "worker-<host>" in host `host`: bound to 0.0.0.0 and advertising its address,
  // or bound to its address (then advertised by default).
  absl::Status StartWorker(int host, bool wildcard_bind) {
    std::vector<std::string> args = {
        absl::StrCat("--scheduler=", scheduler_info_.grpc_address),
        absl::StrCat("--node_id=worker-", host), "--slots=1",
        absl::StrCat("--trainer=", RunfilePath("worker/trainer/loom-trainer")),
        absl::StrCat("--work_dir=", tmp_, "/work-", host), "--heartbeat_interval=200ms",
        absl::StrCat("--checkpoint_root=", ckpt_root_),
        "--data_roots=/usr/share/games/fortunes"};
    std::string advertise = net_->address(host);
    if (const char* o = std::getenv("LOOM_NETNS_E2E_WORKER_ADVERTISE"); o != nullptr && *o) {
      advertise = o;  // the test's self-check (see the file comment)
      wildcard_bind = true;
    }
    if (wildcard_bind) {
      args.push_back("--host=0.0.0.0");
      args.push_back(absl::StrCat("--advertise_address=", advertise));
    } else {
      args.push_back(absl::StrCat("--host=", net_->address(host)));
    }
    ReadyInfo info;
    auto w = net_->StartDaemon(host, absl::StrCat("worker-", host), "services/worker/loom-worker",
                               std::move(args), &info);
    if (!w.ok()) return w.status();
    workers_[host] = std::move(*w);
    return absl::OkStatus();
  }

  // The host index of node "worker-<i>".
  static int HostOf(const std::string& node) { return node.back() - '0'; }

  std::string WorkerLogs() const {
    std::string out;
    for (size_t i = 1; i < workers_.size(); ++i) {
      if (workers_[i] != nullptr) {
        absl::StrAppend(&out, "worker-", i, " log:\n", testing::Tail(workers_[i]->log_path()),
                        "\n");
      }
    }
    return out;
  }

  void ExpectConsolidates(const std::string& job_id, int64_t min_step) {
    loom::v1::ConsolidateCheckpointRequest req;
    req.set_job_id(job_id);
    loom::v1::ConsolidateCheckpointResponse resp;
    grpc::Status s = checkpoints_->ConsolidateCheckpoint(Ctx().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_GE(resp.step(), min_step);
    auto file = safetensors::Reader::Open(resp.safetensors_path());
    ASSERT_TRUE(file.ok()) << file.status();
    const auto* embed = (*file)->Find("model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr);
    EXPECT_EQ(embed->shape, (std::vector<int64_t>{256, 48}));
  }

  std::unique_ptr<NetnsNetwork> net_;
  std::vector<std::string> job_ids_;  // killed in TearDown
};

TEST_F(MultihostNetnsE2ETest, TrainsAcrossHostsAndRecoversWhenALinkGoesDown) {
  // The scheduler bound 0.0.0.0 and advertises its host's address.
  ASSERT_TRUE(absl::StartsWith(scheduler_info_.grpc_address, net_->address(0) + ":"))
      << scheduler_info_.grpc_address;
  loom::v1::Job job = Submit(JobYaml());
  ASSERT_FALSE(job.id().empty());
  job_ids_.push_back(job.id());
  job = WaitUntil(
      job.id(),
      [](const loom::v1::Job& j) {
        return j.phase() == loom::v1::JOB_PHASE_RUNNING &&
               j.progress().last_checkpoint_step() >= kInterval;
      },
      absl::Minutes(4), "a committed checkpoint");
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_RUNNING) << WorkerLogs();
  ASSERT_EQ(job.rank_nodes_size(), 2);
  const int rank0_host = HostOf(job.rank_nodes(0));
  const int rank1_host = HostOf(job.rank_nodes(1));
  ASSERT_NE(rank0_host, rank1_host) << "the gang must span the two worker hosts";
  // Each rank's rendezvous: rank 0's node's advertised address; its Gloo bind: its own node's.
  std::map<int, pid_t> trainers = e2e::TrainerPids(job.id());
  ASSERT_EQ(trainers.size(), 2u);
  for (const auto& [rank, pid] : trainers) {
    EXPECT_EQ(TrainerFlag(pid, "master_addr"), net_->address(rank0_host)) << "rank " << rank;
    EXPECT_EQ(TrainerFlag(pid, "bind_address"),
              net_->address(rank == 0 ? rank0_host : rank1_host))
        << "rank " << rank;
  }
  // A committed checkpoint consolidates while the job runs.
  ExpectConsolidates(job.id(), kInterval);

  job = Get(job.id());
  ASSERT_LT(job.progress().step(), kSteps) << "the job ended before the link went down";
  const int64_t committed = job.progress().last_checkpoint_step();
  const int64_t step_at_down = job.progress().step();
  const int32_t attempt = job.attempt();
  // The link of rank 0's host (the TCPStore's) goes down; a replacement registers from a fresh
  // namespace.
  ASSERT_TRUE(net_->LinkDown(rank0_host).ok());
  const absl::Time down_at = absl::Now();
  auto replacement = net_->AddHost();
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  ASSERT_EQ(*replacement, 3);
  ASSERT_TRUE(StartWorker(3, /*wildcard_bind=*/false).ok());

  job = WaitFor(job.id(), loom::v1::JOB_PHASE_SUCCEEDED, absl::Minutes(5));
  ASSERT_EQ(job.phase(), loom::v1::JOB_PHASE_SUCCEEDED) << job.message() << "\n" << WorkerLogs();
  std::cout << "link of host " << rank0_host << " down at step " << step_at_down
            << " (committed " << committed << "); job SUCCEEDED "
            << absl::ToDoubleSeconds(absl::Now() - down_at) << " s later, attempt "
            << job.attempt() << "\n";
  EXPECT_GT(job.attempt(), attempt);
  EXPECT_EQ(job.progress().step(), kSteps);
  EXPECT_GE(job.infra_restarts(), 1);
  ASSERT_EQ(job.rank_nodes_size(), 2);
  for (const std::string& node : job.rank_nodes()) {
    EXPECT_NE(HostOf(node), rank0_host) << "a rank ran on the host that was cut off";
  }
  // The last attempt resumed from a committed checkpoint at or after the one committed before
  // the link went down, not from step 0.
  int64_t start_step = -1;
  for (int host : {1, 2, 3}) {
    auto log = ReadFile(absl::StrCat(tmp_, "/work-", host, "/", job.id(), "/attempt_",
                                     job.attempt(), "/rank_0.log"));
    std::smatch m;
    static const std::regex kStart("start step ([0-9]+)");
    if (log.ok() && std::regex_search(*log, m, kStart)) start_step = std::stoll(m[1].str());
  }
  EXPECT_GE(start_step, committed) << "the resumed attempt's rank 0 log has no start step";
  EXPECT_EQ(start_step % kInterval, 0);
  // The final checkpoint consolidates.
  ExpectConsolidates(job.id(), kSteps);
}

}  // namespace
}  // namespace loom
