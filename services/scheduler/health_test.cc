// loom-scheduler's gRPC health service (issue 52 finding 3 and 5): every service name answers,
// and a health watcher hears NOT_SERVING before the server goes away, so a load balancer or a
// client can move on first. In-process SchedulerServer on loopback; the standard health protocol
// (testdata/health.proto, a copy of grpc's).
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "services/scheduler/scheduler_server.h"
#include "services/scheduler/testdata/health.grpc.pb.h"

namespace loom {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::unique_ptr<SchedulerServer> StartServer() {
  SchedulerServerOptions options;
  options.db_path = TmpDir() + "/health_test.db";
  options.scheduler.checkpoint_root = TmpDir() + "/checkpoints";
  options.scheduler.validation.fortunes_dir = TmpDir() + "/fortunes";
  EXPECT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server = SchedulerServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(SchedulerHealthTest, EveryServiceNameAnswersAndWatchersHearNotServingBeforeShutdown) {
  std::unique_ptr<SchedulerServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(server->grpc_address(), grpc::InsecureChannelCredentials()));
  for (const char* service : {"", "loom.v1.JobService", "loom.v1.AdminService",
                              "loom.v1.WorkerService"}) {
    grpc::ClientContext ctx;
    HealthCheckRequest req;
    req.set_service(service);
    HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << service << ": " << s.error_message();
    EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING) << service;
  }
  {
    grpc::ClientContext ctx;
    HealthCheckRequest req;
    req.set_service("loom.v1.NoSuchService");
    HealthCheckResponse resp;
    EXPECT_EQ(health->Check(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  grpc::ClientContext watch_ctx;
  HealthCheckRequest req;
  req.set_service("loom.v1.JobService");
  auto watch = health->Watch(&watch_ctx, req);
  HealthCheckResponse first;
  ASSERT_TRUE(watch->Read(&first));
  EXPECT_EQ(first.status(), HealthCheckResponse::SERVING);
  std::thread stopper([&] { server->Shutdown(absl::Seconds(2)); });
  HealthCheckResponse next;
  const bool got = watch->Read(&next);
  EXPECT_TRUE(got) << "the watch ended without a word: " << watch->Finish().error_message();
  if (got) {
    EXPECT_EQ(next.status(), HealthCheckResponse::NOT_SERVING);
  }
  stopper.join();
}

}  // namespace
}  // namespace loom
