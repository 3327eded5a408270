// loom-gateway's job routes (submit, get, list, cancel, kill, logs) over real HTTP on loopback
// against a real loom-scheduler with bearer tokens (GatewayClusterTest,
// gateway_test_cluster.h): JSON mapping both ways, paths, the HTTP status of each gRPC code,
// bodies that never reach the scheduler, and the scheduler going away.
#include "services/gateway/gateway.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/test_job_spec.h"
#include "services/gateway/gateway_test_cluster.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

// The SubmitJobRequest of TestJobSpecWithRanks(1) named `name`, as JSON with proto field names
// (num_ranks) or lowerCamelCase ones (numRanks).
std::string SubmitBody(const std::string& name, bool proto_names) {
  loom::v1::SubmitJobRequest req;
  *req.mutable_spec() = TestJobSpecWithRanks(1);
  req.mutable_spec()->set_name(name);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = proto_names;
  std::string body;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(req, &body, options).ok());
  return body;
}

TEST_F(GatewayClusterTest, SubmitGetListAndCancelOverJson) {
  // Input accepts proto field names and lowerCamelCase JSON names alike.
  const std::string a_body = SubmitBody("a", /*proto_names=*/true);
  ASSERT_NE(a_body.find("\"num_ranks\""), std::string::npos) << a_body;
  auto [code, submitted] = Call("POST", "/v1/jobs", kTeamA, a_body);
  ASSERT_EQ(code, 200) << submitted;
  const std::string id = submitted["job"]["id"];
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(submitted["job"]["phase"], "JOB_PHASE_PENDING");  // no nodes: it stays pending
  EXPECT_EQ(submitted["job"]["spec"]["resources"]["numRanks"], 1);  // output: lowerCamelCase
  auto [code_b, b] = Call("POST", "/v1/jobs", kTeamA, SubmitBody("b", /*proto_names=*/false));
  ASSERT_EQ(code_b, 200) << b;

  auto [get_code, job] = Call("GET", "/v1/jobs/" + id, kTeamA);
  EXPECT_EQ(get_code, 200) << job;
  EXPECT_EQ(job["id"], id);
  EXPECT_EQ(job["spec"]["name"], "a");
  EXPECT_EQ(job["attempt"], 0);  // primitive fields are always printed

  auto [list_code, all] = Call("GET", "/v1/jobs", kTeamA);
  EXPECT_EQ(list_code, 200);
  EXPECT_EQ(all["jobs"].size(), 2u) << all;

  auto [cancel_code, cancelled] = Call("POST", "/v1/jobs/" + id + ":cancel", kTeamA);
  EXPECT_EQ(cancel_code, 200) << cancelled;
  EXPECT_EQ(cancelled["phase"], "JOB_PHASE_CANCELLED");

  // The phase filter is a query parameter holding the enum name.
  auto [p_code, pending] = Call("GET", "/v1/jobs?phase=JOB_PHASE_PENDING", kTeamA);
  EXPECT_EQ(p_code, 200);
  ASSERT_EQ(pending["jobs"].size(), 1u) << pending;
  EXPECT_EQ(pending["jobs"][0]["spec"]["name"], "b");
  auto [r_code, running] = Call("GET", "/v1/jobs?phase=JOB_PHASE_RUNNING", kTeamA);
  EXPECT_EQ(r_code, 200);
  EXPECT_EQ(running["jobs"], json::array()) << running;
}

// Issue 47: a spec with five independent mistakes is refused once, through the real scheduler's
// gRPC server, with every problem in the message and in "details" (google.rpc.BadRequest's field
// violations, carried in the gRPC status details). A dry run (validate_only) answers the same.
TEST_F(GatewayClusterTest, ARefusedSubmissionListsEveryProblem) {
  loom::v1::SubmitJobRequest bad;
  *bad.mutable_spec() = TestJobSpecWithRanks(1);
  loom::v1::JobSpec& spec = *bad.mutable_spec();
  spec.mutable_resources()->set_num_ranks(0);
  (*spec.mutable_model()->mutable_config()->mutable_fields())["num_attention_heads"]
      .set_number_value(0);
  spec.mutable_training()->set_steps(0);
  auto& ds = *spec.mutable_deepspeed_config()->mutable_fields();
  ds["gradient_clippping"].set_number_value(1.0);
  (*ds["fp16"].mutable_struct_value()->mutable_fields())["auto_cast"].set_bool_value(true);
  for (bool dry_run : {false, true}) {
    bad.set_validate_only(dry_run);
    std::string body;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(bad, &body).ok());
    auto [code, err] = Call("POST", "/v1/jobs", kTeamA, body);
    EXPECT_EQ(code, 400) << err;
    EXPECT_EQ(err["status"], "INVALID_ARGUMENT");
    EXPECT_EQ(err["message"].get<std::string>().rfind("5 problems:\n", 0), 0u) << err;
    ASSERT_TRUE(err.contains("details")) << err;
    std::vector<std::string> fields;
    for (const json& d : err["details"]) fields.push_back(d["field"]);
    EXPECT_EQ(fields, (std::vector<std::string>{
                          "resources.num_ranks", "model.config.num_attention_heads",
                          "training.steps", "deepspeed_config.gradient_clippping",
                          "deepspeed_config.fp16.auto_cast"}))
        << err;
    EXPECT_EQ(err["details"][3]["description"], "unknown key (did you mean gradient_clipping?)");
  }
  // Other errors have no details.
  auto [nf_code, nf] = Call("GET", "/v1/jobs/job-nope", kTeamA);
  EXPECT_EQ(nf_code, 404);
  EXPECT_FALSE(nf.contains("details")) << nf;
}

