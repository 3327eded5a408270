// POST /v1/jobs takes loomctl's job document (issue 49, "REST = the CLI's document"): the README's
// example (examples/fortunes-llama: job.yaml naming config.json and ds_config.json by path, the
// accelerator written "cpu") submitted as the files are, multipart/form-data; the same document
// as JSON with the short accelerator; and the errors naming what is missing. The reference is the
// example's files read here with nlohmann::json, not Loom's reader. A real scheduler and gateway
// (gateway_test_cluster.h); a node is registered so that the capacity check runs too.
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway_test_cluster.h"
#include "tests/testing/subprocess.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

std::string Example(const std::string& name) {
  return *ReadFile(testing::RunfilePath("examples/fortunes-llama/" + name));
}

class GatewaySubmitTest : public GatewayClusterTest {
 protected:
  // A multipart POST /v1/jobs of `items`; status and JSON body.
  std::pair<int, json> PostMultipart(const httplib::MultipartFormDataItems& items) {
    httplib::Headers headers = {{"Authorization", kTeamA}};
    httplib::Result res = client_->Post("/v1/jobs", headers, items);
    EXPECT_TRUE(res) << "no response";
    if (!res) return {0, json()};
    json body = json::parse(res->body, nullptr, false);
    EXPECT_FALSE(body.is_discarded()) << res->body;
    return {res->status, body};
  }
  httplib::MultipartFormDataItems ExampleAsFiles() {
    return {{"spec", Example("job.yaml"), "job.yaml", "application/yaml"},
            {"file", Example("config.json"), "config.json", "application/json"},
            {"file", Example("ds_config.json"), "ds_config.json", "application/json"}};
  }
};

TEST_F(GatewaySubmitTest, TheReadmeExampleAsItsFilesIsAcceptedAndStoredAsWritten) {
  RegisterNode("node-a", 2);
  httplib::MultipartFormDataItems items = ExampleAsFiles();
  items.push_back({"validateOnly", "true", "", ""});
  auto [dry_code, dry] = PostMultipart(items);
  ASSERT_EQ(dry_code, 200) << dry;
  EXPECT_EQ(dry["validatedOnly"], true) << dry;

  auto [code, submitted] = PostMultipart(ExampleAsFiles());
  ASSERT_EQ(code, 200) << submitted;
  const std::string id = submitted["job"]["id"].get<std::string>();
  auto [get_code, job] = Call("GET", "/v1/jobs/" + id, kTeamA);
  ASSERT_EQ(get_code, 200) << job;
  EXPECT_EQ(job["spec"]["name"], "fortunes-llama");
  EXPECT_EQ(job["spec"]["resources"]["accelerator"], "ACCELERATOR_KIND_CPU");
  EXPECT_EQ(job["spec"]["resources"]["numRanks"], 2);
  EXPECT_EQ(job["spec"]["deepspeedConfig"], json::parse(Example("ds_config.json")));
  EXPECT_EQ(job["spec"]["model"]["config"], json::parse(Example("config.json")));
}

TEST_F(GatewaySubmitTest, AFileTheSpecNamesButTheRequestLacksIsNamed) {
  httplib::MultipartFormDataItems items = ExampleAsFiles();
  items.pop_back();  // no ds_config.json
  auto [code, body] = PostMultipart(items);
  EXPECT_EQ(code, 400) << body;
  EXPECT_NE(body["message"].get<std::string>().find(
                "job.yaml: deepspeed_config: 'ds_config.json' names a file that was not sent "
                "with the request"),
            std::string::npos)
      << body;
  auto [no_spec, missing] = PostMultipart({{"file", "{}", "ds_config.json", ""}});
  EXPECT_EQ(no_spec, 400) << missing;
  EXPECT_NE(missing["message"].get<std::string>().find("no part named 'spec'"), std::string::npos)
      << missing;
  auto [bad_bool, bad] = PostMultipart({{"spec", Example("job.yaml"), "job.yaml", ""},
                                        {"waitForCapacity", "perhaps", "", ""}});
  EXPECT_EQ(bad_bool, 400) << bad;
  EXPECT_NE(bad["message"].get<std::string>().find("'waitForCapacity': want true or false"),
            std::string::npos)
      << bad;
}

TEST_F(GatewaySubmitTest, JsonTakesTheShortAcceleratorAndSaysInlineForAPath) {
  json spec = {{"name", "json-doc"},
               {"model", {{"config", json::parse(Example("config.json"))}}},
               {"dataset", {{"name", "fortunes"}, {"tokenizer", "byte"}}},
               {"deepspeed_config", json::parse(Example("ds_config.json"))},
               {"resources", {{"num_ranks", 2}, {"accelerator", "cpu"}}},
               {"training", {{"steps", 3}, {"sequence_length", 32}}}};
  auto [code, submitted] =
      Call("POST", "/v1/jobs", kTeamA, json{{"spec", spec}, {"validateOnly", true}}.dump());
  EXPECT_EQ(code, 200) << submitted;

  spec["resources"]["accelerator"] = "tpu";
  auto [bad_kind, kind] = Call("POST", "/v1/jobs", kTeamA, json{{"spec", spec}}.dump());
  EXPECT_EQ(bad_kind, 400) << kind;
  EXPECT_EQ(kind["message"], "spec.resources.accelerator: unknown kind 'tpu' (want cpu, h100, "
                             "h200 or gh200)");

  spec["resources"]["accelerator"] = "cpu";
  spec["deepspeed_config"] = "ds_config.json";
  auto [path_code, path] = Call("POST", "/v1/jobs", kTeamA, json{{"spec", spec}}.dump());
  EXPECT_EQ(path_code, 400) << path;
  EXPECT_NE(path["message"].get<std::string>().find(
                "spec.deepspeed_config: 'ds_config.json' names a file that was not sent with the "
                "request (inline its JSON object, or send multipart/form-data"),
            std::string::npos)
      << path;
}

}  // namespace
}  // namespace loom::gateway
