// Test fixture: a real loom-scheduler (SchedulerServer on loopback port 0, SQLite file, bearer
// tokens), a real loom-checkpoint service (CheckpointServiceImpl over gRPC on port 0, same
// tokens file) and loom-gateway's routes on an httplib server on port 0, with the gateway's own
// token check and metrics registry. Tokens: team-a and team-b (user role), ops (admin).
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_TEST_CLUSTER_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_TEST_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "common/auth.h"
#include "gtest/gtest.h"
#include "proto/admin_service.grpc.pb.h"
#include "proto/checkpoint_service.grpc.pb.h"
#include "proto/job_service.grpc.pb.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_server.h"
#include "services/scheduler/scheduler_server.h"

extern const char kLoomOpenApiJson[];  // services/gateway/openapi.json, embedded by a genrule

namespace loom::gateway {

inline constexpr char kTeamA[] = "Bearer tok-team-a";
inline constexpr char kTeamB[] = "Bearer tok-team-b";
inline constexpr char kAdmin[] = "Bearer tok-ops-admin";
inline constexpr char kWorkerToken[] = "tok-worker";

class GatewayClusterTest : public ::testing::Test {
 protected:
  using json = nlohmann::json;

  // The gateway's pool: httplib's default on a small machine (max(8, hardware threads - 1))
  // and the smallest DefaultHttpThreads(), fixed so that a test exhausting it means the same on
  // every machine.
  static constexpr int kHttpThreads = 8;

  void SetUp() override;
  void TearDown() override;
  // Called after the gateway's routes are registered and before the server listens: a test
  // fixture may add routes of its own here.
  virtual void AddRoutes(httplib::Server& /*server*/) {}

  // One HTTP exchange with `authorization` ("" = none): status and parsed JSON body (the test
  // fails if there is no response or the body is not JSON).
  std::pair<int, json> Call(const std::string& method, const std::string& path,
                            const std::string& authorization, const std::string& body = "");
  // Submits TestJobSpecWithRanks(ranks) as `authorization` through the gateway; its id.
  std::string Submit(const std::string& authorization, int ranks = 1);
  // Registers a worker node with `slots` CPU slots through the real WorkerService.
  void RegisterNode(const std::string& node_id, int slots);
  // The value of a loom_gateway_requests_total series (counter) or of the sample count of a
  // loom_gateway_request_duration_seconds series, 0 if absent.
  double Requests(const std::string& route, const std::string& method, const std::string& code);
  double DurationCount(const std::string& route, const std::string& method);
  // Whether the loom_gateway_requests_total series exists (at any value, 0 included).
  bool HasRequestsSeries(const std::string& route, const std::string& method,
                         const std::string& code);
  // Waits (deadline 20 s) until Requests(route, method, code) >= want: httplib counts a request
  // just after sending its response.
  bool AwaitRequests(const std::string& route, const std::string& method, const std::string& code,
                     double want);

  std::string tmp_;
  std::string checkpoint_root_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::unique_ptr<TokenAuthenticator> auth_;
  prometheus::Registry checkpoint_registry_;
  std::unique_ptr<CheckpointServiceImpl> checkpoint_service_;
  std::unique_ptr<grpc::Server> checkpoint_server_;
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::AdminService::Stub> admin_;
  std::unique_ptr<loom::v1::CheckpointService::Stub> checkpoints_;
  prometheus::Registry registry_;
  std::unique_ptr<JobGateway> gateway_;
  GatewayServer http_;  // the default HeaderLimits, as loom-gateway's flags
  int http_port_ = 0;
  std::thread listener_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace loom::gateway

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_TEST_CLUSTER_H_
