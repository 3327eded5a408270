// `loomctl plan JOB.yaml [--json] [--nodes=...]` runs offline and prints, per place, every term of
// spec/memory_plan.h's plan for the spec (bytes as PlanRankMemory computes them) and their total;
// a refused spec exits 3 naming the field. The real loomctl binary on the README's example job
// (CPU ranks) and on an accelerator job with offload to NVMe (host, device and NVMe tables).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "services/cli/job_spec_yaml.h"
#include "spec/job_spec_settings.h"
#include "spec/memory_plan.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

struct CliRun {
  int code;
  std::string output;  // stdout and stderr
};

CliRun Loomctl(const std::vector<std::string>& args) {
  static int n = 0;
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_plan_", n++, ".log");
  std::vector<std::string> argv = {testing::RunfilePath("services/cli/loomctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--cluster_dir=/nonexistent");  // plan must not need the service
  auto p = testing::Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, ""};
  const int status = p->Wait(absl::Seconds(30));
  return {testing::ExitCode(status), *ReadFile(log)};
}

spec::RankMemoryPlan PlanOf(const std::string& path) {
  absl::StatusOr<v1::JobSpec> job = cli::ReadJobSpecFile(path);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(*job);
  EXPECT_TRUE(in.ok()) << in.status();
  if (!in.ok()) return {};
  absl::StatusOr<spec::RankMemoryPlan> plan = spec::PlanRankMemory(*in);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : spec::RankMemoryPlan{};
}

// Every term of `terms` is a line "  <name> <bytes> <size> <formula>" of the text output, and the
// place's "total" line carries their sum (added here, not read from the plan).
void ExpectPlaceInText(const std::string& text, const std::string& title,
                       const std::vector<spec::MemoryTerm>& terms) {
  const size_t start = text.find(title + "\n");
  ASSERT_NE(start, std::string::npos) << title << " missing:\n" << text;
  int64_t sum = 0;
  for (const spec::MemoryTerm& t : terms) {
    const std::string line = absl::StrFormat("  %-36s %16d  %10s  ", t.name, t.bytes,
                                             spec::FormatBytes(t.bytes));
    EXPECT_NE(text.find(line, start), std::string::npos) << "no line '" << line << "':\n" << text;
    sum += t.bytes;
  }
  ASSERT_FALSE(terms.empty()) << title;
  EXPECT_NE(text.find(absl::StrFormat("  %-36s %16d", "total", sum), start), std::string::npos)
      << title << " total " << sum << ":\n"
      << text;
}

void ExpectPlaceInJson(const nlohmann::json& place, const std::vector<spec::MemoryTerm>& terms) {
  ASSERT_EQ(place["terms"].size(), terms.size()) << place.dump(1);
  int64_t sum = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    EXPECT_EQ(place["terms"][i]["name"], terms[i].name);
    EXPECT_EQ(place["terms"][i]["bytes"].get<int64_t>(), terms[i].bytes) << terms[i].name;
    EXPECT_EQ(place["terms"][i]["formula"], terms[i].formula);
    sum += terms[i].bytes;
  }
  EXPECT_EQ(place["total_bytes"].get<int64_t>(), sum);
}

nlohmann::json JsonOf(const std::string& output) {
  const size_t a = output.find('{'), b = output.rfind('}');
  if (a == std::string::npos || b == std::string::npos) return nlohmann::json();
  return nlohmann::json::parse(output.substr(a, b - a + 1), nullptr, false);
}

TEST(LoomctlPlanTest, ExampleJobOnCpuRanks) {
  const std::string path = testing::RunfilePath("examples/fortunes-llama/job.yaml");
  const spec::RankMemoryPlan plan = PlanOf(path);
  ASSERT_TRUE(plan.cpu_rank);
  ASSERT_FALSE(plan.host.empty());
  ASSERT_NE(plan.Find("parameters"), nullptr);

  CliRun text = Loomctl({"plan", path});
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("per-rank memory plan: 2 ranks, ZeRO stage 3, CPU ranks"),
            std::string::npos)
      << text.output;
  ExpectPlaceInText(text.output, "host memory per rank", plan.host);
  EXPECT_EQ(text.output.find("device memory per rank"), std::string::npos) << text.output;

  CliRun js = Loomctl({"plan", path, "--json"});
  ASSERT_EQ(js.code, 0) << js.output;
  const nlohmann::json j = JsonOf(js.output);
  ASSERT_TRUE(j.is_object()) << js.output;
  EXPECT_EQ(j["num_ranks"], 2);
  EXPECT_EQ(j["cpu_rank"], true);
  ExpectPlaceInJson(j["host"], plan.host);
  EXPECT_TRUE(j["device"]["terms"].empty());
}