TEST_F(GatewayClusterTest, ErrorsCarryTheGrpcCodeAndMatchingHttpStatus) {
  auto [nf_code, nf] = Call("GET", "/v1/jobs/job-nope", kTeamA);
  EXPECT_EQ(nf_code, 404);
  EXPECT_EQ(nf["status"], "NOT_FOUND");
  EXPECT_EQ(nf["code"], 5);
  EXPECT_NE(nf["message"].get<std::string>().find("job-nope"), std::string::npos) << nf;

  // The scheduler's INVALID_ARGUMENT, naming the field.
  loom::v1::SubmitJobRequest bad;
  *bad.mutable_spec() = TestJobSpecWithRanks(1);
  bad.mutable_spec()->mutable_resources()->set_host_memory_bytes(-1);
  std::string bad_body;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(bad, &bad_body).ok());
  auto [inv_code, inv] = Call("POST", "/v1/jobs", kTeamA, bad_body);
  EXPECT_EQ(inv_code, 400);
  EXPECT_EQ(inv["status"], "INVALID_ARGUMENT");
  EXPECT_NE(inv["message"].get<std::string>().find("resources.host_memory_bytes"),
            std::string::npos)
      << inv;

  // Bodies that are not a SubmitJobRequest never reach the scheduler.
  for (const char* body : {"{not json", R"({"spec": {"name": "x", "colour": "red"}})",
                           R"({"spec": {"resources": {"num_ranks": "many"}}})"}) {
    auto [code, err] = Call("POST", "/v1/jobs", kTeamA, body);
    EXPECT_EQ(code, 400) << body;
    EXPECT_EQ(err["status"], "INVALID_ARGUMENT") << body;
    EXPECT_NE(err["message"].get<std::string>().find("loom.v1.SubmitJobRequest"), std::string::npos);
  }
  auto [none_code, none] = Call("GET", "/v1/jobs", kAdmin);
  EXPECT_EQ(none_code, 200);
  EXPECT_EQ(none["jobs"], json::array()) << none;
  auto [bad_phase_code, bad_phase] = Call("GET", "/v1/jobs?phase=SOMETIMES", kTeamA);
  EXPECT_EQ(bad_phase_code, 400) << bad_phase;

  // Cancelling an ended job: FAILED_PRECONDITION -> 400.
  const std::string id = Submit(kTeamA);
  ASSERT_FALSE(id.empty());
  const std::string cancel = absl::StrCat("/v1/jobs/", id, ":cancel");
  EXPECT_EQ(Call("POST", cancel, kTeamA).first, 200);
  auto [again_code, again] = Call("POST", cancel, kTeamA);
  EXPECT_EQ(again_code, 400);
  EXPECT_EQ(again["status"], "FAILED_PRECONDITION");

  // No such route.
  auto [route_code, route] = Call("GET", "/v1/widgets", kTeamA);
  EXPECT_EQ(route_code, 404);
  EXPECT_EQ(route["message"], "no route for GET /v1/widgets");

  // Scheduler gone: UNAVAILABLE -> 503.
  scheduler_->Shutdown(absl::Seconds(1));
  scheduler_.reset();
  auto [down_code, down] = Call("GET", "/v1/jobs", kTeamA);
  EXPECT_EQ(down_code, 503) << down;
  EXPECT_EQ(down["status"], "UNAVAILABLE");
}

TEST_F(GatewayClusterTest, ServesOpenApiAndHealth) {
  auto [code, doc] = Call("GET", "/v1/openapi.json", "");
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
}

