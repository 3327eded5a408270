// GET /v1/jobs pagination through loom-gateway's routes onto the real loom-scheduler
// (SchedulerServer on loopback port 0, real SQLite file) over real HTTP: page_size and
// page_token query parameters (proto or lowerCamelCase names), nextPageToken in the response
// (protobuf JSON mapping), bad values refused with 400 INVALID_ARGUMENT naming the parameter.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <httplib.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/gateway/gateway.h"
#include "services/scheduler/scheduler_server.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

class GatewayListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tmp = std::getenv("TEST_TMPDIR");
    SchedulerServerOptions options;
    options.db_path = tmp + "/gateway_list_test.db";
    std::remove(options.db_path.c_str());
    options.scheduler.checkpoint_root = tmp + "/checkpoints";
    options.scheduler.validation.fortunes_dir = tmp + "/fortunes";
    ASSERT_TRUE(MakeDirs(options.scheduler.validation.fortunes_dir).ok());
    auto server = SchedulerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    scheduler_ = std::move(*server);
    stub_ = loom::v1::JobService::NewStub(
        grpc::CreateChannel(scheduler_->grpc_address(), grpc::InsecureChannelCredentials()));
    GatewayOptions gateway_options;
    gateway_options.rpc_timeout = absl::Seconds(10);
    gateway_ = std::make_unique<JobGateway>(stub_.get(), gateway_options);
    gateway_->Register(http_);
    const int port = http_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port, 0);
    listener_ = std::thread([this] { http_.listen_after_bind(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port);
    client_->set_read_timeout(10);
  }

  void TearDown() override {
    http_.stop();
    if (listener_.joinable()) listener_.join();
    if (scheduler_) scheduler_->Shutdown(absl::Seconds(1));
  }

  std::pair<int, json> Get(const std::string& path) {
    auto res = client_->Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return {0, json()};
    json body = json::parse(res->body, nullptr, false);
    EXPECT_FALSE(body.is_discarded()) << res->body;
    return {res->status, body};
  }

  std::unique_ptr<SchedulerServer> scheduler_;
  std::unique_ptr<loom::v1::JobService::Stub> stub_;
  std::unique_ptr<JobGateway> gateway_;
  httplib::Server http_;
  std::thread listener_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(GatewayListTest, PagesFollowNextPageTokenInSubmissionOrder) {
  std::vector<std::string> submitted;
  for (int i = 0; i < 5; ++i) {
    loom::v1::SubmitJobRequest req;
    *req.mutable_spec() = ValidTestJobSpec();
    req.mutable_spec()->set_name(absl::StrCat("job-", i));
    std::string body;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(req, &body).ok());
    auto res = client_->Post("/v1/jobs", body, "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    submitted.push_back(json::parse(res->body)["job"]["id"].get<std::string>());
  }
  // Both spellings of the parameters, as protobuf's JSON mapping accepts both.
  for (const std::string& names : {std::string("page_size=%d&page_token="),
                                   std::string("pageSize=%d&pageToken=")}) {
    const std::string size_key = names.substr(0, names.find('='));
    const std::string token_key = names.substr(names.find('&') + 1, names.rfind('=') - names.find('&') - 1);
    std::vector<std::string> listed;
    std::string token;
    int pages = 0;
    do {
      std::string path = absl::StrCat("/v1/jobs?", size_key, "=2");
      if (!token.empty()) absl::StrAppend(&path, "&", token_key, "=", token);
      auto [code, page] = Get(path);
      ASSERT_EQ(code, 200) << path << " " << page;
      ++pages;
      EXPECT_LE(page["jobs"].size(), 2u);
      for (const json& j : page["jobs"]) listed.push_back(j["id"].get<std::string>());
      ASSERT_TRUE(page.contains("nextPageToken")) << page;  // printed even when empty
      token = page["nextPageToken"].get<std::string>();
    } while (!token.empty() && pages < 10);
    EXPECT_EQ(listed, submitted) << size_key;
    EXPECT_EQ(pages, 3) << size_key;
  }
  // Without page_size: the default page (100) holds all five, and no token.
  auto [code, all] = Get("/v1/jobs");
  ASSERT_EQ(code, 200);
  EXPECT_EQ(all["jobs"].size(), 5u);
  EXPECT_EQ(all["nextPageToken"], "");
}

TEST_F(GatewayListTest, BadPageParametersAre400NamingTheParameter) {
  for (const char* bad : {"abc", "-1", "1e2", " 7", ""}) {
    auto [code, err] = Get(absl::StrCat("/v1/jobs?page_size=", httplib::detail::encode_query_param(bad)));
    EXPECT_EQ(code, 400) << bad;
    EXPECT_EQ(err["status"], "INVALID_ARGUMENT") << bad;
    EXPECT_EQ(err["message"].get<std::string>().rfind("page_size: ", 0), 0u) << err;
  }
  // Over the maximum: capped at 1000, not refused (Google AIP-158; issue 52 finding 6).
  auto [big_code, big] = Get("/v1/jobs?page_size=1001");
  EXPECT_EQ(big_code, 200) << big;
  EXPECT_TRUE(big["jobs"].is_array()) << big;
  auto [tok_code, tok] = Get("/v1/jobs?page_token=bm90LWEtdG9rZW4");
  EXPECT_EQ(tok_code, 400);
  EXPECT_EQ(tok["message"].get<std::string>().rfind("page_token: ", 0), 0u) << tok;
  // Regression (break-it pass, 2026-12-05): errors about query parameters spoke of a "request
  // body" (a GET has none).
  for (const char* query : {"phase=SLEEPING", "bogus=1"}) {
    auto [code, err] = Get(absl::StrCat("/v1/jobs?", query));
    EXPECT_EQ(code, 400) << query;
    EXPECT_EQ(err["message"].get<std::string>().rfind(
                  "query string is not a valid loom.v1.ListJobsRequest in JSON: ", 0),
              0u)
        << err;
  }
}

// One set of phase names (issue 49): ?phase= takes loomctl's names (RUNNING, running) as well as
// the enum's that the JSON answers carry (JOB_PHASE_RUNNING).
TEST_F(GatewayListTest, PhaseFilterTakesTheNamesLoomctlPrints) {
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = ValidTestJobSpec();
  std::string body;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(req, &body).ok());
  auto res = client_->Post("/v1/jobs", body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string id = json::parse(res->body)["job"]["id"].get<std::string>();
  for (const char* phase : {"JOB_PHASE_PENDING", "PENDING", "pending"}) {
    auto [code, list] = Get(absl::StrCat("/v1/jobs?phase=", phase));
    ASSERT_EQ(code, 200) << phase << ": " << list;
    ASSERT_EQ(list["jobs"].size(), 1u) << phase << ": " << list;
    EXPECT_EQ(list["jobs"][0]["id"], id);
    EXPECT_EQ(list["jobs"][0]["phase"], "JOB_PHASE_PENDING");
  }
  auto [code, list] = Get("/v1/jobs?phase=RUNNING");
  ASSERT_EQ(code, 200) << list;
  EXPECT_FALSE(list.contains("jobs") && !list["jobs"].empty()) << list;
}

}  // namespace
}  // namespace loom::gateway
