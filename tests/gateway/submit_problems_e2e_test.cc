// Issue 47, "one answer with every problem", end to end: the real loom-scheduler (SQLite file,
// loopback, OS-chosen port), the real loom-gateway in front of it and the real loomctl binary.
// A spec with three independent mistakes (a bad resources.num_ranks, a misspelt DeepSpeed key,
// a bad model.config value) is refused once, with all three named:
//   * loomctl submit: exit code 3 (INVALID_ARGUMENT) and one stderr line per problem;
//   * POST /v1/jobs: HTTP 400, "status": "INVALID_ARGUMENT" and a "details" array of
//     {field, description}, one per problem (google.rpc.BadRequest through the gRPC status).
// The same spec with the three mistakes fixed passes both dry runs (loomctl submit --dry_run, REST
// "validateOnly": true), which shows the three were its only problems; nothing is queued. A dry
// run of the broken spec (loomctl --dry-run, the dashed spelling) is refused the same way.
// The expected texts are written out here, not taken from the validators.
#include <httplib.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/daemon.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

using ::loom::testing::RunfilePath;
using ::loom::testing::Subprocess;
using json = nlohmann::json;

// A valid spec (YAML, as a user writes it for loomctl) with three placeholders for the values
// the test breaks: NUM_RANKS, KV_HEADS and CLIP_KEY.
constexpr char kSpecYaml[] = R"(name: three-problems
model:
  config:
    vocab_size: 256
    hidden_size: 32
    intermediate_size: 64
    num_hidden_layers: 1
    num_attention_heads: 2
    num_key_value_heads: KV_HEADS
    max_position_embeddings: 32
    rms_norm_eps: 1.0e-5
    rope_theta: 10000
    tie_word_embeddings: true
dataset: {name: fortunes}
deepspeed_config:
  train_micro_batch_size_per_gpu: 2
  gradient_accumulation_steps: 1
  CLIP_KEY: 1.0
  optimizer: {type: AdamW, params: {lr: 0.001}}
  zero_optimization: {stage: 3}
resources: {num_ranks: NUM_RANKS}
training: {steps: 5, sequence_length: 16, seed: 1}
)";

// The same spec as the body of POST /v1/jobs (a SubmitJobRequest in protobuf's JSON mapping),
// written by hand as a REST client would.
constexpr char kSubmitJson[] = R"json({"validateOnly": VALIDATE_ONLY, "spec": {
  "name": "three-problems",
  "model": {"config": {
    "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 32,
    "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": true}},
  "dataset": {"name": "fortunes"},
  "deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                       "CLIP_KEY": 1.0,
                       "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                       "zero_optimization": {"stage": 3}},
  "resources": {"num_ranks": NUM_RANKS},
  "training": {"steps": 5, "sequence_length": 16, "seed": 1}
}})json";

std::string Fill(const std::string& text, bool broken, bool validate_only = false) {
  return absl::StrReplaceAll(
      text, {{"NUM_RANKS", broken ? "0" : "1"},
             {"KV_HEADS", broken ? "0" : "1"},
             {"CLIP_KEY", broken ? "gradient_clippping" : "gradient_clipping"},
             {"VALIDATE_ONLY", validate_only ? "true" : "false"}});
}

// The three problems, in the order of the spec's sections (resources, model, deepspeed_config).
const std::vector<std::pair<std::string, std::string>> kProblems = {
    {"resources.num_ranks", "must be in [1, 65536], got 0"},
    {"model.config.num_key_value_heads", "0 must be positive"},
    {"deepspeed_config.gradient_clippping", "unknown key (did you mean gradient_clipping?)"},
};

