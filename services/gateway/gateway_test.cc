// loom-gateway's routes against an in-process JobService (a fake with the scheduler's error
// contract) over real HTTP on loopback: JSON mapping both ways, paths, HTTP status per gRPC code.
#include "services/gateway/gateway.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

// In-memory JobService with the scheduler's error contract (proto/job_service.proto).
class FakeJobService final : public loom::v1::JobService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const loom::v1::SubmitJobRequest* req,
                         loom::v1::SubmitJobResponse* resp) override {
    absl::MutexLock l(&mu_);
    if (req->spec().name().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec.name: must not be empty");
    }
    loom::v1::Job job;
    job.set_id(absl::StrFormat("job-%08d", ++next_));
    *job.mutable_spec() = req->spec();
    job.set_phase(loom::v1::JOB_PHASE_PENDING);
    jobs_[job.id()] = job;
    *resp->mutable_job() = job;
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const loom::v1::GetJobRequest* req,
                      loom::v1::Job* resp) override {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job " + req->job_id());
    *resp = it->second;
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const loom::v1::ListJobsRequest* req,
                        loom::v1::ListJobsResponse* resp) override {
    absl::MutexLock l(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (req->phase() == loom::v1::JOB_PHASE_UNSPECIFIED || req->phase() == job.phase()) {
        *resp->add_jobs() = job;
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const loom::v1::CancelJobRequest* req,
                         loom::v1::Job* resp) override {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job " + req->job_id());
    if (it->second.phase() == loom::v1::JOB_PHASE_CANCELLED) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job already ended");
    }
    it->second.set_phase(loom::v1::JOB_PHASE_CANCELLED);
    *resp = it->second;
    return grpc::Status::OK;
  }
  grpc::Status KillJob(grpc::ServerContext* ctx, const loom::v1::KillJobRequest* req,
                       loom::v1::Job* resp) override {
    loom::v1::CancelJobRequest cancel;
    cancel.set_job_id(req->job_id());
    grpc::Status s = CancelJob(ctx, &cancel, resp);
    if (s.ok()) resp->set_reason("Killed");
    return s;
  }
  // Lines "r<rank>-<n>" (n = 1..3) of ranks 0 and 1, interleaved; honours ranks and tail_lines.
  grpc::Status StreamLogs(grpc::ServerContext*, const loom::v1::StreamLogsRequest* req,
                          grpc::ServerWriter<loom::v1::LogLine>* writer) override {
    {
      absl::MutexLock l(&mu_);
      if (jobs_.count(req->job_id()) == 0) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job " + req->job_id());
      }
      last_logs_request_ = *req;
    }
    std::vector<loom::v1::LogLine> lines;
    for (int n = 1; n <= 3; ++n) {
      for (int rank = 0; rank < 2; ++rank) {
        if (req->ranks_size() > 0 &&
            std::find(req->ranks().begin(), req->ranks().end(), rank) == req->ranks().end()) {
          continue;
        }
        loom::v1::LogLine line;
        line.set_rank(rank);
        line.set_attempt(1);
        line.set_sequence(n);
        line.set_text(absl::StrCat("r", rank, "-", n));
        line.set_stream("stderr");
        lines.push_back(line);
      }
    }
    size_t start = 0;
    if (req->tail_lines() > 0 && lines.size() > static_cast<size_t>(req->tail_lines())) {
      start = lines.size() - req->tail_lines();
    }
    for (size_t i = start; i < lines.size(); ++i) writer->Write(lines[i]);
    return grpc::Status::OK;
  }
  loom::v1::StreamLogsRequest last_logs_request() {
    absl::MutexLock l(&mu_);
    return last_logs_request_;
  }
  int submits() {
    absl::MutexLock l(&mu_);
    return next_;
  }

 private:
  absl::Mutex mu_;
  int next_ = 0;
  std::map<std::string, loom::v1::Job> jobs_;
  loom::v1::StreamLogsRequest last_logs_request_;
};

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int grpc_port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &grpc_port);
    builder.RegisterService(&service_);
    grpc_server_ = builder.BuildAndStart();
    ASSERT_GT(grpc_port, 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                   grpc::InsecureChannelCredentials());
    stub_ = loom::v1::JobService::NewStub(channel_);
    GatewayOptions options;
    options.rpc_timeout = absl::Seconds(5);
    auto openapi = ReadFile(absl::StrCat(std::getenv("TEST_SRCDIR"), "/loom/services/gateway/openapi.json"));
    ASSERT_TRUE(openapi.ok()) << openapi.status();
    options.openapi_json = *openapi;
    options.registry = &registry_;
    gateway_ = std::make_unique<JobGateway>(stub_.get(), options);
    gateway_->Register(http_);
    http_port_ = http_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(http_port_, 0);
    listener_ = std::thread([this] { http_.listen_after_bind(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", http_port_);
    client_->set_read_timeout(10);
  }

  void TearDown() override {
    http_.stop();
    if (listener_.joinable()) listener_.join();
    if (grpc_server_) grpc_server_->Shutdown();
  }

  // Status and parsed JSON body of a response (fails the test if there is none or it is not JSON).
  std::pair<int, json> Parse(const httplib::Result& res) {
    EXPECT_TRUE(res) << "no HTTP response";
    if (!res) return {0, json()};
    json body = json::parse(res->body, nullptr, false);
    EXPECT_FALSE(body.is_discarded()) << res->body;
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
    return {res->status, body};
  }
  std::pair<int, json> Get(const std::string& path) { return Parse(client_->Get(path.c_str())); }
  std::pair<int, json> Post(const std::string& path, const std::string& body) {
    return Parse(client_->Post(path.c_str(), body, "application/json"));
  }

  FakeJobService service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<loom::v1::JobService::Stub> stub_;
  prometheus::Registry registry_;
  std::unique_ptr<JobGateway> gateway_;
  httplib::Server http_;
  int http_port_ = 0;
  std::thread listener_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(GatewayTest, SubmitGetListAndCancelOverJson) {
  // Input accepts proto field names and lowerCamelCase JSON names alike.
  auto [code, submitted] = Post("/v1/jobs", R"({"spec": {"name": "a", "resources": {"num_ranks": 2}}})");
  ASSERT_EQ(code, 200) << submitted;
  const std::string id = submitted["job"]["id"];
  EXPECT_EQ(id, "job-00000001");
  EXPECT_EQ(submitted["job"]["phase"], "JOB_PHASE_PENDING");
  EXPECT_EQ(submitted["job"]["spec"]["resources"]["numRanks"], 2);  // output: lowerCamelCase
  auto [code_b, b] = Post("/v1/jobs", R"({"spec": {"name": "b", "resources": {"numRanks": 1}}})");
  ASSERT_EQ(code_b, 200) << b;

  auto [get_code, job] = Get("/v1/jobs/" + id);
  EXPECT_EQ(get_code, 200);
  EXPECT_EQ(job["id"], id);
  EXPECT_EQ(job["spec"]["name"], "a");
  EXPECT_EQ(job["attempt"], 0);  // primitive fields are always printed

  auto [list_code, all] = Get("/v1/jobs");
  EXPECT_EQ(list_code, 200);
  EXPECT_EQ(all["jobs"].size(), 2u);

  auto [cancel_code, cancelled] = Post("/v1/jobs/" + id + ":cancel", "");
  EXPECT_EQ(cancel_code, 200) << cancelled;
  EXPECT_EQ(cancelled["phase"], "JOB_PHASE_CANCELLED");

  // The phase filter is a query parameter holding the enum name.
  auto [p_code, pending] = Get("/v1/jobs?phase=JOB_PHASE_PENDING");
  EXPECT_EQ(p_code, 200);
  ASSERT_EQ(pending["jobs"].size(), 1u) << pending;
  EXPECT_EQ(pending["jobs"][0]["spec"]["name"], "b");
  auto [r_code, running] = Get("/v1/jobs?phase=JOB_PHASE_RUNNING");
  EXPECT_EQ(r_code, 200);
  EXPECT_EQ(running["jobs"], json::array());
}

TEST_F(GatewayTest, ErrorsCarryTheGrpcCodeAndMatchingHttpStatus) {
  auto [nf_code, nf] = Get("/v1/jobs/job-nope");
  EXPECT_EQ(nf_code, 404);
  EXPECT_EQ(nf["status"], "NOT_FOUND");
  EXPECT_EQ(nf["code"], 5);
  EXPECT_EQ(nf["message"], "no job job-nope");

  // The scheduler's INVALID_ARGUMENT, naming the field.
  auto [inv_code, inv] = Post("/v1/jobs", R"({"spec": {"name": ""}})");
  EXPECT_EQ(inv_code, 400);
  EXPECT_EQ(inv["status"], "INVALID_ARGUMENT");
  EXPECT_EQ(inv["message"], "spec.name: must not be empty");

  // Bodies that are not a SubmitJobRequest never reach the scheduler.
  for (const char* body : {"{not json", R"({"spec": {"name": "x", "colour": "red"}})",
                           R"({"spec": {"resources": {"num_ranks": "many"}}})"}) {
    auto [code, err] = Post("/v1/jobs", body);
    EXPECT_EQ(code, 400) << body;
    EXPECT_EQ(err["status"], "INVALID_ARGUMENT") << body;
    EXPECT_NE(err["message"].get<std::string>().find("loom.v1.SubmitJobRequest"), std::string::npos);
  }
  EXPECT_EQ(service_.submits(), 0);
  auto [bad_phase_code, bad_phase] = Get("/v1/jobs?phase=SOMETIMES");
  EXPECT_EQ(bad_phase_code, 400) << bad_phase;

  // Cancelling an ended job: FAILED_PRECONDITION -> 400.
  auto [ok_code, submitted] = Post("/v1/jobs", R"({"spec": {"name": "c"}})");
  ASSERT_EQ(ok_code, 200);
  std::string cancel = absl::StrCat("/v1/jobs/", submitted["job"]["id"].get<std::string>(), ":cancel");
  EXPECT_EQ(Post(cancel, "").first, 200);
  auto [again_code, again] = Post(cancel, "");
  EXPECT_EQ(again_code, 400);
  EXPECT_EQ(again["status"], "FAILED_PRECONDITION");

  // No such route.
  auto [route_code, route] = Get("/v1/widgets");
  EXPECT_EQ(route_code, 404);
  EXPECT_EQ(route["message"], "no route for GET /v1/widgets");

  // Scheduler gone: UNAVAILABLE -> 503.
  grpc_server_->Shutdown();
  grpc_server_.reset();
  auto [down_code, down] = Get("/v1/jobs");
  EXPECT_EQ(down_code, 503) << down;
  EXPECT_EQ(down["status"], "UNAVAILABLE");
}

TEST_F(GatewayTest, ServesOpenApiHealthAndRequestMetrics) {
  auto [code, doc] = Get("/v1/openapi.json");
  ASSERT_EQ(code, 200);
  EXPECT_EQ(doc["openapi"], "3.0.3");
  for (const char* path : {"/v1/jobs", "/v1/jobs/{id}", "/v1/jobs/{id}:cancel",
                           "/v1/jobs/{id}:kill", "/v1/jobs/{id}/logs"}) {
    EXPECT_TRUE(doc["paths"].contains(path)) << path;
  }
  EXPECT_EQ(doc["paths"]["/v1/jobs"]["post"]["operationId"], "SubmitJob");
  EXPECT_EQ(doc["paths"]["/v1/jobs/{id}:cancel"]["post"]["operationId"], "CancelJob");
  EXPECT_EQ(doc["paths"]["/v1/jobs/{id}:kill"]["post"]["operationId"], "KillJob");
  EXPECT_EQ(doc["paths"]["/v1/jobs/{id}/logs"]["get"]["operationId"], "StreamLogs");
  EXPECT_TRUE(doc["components"]["schemas"].contains("LogLine"));
  auto health = client_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  Get("/v1/jobs/job-nope");
  // httplib logs (and so counts) a request just after sending its response: poll briefly.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = prometheus::TextSerializer().Serialize(registry_.Collect());
    if (text.find("code=\"404\"") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(text.find("loom_gateway_requests_total{code=\"404\",method=\"GET\",route=\"/v1/jobs/{id}\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loom_gateway_requests_total{code=\"200\",method=\"GET\",route=\"/v1/openapi.json\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loom_gateway_requests_total{code=\"200\",method=\"GET\",route=\"/healthz\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loom_gateway_request_duration_seconds_count{code=\"404\",method=\"GET\",route=\"/v1/jobs/{id}\"} 1"),
            std::string::npos)
      << text;
}

// Regression: a client's Authorization header with bytes gRPC metadata cannot carry was copied
// into the call, and gRPC aborted the gateway. Now it is dropped (the call goes unauthenticated).
TEST_F(GatewayTest, AnAuthorizationHeaderGrpcCannotCarryDoesNotCrashTheGateway) {
  httplib::Headers bad = {{"Authorization", "Bearer \xff\xfe"}};
  auto res = client_->Get("/v1/jobs", bad);
  ASSERT_TRUE(res) << "no response: the gateway died";
  EXPECT_EQ(res->status, 200) << res->body;
  auto [code, submitted] = Post("/v1/jobs", R"({"spec": {"name": "a"}})");
  ASSERT_EQ(code, 200);
  const std::string logs = "/v1/jobs/" + submitted["job"]["id"].get<std::string>() + "/logs";
  res = client_->Get(logs.c_str(), bad);
  ASSERT_TRUE(res) << "no response: the gateway died";
  EXPECT_EQ(Get("/v1/jobs").first, 200);  // still serving
}

TEST_F(GatewayTest, KillRoute) {
  auto [code, submitted] = Post("/v1/jobs", R"({"spec": {"name": "k"}})");
  ASSERT_EQ(code, 200);
  const std::string id = submitted["job"]["id"];
  auto [kill_code, killed] = Post("/v1/jobs/" + id + ":kill", "");
  EXPECT_EQ(kill_code, 200) << killed;
  EXPECT_EQ(killed["phase"], "JOB_PHASE_CANCELLED");
  EXPECT_EQ(killed["reason"], "Killed");
  auto [again_code, again] = Post("/v1/jobs/" + id + ":kill", "");
  EXPECT_EQ(again_code, 400);
  EXPECT_EQ(again["status"], "FAILED_PRECONDITION");
  auto [missing_code, missing] = Post("/v1/jobs/job-nope:kill", "");
  EXPECT_EQ(missing_code, 404);
}

TEST_F(GatewayTest, LogsRouteWithRankTailAndFollow) {
  auto [code, submitted] = Post("/v1/jobs", R"({"spec": {"name": "l"}})");
  ASSERT_EQ(code, 200);
  const std::string id = submitted["job"]["id"];
  auto [all_code, all] = Get("/v1/jobs/" + id + "/logs");
  ASSERT_EQ(all_code, 200) << all;
  ASSERT_EQ(all["lines"].size(), 6u);
  EXPECT_EQ(all["lines"][0]["text"], "r0-1");
  EXPECT_EQ(all["lines"][0]["stream"], "stderr");
  EXPECT_EQ(all["lines"][0]["sequence"], "1");  // int64 as a string (proto3 JSON)

  auto [tail_code, tail] = Get("/v1/jobs/" + id + "/logs?rank=1&tail_lines=2");
  ASSERT_EQ(tail_code, 200) << tail;
  ASSERT_EQ(tail["lines"].size(), 2u);
  EXPECT_EQ(tail["lines"][0]["text"], "r1-2");
  EXPECT_EQ(tail["lines"][1]["text"], "r1-3");
  loom::v1::StreamLogsRequest seen = service_.last_logs_request();
  EXPECT_FALSE(seen.follow());
  ASSERT_EQ(seen.ranks_size(), 1);
  EXPECT_EQ(seen.ranks(0), 1);
  EXPECT_EQ(seen.tail_lines(), 2);

  // follow: chunked NDJSON, one LogLine per line.
  auto followed = client_->Get(("/v1/jobs/" + id + "/logs?follow=true&rank=0,1").c_str());
  ASSERT_TRUE(followed);
  EXPECT_EQ(followed->status, 200);
  EXPECT_EQ(followed->get_header_value("Content-Type"), "application/x-ndjson");
  std::vector<std::string> texts;
  for (absl::string_view l : absl::StrSplit(followed->body, '\n', absl::SkipEmpty())) {
    json line = json::parse(l, nullptr, false);
    ASSERT_FALSE(line.is_discarded()) << l;
    texts.push_back(line["text"]);
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"r0-1", "r1-1", "r0-2", "r1-2", "r0-3", "r1-3"}));
  seen = service_.last_logs_request();
  EXPECT_TRUE(seen.follow());
  EXPECT_EQ(seen.ranks_size(), 2);

  auto [missing_code, missing] = Get("/v1/jobs/job-nope/logs");
  EXPECT_EQ(missing_code, 404);
  auto [missing_follow_code, missing_follow] = Get("/v1/jobs/job-nope/logs?follow=1");
  EXPECT_EQ(missing_follow_code, 404);
  auto [bad_code, bad] = Get("/v1/jobs/" + id + "/logs?rank=x");
  EXPECT_EQ(bad_code, 400);
  EXPECT_NE(bad["message"].get<std::string>().find("rank"), std::string::npos);
  auto [unknown_code, unknown] = Get("/v1/jobs/" + id + "/logs?lines=3");
  EXPECT_EQ(unknown_code, 400);
}

TEST(HttpStatusFromGrpcTest, FollowsGoogleRpcCodeMapping) {
  const std::map<grpc::StatusCode, int> want = {
      {grpc::StatusCode::OK, 200}, {grpc::StatusCode::CANCELLED, 499},
      {grpc::StatusCode::UNKNOWN, 500}, {grpc::StatusCode::INVALID_ARGUMENT, 400},
      {grpc::StatusCode::DEADLINE_EXCEEDED, 504}, {grpc::StatusCode::NOT_FOUND, 404},
      {grpc::StatusCode::ALREADY_EXISTS, 409}, {grpc::StatusCode::PERMISSION_DENIED, 403},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, 429}, {grpc::StatusCode::FAILED_PRECONDITION, 400},
      {grpc::StatusCode::ABORTED, 409}, {grpc::StatusCode::OUT_OF_RANGE, 400},
      {grpc::StatusCode::UNIMPLEMENTED, 501}, {grpc::StatusCode::INTERNAL, 500},
      {grpc::StatusCode::UNAVAILABLE, 503}, {grpc::StatusCode::DATA_LOSS, 500},
      {grpc::StatusCode::UNAUTHENTICATED, 401}};
  for (const auto& [code, http] : want) EXPECT_EQ(HttpStatusFromGrpc(code), http) << code;
}

}  // namespace
}  // namespace loom::gateway
