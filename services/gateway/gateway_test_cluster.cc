#include "services/gateway/gateway_test_cluster.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/grpc_credentials.h"
#include "google/protobuf/util/json_util.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"

namespace loom::gateway {

void GatewayClusterTest::SetUp() {
  tmp_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
  ASSERT_TRUE(MakeDirs(tmp_ + "/fortunes").ok());
  checkpoint_root_ = tmp_ + "/checkpoints";
  ASSERT_TRUE(MakeDirs(checkpoint_root_).ok());
  const std::string tokens = tmp_ + "/tokens.yaml";
  ASSERT_TRUE(WriteFileAtomically(tokens,
                        "tokens:\n"
                        "  - {tenant: team-a, role: user, token: tok-team-a}\n"
                        "  - {tenant: team-b, role: user, token: tok-team-b}\n"
                        "  - {tenant: ops, role: admin, token: tok-ops-admin}\n")
                  .ok());
  auto auth = TokenAuthenticator::FromFile(tokens);
  ASSERT_TRUE(auth.ok()) << auth.status();
  auth_ = std::make_unique<TokenAuthenticator>(std::move(*auth));

  SchedulerServerOptions options;
  options.db_path = tmp_ + "/scheduler.db";
  std::remove(options.db_path.c_str());
  options.schedule_interval = absl::Milliseconds(20);
  options.auth_tokens_file = tokens;
  options.worker_token = kWorkerToken;
  options.scheduler.checkpoint_root = checkpoint_root_;
  options.scheduler.validation.fortunes_dir = tmp_ + "/fortunes";
  absl::StatusOr<QueuesConfig> queues = ParseQueuesConfig("queues: [{name: default, quota: {cpu: 4}}]");
  ASSERT_TRUE(queues.ok()) << queues.status();
  options.scheduler.queues = *queues;
  auto server = SchedulerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  scheduler_ = std::move(*server);

  CheckpointServiceOptions checkpoint_options;
  checkpoint_options.checkpoint_root = checkpoint_root_;
  checkpoint_options.users = auth_.get();
  checkpoint_service_ =
      std::make_unique<CheckpointServiceImpl>(checkpoint_options, checkpoint_registry_);
  int checkpoint_port = 0;
  auto started =
      StartCheckpointServer("127.0.0.1", 0, checkpoint_service_.get(), &checkpoint_port);
  ASSERT_TRUE(started.ok()) << started.status();
  checkpoint_server_ = std::move(*started);

  auto channel =
      grpc::CreateChannel(scheduler_->grpc_address(), grpc::InsecureChannelCredentials());
  jobs_ = loom::v1::JobService::NewStub(channel);
  admin_ = loom::v1::AdminService::NewStub(channel);
  checkpoints_ = loom::v1::CheckpointService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", checkpoint_port), grpc::InsecureChannelCredentials()));

  GatewayOptions gateway_options;
  gateway_options.rpc_timeout = absl::Seconds(10);
  gateway_options.openapi_json = kLoomOpenApiJson;
  gateway_options.registry = &registry_;
  gateway_options.auth = auth_.get();
  gateway_options.admin = admin_.get();
  gateway_options.checkpoints = checkpoints_.get();
  gateway_options.sse_keepalive = absl::Milliseconds(100);
  gateway_options.follow_probe = absl::Milliseconds(50);
  gateway_ = std::make_unique<JobGateway>(jobs_.get(), gateway_options);
  SetHttpThreads(http_, kHttpThreads);
  gateway_->Register(http_);
  AddRoutes(http_);
  http_port_ = http_.bind_to_any_port("127.0.0.1");
  ASSERT_GT(http_port_, 0);
  listener_ = std::thread([this] { http_.listen_after_bind(); });
  client_ = std::make_unique<httplib::Client>("127.0.0.1", http_port_);
  client_->set_read_timeout(20);
}

void GatewayClusterTest::TearDown() {
  http_.stop();
  if (listener_.joinable()) listener_.join();
  if (checkpoint_server_) checkpoint_server_->Shutdown();
  if (scheduler_) scheduler_->Shutdown(absl::Seconds(1));
}

std::pair<int, nlohmann::json> GatewayClusterTest::Call(const std::string& method,
                                                        const std::string& path,
                                                        const std::string& authorization,
                                                        const std::string& body) {
  httplib::Headers headers;
  if (!authorization.empty()) headers.emplace("Authorization", authorization);
  httplib::Result res =
      method == "GET"      ? client_->Get(path.c_str(), headers)
      : method == "DELETE" ? client_->Delete(path.c_str(), headers)
      : body.empty()       ? client_->Post(path.c_str(), headers)
                           : client_->Post(path.c_str(), headers, body, "application/json");
  EXPECT_TRUE(res) << method << " " << path << ": no response";
  if (!res) return {0, json()};
  json parsed = json::parse(res->body, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << method << " " << path << ": " << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json") << method << " " << path;
  return {res->status, parsed};
}

std::string GatewayClusterTest::Submit(const std::string& authorization, int ranks) {
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = TestJobSpecWithRanks(ranks);
  std::string body;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(req, &body).ok());
  auto [code, submitted] = Call("POST", "/v1/jobs", authorization, body);
  EXPECT_EQ(code, 200) << submitted;
  return code == 200 ? submitted["job"]["id"].get<std::string>() : "";
}

void GatewayClusterTest::RegisterNode(const std::string& node_id, int slots) {
  auto workers = loom::v1::WorkerService::NewStub(
      grpc::CreateChannel(scheduler_->grpc_address(), grpc::InsecureChannelCredentials()));
  loom::v1::RegisterWorkerRequest req;
  req.set_node_id(node_id);
  req.mutable_inventory()->set_slots(slots);
  req.mutable_inventory()->set_cpu_arch("x86_64");
  loom::v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  AddAuthorizationMetadata(ctx, absl::StrCat("Bearer ", kWorkerToken));
  grpc::Status s = workers->RegisterWorker(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

namespace {

// The series of `family` with these route/method/code labels ("" code: a family without one),
// or null.
const prometheus::ClientMetric* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& family, const std::string& route,
                                     const std::string& method, const std::string& code) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      if (labels["route"] == route && labels["method"] == method &&
          (code.empty() || labels["code"] == code)) {
        return &m;
      }
    }
  }
  return nullptr;
}

}  // namespace

double GatewayClusterTest::Requests(const std::string& route, const std::string& method,
                                    const std::string& code) {
  const auto families = registry_.Collect();
  const auto* m = Find(families, "loom_gateway_requests_total", route, method, code);
  return m == nullptr ? 0 : m->counter.value;
}

bool GatewayClusterTest::HasRequestsSeries(const std::string& route, const std::string& method,
                                           const std::string& code) {
  const auto families = registry_.Collect();
  return Find(families, "loom_gateway_requests_total", route, method, code) != nullptr;
}

double GatewayClusterTest::DurationCount(const std::string& route, const std::string& method) {
  const auto families = registry_.Collect();
  const auto* m = Find(families, "loom_gateway_request_duration_seconds", route, method, "");
  return m == nullptr ? 0 : static_cast<double>(m->histogram.sample_count);
}

bool GatewayClusterTest::AwaitRequests(const std::string& route, const std::string& method,
                                       const std::string& code, double want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Requests(route, method, code) < want) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));  // polling a condition with a deadline
  }
  return true;
}

}  // namespace loom::gateway
