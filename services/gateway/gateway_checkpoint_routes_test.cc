// loom-gateway's checkpoint routes over real HTTP on loopback against a real loom-checkpoint
// service and loom-scheduler with bearer tokens (GatewayClusterTest), on checkpoints this test
// writes as files itself (storage::WriteShard): list, get, consolidate (the tensors read back
// equal the values written), verify, delete, retention; 401 without a token, 403 for a user
// token (loom-checkpoint needs an admin), 404 for an unknown job or step, 400 for a bad step.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "services/gateway/gateway_test_cluster.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"

namespace loom::gateway {
namespace {

using json = nlohmann::json;

// A 2-rank model: "w" [3, 3] and "b" [1], each rank holding its half of the flat partition.
const std::vector<float> kW = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 6.0f, 7.0f, 8.125f, -9.0f};
const std::vector<float> kB = {42.0f};

void WriteCheckpoint(const std::string& job_dir, int64_t step) {
  const std::vector<const std::vector<float>*> values = {&kW, &kB};
  for (int32_t rank = 0; rank < 2; ++rank) {
    storage::ShardManifest m;
    m.step = step;
    m.rank = rank;
    m.world_size = 2;
    m.model_config_json = R"({"model_type":"llama","tie_word_embeddings":false})";
    m.params.push_back({"w", {3, 3}, 9});
    m.params.push_back({"b", {1}, 1});
    storage::AssignPartitionLayout(m);
    std::vector<float> section(m.section_numel, 0.0f);
    for (size_t i = 0; i < m.params.size(); ++i) {
      const storage::ShardParam& p = m.params[i];
      for (int64_t k = 0; k < p.partition_numel; ++k) {
        const int64_t flat = rank * p.partition_numel + k;
        if (flat < p.numel) section[p.partition_offset + k] = (*values[i])[flat];
      }
    }
    const float* ptr = section.data();
    ASSERT_TRUE(storage::WriteShard(absl::StrCat(job_dir, "/", storage::StepDirName(step)), m,
                                    absl::MakeConstSpan(&ptr, 1))
                    .ok());
  }
}

std::vector<float> Floats(const safetensors::Reader& r, const std::string& name) {
  auto bytes = r.ReadTensor(name);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  std::vector<float> out(bytes.ok() ? bytes->size() / 4 : 0);
  if (bytes.ok()) std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

TEST_F(GatewayClusterTest, CheckpointRoutes) {
  const std::string id = Submit(kTeamA, 2);
  ASSERT_FALSE(id.empty());
  const std::string dir = absl::StrCat(checkpoint_root_, "/", id);
  for (int64_t step : {10, 20, 30}) WriteCheckpoint(dir, step);
  const std::string base = "/v1/jobs/" + id + "/checkpoints";

  auto [code, list] = Call("GET", base, kAdmin);
  ASSERT_EQ(code, 200) << list;
  ASSERT_EQ(list["checkpoints"].size(), 3u) << list;
  EXPECT_EQ(list["checkpoints"][0]["step"], "10");  // int64: a JSON string
  EXPECT_EQ(list["checkpoints"][0]["worldSize"], 2);
  EXPECT_EQ(list["checkpoints"][0]["committed"], true);
  EXPECT_EQ(list["checkpoints"][0]["ranksReported"], 2);

  auto [g, one] = Call("GET", base + "/20", kAdmin);
  ASSERT_EQ(g, 200) << one;
  EXPECT_EQ(one["step"], "20");
  EXPECT_EQ(one["committed"], true);
  auto [g404, g404_err] = Call("GET", base + "/25", kAdmin);
  EXPECT_EQ(g404, 404) << g404_err;
  auto [g400, g400_err] = Call("GET", base + "/abc", kAdmin);
  EXPECT_EQ(g400, 400) << g400_err;
  EXPECT_EQ(g400_err["message"].get<std::string>().rfind("step: ", 0), 0u) << g400_err;
  auto [j404, j404_err] = Call("GET", "/v1/jobs/job-nope/checkpoints", kAdmin);
  EXPECT_EQ(j404, 404) << j404_err;

  // Consolidate step 20 into a safetensors file whose tensors are the values written.
  auto [c, consolidated] =
      Call("POST", base + "/20:consolidate", kAdmin, R"({"dtype": "fp32"})");
  ASSERT_EQ(c, 200) << consolidated;
  EXPECT_EQ(consolidated["step"], "20");
  EXPECT_EQ(consolidated["numTensors"], "2");
  EXPECT_EQ(consolidated["dtype"], "F32");
  auto reader = safetensors::Reader::Open(consolidated["safetensorsPath"].get<std::string>());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(Floats(**reader, "w"), kW);
  EXPECT_EQ(Floats(**reader, "b"), kB);
  auto [cbad, cbad_err] = Call("POST", base + "/20:consolidate", kAdmin, R"({"step": "30"})");
  EXPECT_EQ(cbad, 400) << cbad_err;
  auto [cd, cd_err] = Call("POST", base + "/20:consolidate", kAdmin, R"({"dtype": "fp8"})");
  EXPECT_EQ(cd, 400) << cd_err;
  EXPECT_NE(cd_err["message"].get<std::string>().find("dtype"), std::string::npos) << cd_err;

  auto [v, verified] = Call("POST", base + "/30:verify", kAdmin);
  ASSERT_EQ(v, 200) << verified;
  EXPECT_FALSE(verified["kind"].get<std::string>().empty()) << verified;
  EXPECT_FALSE(verified["files"].empty()) << verified;

  // Delete step 10; the newest committed one (30) is refused; retention keeps the newest one.
  auto [d, deleted] = Call("DELETE", base + "/10", kAdmin);
  ASSERT_EQ(d, 200) << deleted;
  EXPECT_EQ(deleted["deleted"], true);
  auto [again, again_body] = Call("DELETE", base + "/10", kAdmin);
  EXPECT_EQ(again, 200) << again_body;
  EXPECT_EQ(again_body["deleted"], false);
  auto [newest, newest_err] = Call("DELETE", base + "/30", kAdmin);
  EXPECT_EQ(newest, 400) << newest_err;
  EXPECT_EQ(newest_err["status"], "FAILED_PRECONDITION");
  auto [r, retained] = Call("POST", base + ":applyRetention", kAdmin, R"({"keep_last": 1})");
  ASSERT_EQ(r, 200) << retained;
  EXPECT_EQ(retained["deletedSteps"], json::array({"20"})) << retained;
  EXPECT_EQ(retained["keptSteps"], json::array({"30"})) << retained;
  auto [after, after_list] = Call("GET", base, kAdmin);
  ASSERT_EQ(after, 200);
  ASSERT_EQ(after_list["checkpoints"].size(), 1u) << after_list;
  EXPECT_EQ(after_list["checkpoints"][0]["step"], "30");
}

TEST_F(GatewayClusterTest, CheckpointRoutesNeedAnAdminToken) {
  const std::string id = Submit(kTeamA, 2);
  ASSERT_FALSE(id.empty());
  WriteCheckpoint(absl::StrCat(checkpoint_root_, "/", id), 10);
  const std::string base = "/v1/jobs/" + id + "/checkpoints";
  for (const auto& [method, path, body] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", base, ""},
           {"GET", base + "/10", ""},
           {"DELETE", base + "/10", ""},
           {"POST", base + "/10:consolidate", "{}"},
           {"POST", base + "/10:verify", ""},
           {"POST", base + ":applyRetention", R"({"keep_last": 1})"}}) {
    // Even the job's own tenant: loom-checkpoint addresses checkpoints across tenants.
    auto [user, user_err] = Call(method, path, kTeamA, body);
    EXPECT_EQ(user, 403) << method << " " << path << " " << user_err;
    EXPECT_EQ(user_err["status"], "PERMISSION_DENIED");
    auto [anon, anon_err] = Call(method, path, "", body);
    EXPECT_EQ(anon, 401) << method << " " << path << " " << anon_err;
  }
  // Nothing was deleted.
  auto [code, list] = Call("GET", base, kAdmin);
  ASSERT_EQ(code, 200) << list;
  EXPECT_EQ(list["checkpoints"].size(), 1u);
  EXPECT_TRUE(AwaitRequests("/v1/jobs/{id}/checkpoints/{step}", "DELETE", "403", 1));
}

}  // namespace
}  // namespace loom::gateway
