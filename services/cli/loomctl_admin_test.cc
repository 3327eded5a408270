// `loomctl nodes|cordon|uncordon|drain|queues` against a real in-process SchedulerServer.
#include <gtest/gtest.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "proto/worker_service.grpc.pb.h"
#include "services/scheduler/scheduler_server.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

struct CliRun {
  int code;
  std::string output;
};

CliRun Loomctl(const std::string& address, const std::vector<std::string>& args) {
  static int n = 0;
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_admin_", n++, ".log");
  std::vector<std::string> argv = {testing::RunfilePath("services/cli/loomctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--scheduler=" + address);
  auto p = testing::Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, ""};
  int status = p->Wait(absl::Seconds(30));
  return {testing::ExitCode(status), *ReadFile(log)};
}

TEST(LoomctlAdminTest, NodesCordonDrainQueues) {
  const std::string tmp = std::getenv("TEST_TMPDIR");
  SchedulerServerOptions options;
  options.db_path = tmp + "/loomctl_admin.db";
  options.scheduler.checkpoint_root = tmp + "/checkpoints";
  options.scheduler.validation.fortunes_dir = tmp + "/fortunes";
  ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<QueuesConfig> queues =
      ParseQueuesConfig("queues: [{name: team-a, tenant: a, quota: {h100: 8}, borrowing_limit: {h100: 2}}]");
  ASSERT_TRUE(queues.ok());
  options.scheduler.queues = *queues;
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->grpc_address();
  auto workers = loom::v1::WorkerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  loom::v1::RegisterWorkerRequest req;
  req.set_node_id("gh-1");
  req.mutable_inventory()->set_accelerator(loom::v1::ACCELERATOR_KIND_GH200);
  req.mutable_inventory()->set_slots(1);
  req.mutable_inventory()->set_superchip(true);
  req.mutable_inventory()->set_cpu_arch("aarch64");
  req.mutable_inventory()->set_topology_domain("nvl-1");
  (*req.mutable_inventory()->mutable_labels())["zone"] = "b";
  loom::v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(workers->RegisterWorker(&ctx, req, &resp).ok());

  CliRun nodes = Loomctl(address, {"nodes"});
  EXPECT_EQ(nodes.code, 0) << nodes.output;
  EXPECT_NE(nodes.output.find("gh-1"), std::string::npos) << nodes.output;
  EXPECT_NE(nodes.output.find("gh200*"), std::string::npos) << nodes.output;
  EXPECT_NE(nodes.output.find("nvl-1"), std::string::npos) << nodes.output;
  EXPECT_NE(nodes.output.find("aarch64"), std::string::npos) << nodes.output;
  EXPECT_NE(nodes.output.find("zone=b"), std::string::npos) << nodes.output;

  CliRun cordon = Loomctl(address, {"cordon", "gh-1", "--reason=fan"});
  EXPECT_EQ(cordon.code, 0) << cordon.output;
  EXPECT_NE(cordon.output.find("node gh-1 cordoned"), std::string::npos) << cordon.output;
  nodes = Loomctl(address, {"nodes"});
  EXPECT_NE(nodes.output.find("live,cordoned"), std::string::npos) << nodes.output;
  EXPECT_NE(nodes.output.find("(fan)"), std::string::npos) << nodes.output;
  CliRun drain = Loomctl(address, {"drain", "gh-1"});
  EXPECT_EQ(drain.code, 0) << drain.output;
  EXPECT_NE(drain.output.find("node gh-1 draining; requeued 0 job(s)"), std::string::npos)
      << drain.output;
  CliRun uncordon = Loomctl(address, {"uncordon", "gh-1"});
  EXPECT_NE(uncordon.output.find("node gh-1 schedulable"), std::string::npos) << uncordon.output;
  CliRun missing = Loomctl(address, {"cordon", "nope"});
  EXPECT_EQ(missing.code, 5) << missing.output;  // NOT_FOUND
  EXPECT_NE(missing.output.find("node nope not found"), std::string::npos) << missing.output;

  CliRun q = Loomctl(address, {"queues"});
  EXPECT_EQ(q.code, 0) << q.output;
  EXPECT_NE(q.output.find("team-a"), std::string::npos) << q.output;
  EXPECT_NE(q.output.find("h100:8"), std::string::npos) << q.output;
  EXPECT_NE(q.output.find("h100:2"), std::string::npos) << q.output;
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace loom