// Regression: a client's Authorization header with bytes gRPC metadata cannot carry was copied
// into the call, and gRPC aborted the gateway. Now it is dropped: the call goes unauthenticated
// (401 from the scheduler's token check) and the gateway keeps serving.
TEST_F(GatewayClusterTest, AnAuthorizationHeaderGrpcCannotCarryDoesNotCrashTheGateway) {
  httplib::Headers bad = {{"Authorization", "Bearer \xff\xfe"}};
  auto res = client_->Get("/v1/jobs", bad);
  ASSERT_TRUE(res) << "no response: the gateway died";
  EXPECT_EQ(res->status, 401) << res->body;
  const std::string id = Submit(kTeamA);
  ASSERT_FALSE(id.empty());
  res = client_->Get(("/v1/jobs/" + id + "/logs").c_str(), bad);
  ASSERT_TRUE(res) << "no response: the gateway died";
  EXPECT_EQ(Call("GET", "/v1/jobs", kTeamA).first, 200);  // still serving
}

TEST_F(GatewayClusterTest, KillRoute) {
  const std::string id = Submit(kTeamA);
  ASSERT_FALSE(id.empty());
  auto [kill_code, killed] = Call("POST", "/v1/jobs/" + id + ":kill", kTeamA);
  EXPECT_EQ(kill_code, 200) << killed;
  EXPECT_EQ(killed["phase"], "JOB_PHASE_CANCELLED");
  EXPECT_EQ(killed["reason"], "Killed");
  auto [again_code, again] = Call("POST", "/v1/jobs/" + id + ":kill", kTeamA);
  EXPECT_EQ(again_code, 400);
  EXPECT_EQ(again["status"], "FAILED_PRECONDITION");
  auto [missing_code, missing] = Call("POST", "/v1/jobs/job-nope:kill", kTeamA);
  EXPECT_EQ(missing_code, 404);
}

// The logs route's query parameters and errors. The job never ran (no nodes), so it has no
// retained lines: the scheduler answers an empty list, and follow on an ended job ends at once.
// Two ranks, so that rank=1 and rank=0,1 name ranks the job has (the scheduler refuses others).
TEST_F(GatewayClusterTest, LogsRouteParametersAndErrors) {
  const std::string id = Submit(kTeamA, 2);
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Call("POST", "/v1/jobs/" + id + ":cancel", kTeamA).first, 200);
  auto [all_code, all] = Call("GET", "/v1/jobs/" + id + "/logs", kTeamA);
  EXPECT_EQ(all_code, 200) << all;
  EXPECT_TRUE(!all.contains("lines") || all["lines"].empty()) << all;
  auto [tail_code, tail] = Call("GET", "/v1/jobs/" + id + "/logs?rank=1&tail_lines=2", kTeamA);
  EXPECT_EQ(tail_code, 200) << tail;
  auto [range_code, range] = Call("GET", "/v1/jobs/" + id + "/logs?rank=2", kTeamA);
  EXPECT_EQ(range_code, 400) << range;  // the scheduler's INVALID_ARGUMENT, passed through
  EXPECT_EQ(range["status"], "INVALID_ARGUMENT") << range;

  // follow: chunked NDJSON, one LogLine per line (none here), ending with the ended job.
  httplib::Headers auth = {{"Authorization", kTeamA}};
  auto followed = client_->Get(("/v1/jobs/" + id + "/logs?follow=true&rank=0,1").c_str(), auth);
  ASSERT_TRUE(followed);
  EXPECT_EQ(followed->status, 200);
  EXPECT_EQ(followed->get_header_value("Content-Type"), "application/x-ndjson");
  for (absl::string_view l : absl::StrSplit(followed->body, '\n', absl::SkipEmpty())) {
    const json line = json::parse(l, nullptr, false);
    EXPECT_FALSE(line.is_discarded()) << l;
    EXPECT_FALSE(line.contains("error")) << l;
  }

  EXPECT_EQ(Call("GET", "/v1/jobs/job-nope/logs", kTeamA).first, 404);
  EXPECT_EQ(Call("GET", "/v1/jobs/job-nope/logs?follow=1", kTeamA).first, 404);
  auto [bad_code, bad] = Call("GET", "/v1/jobs/" + id + "/logs?rank=x", kTeamA);
  EXPECT_EQ(bad_code, 400);
  EXPECT_NE(bad["message"].get<std::string>().find("rank"), std::string::npos) << bad;
  auto [neg_code, neg] = Call("GET", "/v1/jobs/" + id + "/logs?tail_lines=-1", kTeamA);
  EXPECT_EQ(neg_code, 400);
  EXPECT_NE(neg["message"].get<std::string>().find("tail_lines"), std::string::npos) << neg;
  auto [unknown_code, unknown] = Call("GET", "/v1/jobs/" + id + "/logs?lines=3", kTeamA);
  EXPECT_EQ(unknown_code, 400);
}

TEST(HttpStatusFromGrpcTest, FollowsGoogleRpcCodeMapping) {
  const std::map<grpc::StatusCode, int> want = {
      {grpc::StatusCode::OK, 200}, {grpc::StatusCode::CANCELLED, 503},
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