TEST(LoomctlPlanTest, AcceleratorJobWithNvmeOffloadHasThreeTables) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/gpu_job.yaml");
  std::ofstream(path) << R"(name: nvme
model:
  config: {vocab_size: 32000, hidden_size: 1024, intermediate_size: 2816, num_hidden_layers: 8,
           num_attention_heads: 16, num_key_value_heads: 4, max_position_embeddings: 2048}
dataset: {name: fortunes, tokenizer: byte}
deepspeed_config:
  train_micro_batch_size_per_gpu: 1
  bf16: {enabled: true}
  zero_optimization:
    stage: 3
    offload_optimizer: {device: nvme, nvme_path: /local_nvme}
resources: {num_ranks: 4, accelerator: h100}
training: {steps: 10, sequence_length: 1024}
)";
  const spec::RankMemoryPlan plan = PlanOf(path);
  ASSERT_FALSE(plan.cpu_rank);
  CliRun text = Loomctl({"plan", path});
  ASSERT_EQ(text.code, 0) << text.output;
  ExpectPlaceInText(text.output, "host memory per rank", plan.host);
  ExpectPlaceInText(text.output, "device memory per rank", plan.device);
  ExpectPlaceInText(text.output, "NVMe per rank", plan.nvme);
}

// --nodes: the README's job fits two 1-slot 24 GiB workers and gets ZeRO-2 (it fits without
// parameter gathers); nodes that report no memory never refuse (as admission); a malformed value
// is refused naming the flag. (Refusals and every row of the table: spec:memory_fit_test,
// spec:technique_choice_test.)
TEST(LoomctlPlanTest, NodesGiveTheFitAndTheTechnique) {
  const std::string path = testing::RunfilePath("examples/fortunes-llama/job.yaml");
  CliRun fits = Loomctl({"plan", path, "--nodes=2:1:24"});
  ASSERT_EQ(fits.code, 0) << fits.output;
  EXPECT_NE(fits.output.find("on 2 node(s) of 1 slot(s), 24.00 GiB host: fits"),
            std::string::npos)
      << fits.output;
  EXPECT_NE(fits.output.find("technique: zero-2 (fits at ZeRO-2"), std::string::npos)
      << fits.output;
  EXPECT_NE(fits.output.find("  set deepspeed_config.zero_optimization.stage: 2"),
            std::string::npos)
      << fits.output;

  const spec::RankMemoryPlan plan = PlanOf(path);
  ASSERT_GT(plan.host_bytes(), 0);
  CliRun json = Loomctl({"plan", path, "--nodes=2:1:0", "--json"});
  ASSERT_EQ(json.code, 0) << json.output;
  const nlohmann::json j = JsonOf(json.output);
  ASSERT_TRUE(j.is_object()) << json.output;
  EXPECT_EQ(j["fits"], true);  // 0: memory not reported, never refuses

  CliRun bad = Loomctl({"plan", path, "--nodes=2:1"});
  EXPECT_EQ(bad.code, 3) << bad.output;
  EXPECT_NE(bad.output.find("--nodes: '2:1' is not COUNT:SLOTS:HOST_GIB"), std::string::npos)
      << bad.output;
}

// The plan of `spec` with `settings` written in (one rank's host bytes), or -1.
int64_t HostBytesWith(const std::string& path, const std::vector<std::string>& settings) {
  absl::StatusOr<v1::JobSpec> job = cli::ReadJobSpecFile(path);
  if (!job.ok() || !spec::ApplyJobSpecSettings(settings, &*job).ok()) return -1;
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(*job);
  if (!in.ok()) return -1;
  absl::StatusOr<spec::RankMemoryPlan> plan = spec::PlanRankMemory(*in);
  return plan.ok() ? plan->host_bytes() : -1;
}