class SubmitProblemsE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(MakeDirs(tmp_ + "/checkpoints").ok());
    auto sched = testing::StartDaemon(
        tmp_, "scheduler", "services/scheduler/loom-scheduler",
        {"--db=" + tmp_ + "/loom.db", "--checkpoint_root=" + tmp_ + "/checkpoints"}, &sched_);
    ASSERT_TRUE(sched.ok()) << sched.status();
    scheduler_ = std::move(*sched);
    auto gw = testing::StartDaemon(tmp_, "gateway", "services/gateway/loom-gateway",
                                   {"--scheduler=" + sched_.grpc_address, "--port=0"}, &gw_);
    ASSERT_TRUE(gw.ok()) << gw.status();
    gateway_ = std::move(*gw);
    ASSERT_FALSE(gw_.http_url.empty());
  }

  // Runs loomctl against the scheduler; its exit code and its stdout+stderr.
  std::pair<int, std::string> Loomctl(const std::string& name, std::vector<std::string> args) {
    args.insert(args.begin(), {RunfilePath("services/cli/loomctl"),
                               "--scheduler=" + sched_.grpc_address, "--retry_deadline=0"});
    const std::string out = absl::StrCat(tmp_, "/loomctl-", name, ".out");
    auto p = Subprocess::Start(args, out);
    EXPECT_TRUE(p.ok()) << p.status();
    const int code = p.ok() ? testing::ExitCode(p->Wait(absl::Seconds(60))) : -1;
    auto text = ReadFile(out);
    return {code, text.ok() ? *text : std::string()};
  }

  // POST /v1/jobs with `body`; the HTTP status and the parsed JSON answer.
  std::pair<int, json> Post(const std::string& body) {
    httplib::Client http(gw_.http_url);
    http.set_read_timeout(60);
    auto r = http.Post("/v1/jobs", body, "application/json");
    EXPECT_TRUE(r) << httplib::to_string(r.error());
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  std::string tmp_;
  ReadyInfo sched_, gw_;
  std::unique_ptr<Subprocess> scheduler_, gateway_;
};

TEST_F(SubmitProblemsE2ETest, LoomctlNamesEveryProblemInOneAnswer) {
  const std::string yaml = tmp_ + "/broken.yaml";
  ASSERT_TRUE(WriteFileAtomically(yaml, Fill(kSpecYaml, /*broken=*/true)).ok());
  for (const bool dry_run : {false, true}) {
    std::vector<std::string> args = {"submit", yaml};
    if (dry_run) args.push_back("--dry-run");  // the dashed spelling, as DeepSpeed users type it
    auto [code, out] = Loomctl(dry_run ? "broken-dry-run" : "broken", args);
    EXPECT_EQ(code, 3) << out;  // INVALID_ARGUMENT
    std::string want = "loomctl: INVALID_ARGUMENT: 3 problems:\n";
    for (const auto& [field, what] : kProblems) {
      absl::StrAppend(&want, "  ", field, ": ", what, "\n");
    }
    EXPECT_EQ(out, want) << (dry_run ? "--dry_run" : "submit");
  }

  // Fixed, the spec is admissible: the dry run says so and queues nothing.
  const std::string fixed = tmp_ + "/fixed.yaml";
  ASSERT_TRUE(WriteFileAtomically(fixed, Fill(kSpecYaml, /*broken=*/false)).ok());
  auto [code, out] = Loomctl("fixed-dry-run", {"submit", fixed, "--dry_run"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("nothing was submitted"), std::string::npos) << out;
  auto [list_code, list_out] = Loomctl("list", {"list", "--json"});
  EXPECT_EQ(list_code, 0) << list_out;
  EXPECT_EQ(list_out.find("three-problems"), std::string::npos) << list_out;
}

TEST_F(SubmitProblemsE2ETest, RestAnswerHasEveryProblemInDetails) {
  json want_details = json::array();
  for (const auto& [field, what] : kProblems) {
    want_details.push_back({{"field", field}, {"description", what}});
  }
  for (const bool validate_only : {false, true}) {
    auto [status, err] = Post(Fill(kSubmitJson, /*broken=*/true, validate_only));
    EXPECT_EQ(status, 400) << err;
    EXPECT_EQ(err["status"], "INVALID_ARGUMENT") << err;
    EXPECT_EQ(err["details"], want_details) << err;
    ASSERT_TRUE(err["message"].is_string()) << err;
    std::string want_message = "3 problems:";
    for (const auto& [field, what] : kProblems) {
      absl::StrAppend(&want_message, "\n  ", field, ": ", what);
    }
    EXPECT_EQ(err["message"], want_message);
  }

  // Fixed: a dry run is answered 200 without a job, and no job was queued.
  auto [status, ok] = Post(Fill(kSubmitJson, /*broken=*/false, /*validate_only=*/true));
  EXPECT_EQ(status, 200) << ok;
  EXPECT_FALSE(ok.contains("job") && ok["job"].contains("id")) << ok;
  httplib::Client http(gw_.http_url);
  auto listed = http.Get("/v1/jobs");
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->status, 200) << listed->body;
  const json jobs = json::parse(listed->body, nullptr, false);
  EXPECT_TRUE(!jobs.contains("jobs") || jobs["jobs"].empty()) << jobs;
}

}  // namespace
}  // namespace loom