// Nodes between a ZeRO-2 job's ZeRO-3 and ZeRO-2 needs (a decimal GiB): refused at its own
// stage 2, the suggestion's settings written into the spec fit, and the alternatives list says
// which techniques fit with what they cost. A rank fits a 1-slot node when its plan times 1.15
// (docs/scheduling.md, "Capacity at submission") is at most the node's memory.
TEST(LoomctlPlanTest, RefusalGivesTheSuggestionAsSettingsAndTheAlternatives) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/stage2.yaml");
  std::ofstream(path) << R"(name: stage2
model:
  config: {vocab_size: 256, hidden_size: 384, intermediate_size: 1024, num_hidden_layers: 4,
           num_attention_heads: 6, num_key_value_heads: 2, max_position_embeddings: 1024}
dataset: {name: fortunes, tokenizer: byte}
deepspeed_config: {train_micro_batch_size_per_gpu: 2, zero_optimization: {stage: 2}}
resources: {num_ranks: 2}
training: {steps: 10, sequence_length: 256}
)";
  const int64_t stage2 = HostBytesWith(path, {"deepspeed_config.zero_optimization.stage: 2"});
  const int64_t stage3 = HostBytesWith(path, {"deepspeed_config.zero_optimization.stage: 3"});
  ASSERT_GT(stage3, 0);
  ASSERT_LT(stage3, stage2);
  const double node_gib = (1.15 * stage3 + 1.15 * stage2) / 2 / double(int64_t{1} << 30);
  const int64_t node_bytes = std::llround(node_gib * double(int64_t{1} << 30));
  const std::string nodes = absl::StrFormat("--nodes=2:1:%.9f", node_gib);
  CliRun run = Loomctl({"plan", path, nodes, "--json"});
  ASSERT_EQ(run.code, 0) << run.output;
  const nlohmann::json j = JsonOf(run.output);
  ASSERT_TRUE(j.is_object()) << run.output;
  EXPECT_EQ(j["admission_margin"], 0.15);
  ASSERT_EQ(j["fits"], false) << run.output;
  ASSERT_TRUE(j.contains("suggestion")) << run.output;
  const std::vector<std::string> settings = j["suggestion"]["settings"];
  ASSERT_FALSE(settings.empty());
  const int64_t suggested = HostBytesWith(path, settings);
  EXPECT_EQ(suggested, j["suggestion"]["host_bytes"].get<int64_t>());
  EXPECT_LE(1.15 * suggested, node_bytes) << run.output;

  EXPECT_EQ(j["technique"]["name"], "zero-3") << run.output;
  bool saw_zero2 = false, saw_zero3 = false;
  for (const nlohmann::json& o : j["technique"]["options"]) {
    const std::vector<std::string> s = o["settings"];
    EXPECT_EQ(o["host_bytes"].get<int64_t>(), HostBytesWith(path, s)) << o.dump();
    EXPECT_EQ(o["fits"].get<bool>(), 1.15 * o["host_bytes"].get<int64_t>() <= node_bytes)
        << o.dump();
    EXPECT_FALSE(o["cost"].get<std::string>().empty()) << o.dump();
    saw_zero2 |= o["name"] == "zero-2";
    saw_zero3 |= o["name"] == "zero-3";
  }
  EXPECT_TRUE(saw_zero2 && saw_zero3) << run.output;

  CliRun text = Loomctl({"plan", path, nodes});
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("the techniques on these nodes"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("about 1.5x DDP's communication"), std::string::npos)
      << text.output;
}

TEST(LoomctlPlanTest, RefusedSpecNamesTheField) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/bad.yaml");
  std::ofstream(path) << R"(name: bad
model:
  config: {vocab_size: 256, hidden_size: 64, intermediate_size: 160, num_hidden_layers: 2,
           num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}
dataset: {name: fortunes, tokenizer: byte}
deepspeed_config: {train_micro_batch_size_per_gpu: 2, sequence_parallel_size: 3}
resources: {num_ranks: 2}
training: {steps: 10, sequence_length: 32}
)";
  CliRun bad = Loomctl({"plan", path});
  EXPECT_EQ(bad.code, 3) << bad.output;
  EXPECT_NE(bad.output.find("sequence_parallel_size"), std::string::npos) << bad.output;
  CliRun missing = Loomctl({"plan"});
  EXPECT_EQ(missing.code, 2) << missing.output;
}

}  // namespace
}  // namespace loom
