// spec/memory_plan.h against real loom-trainer processes (issue 48, "accuracy measured, not
// assumed"). Each configuration (ZeRO stage 0-3, offload_optimizer cpu, 1-2 ranks, activation
// checkpointing on/off, S 256 and 1024; bf16, ZenFlow, SuperOffload) trains a 7.3M-parameter Llama (H 384, I 1024, 4 layers,
// B 2) for 3 steps on CPU ranks over Gloo, and per rank two measurements are compared with the
// plan:
//   * model states: the peaks of param_bytes + grad_bytes + optimizer_state_bytes over the step
//     events (the engine's MemoryTracker, i.e. the sizes of the tensors it allocated) against
//     the plan's parameter, gradient and optimizer terms: within 10% (the issue's bound);
//   * overall: the process's peak resident set (ru_maxrss from wait4, the kernel's VmHWM of the
//     exited rank) against the plan's host total: within 15% (the issue's bound).
// The plan is computed from the same spec file the trainer reads; the references share no code
// with it. ru_maxrss of a posix_spawn'ed child is max(this test's own peak RSS at the spawn,
// the child's), and this test stays far below a trainer's, so it is the trainer's.
// The measured table (prediction, measured, error) is printed to the test log.
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/common.pb.h"
#include "spec/memory_plan.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using loom::trainer_test::Child;
using loom::trainer_test::Clock;
using loom::trainer_test::json;

constexpr int kSteps = 3;
constexpr double kModelStatesTolerance = 0.10;
constexpr double kOverallTolerance = 0.15;

struct Config {
  std::string name;
  int stage = 2;
  int world = 1;
  bool checkpointing = false;
  bool offload_cpu = false;
  int sequence_length = 256;
  // bench/memory_plan_grid.py's further rows: bf16, ZenFlow, SuperOffload.
  bool bf16 = false;
  bool zenflow = false;
  bool superoffload = false;
};

// The spec of `c` as protobuf's JSON mapping of loom.v1.JobSpec.
std::string SpecJson(const Config& c) {
  json spec = json::parse(R"({
    "name": "memory-plan",
    "model": {"config": {"architectures": ["LlamaForCausalLM"], "vocab_size": 256,
              "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 4,
              "num_attention_heads": 6, "num_key_value_heads": 2,
              "max_position_embeddings": 1024, "tie_word_embeddings": false}},
    "dataset": {"name": "fortunes", "tokenizer": "byte"},
    "deepspeed_config": {
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 2}},
    "training": {"sequence_length": 256, "seed": "7"}
  })");
  spec["deepspeed_config"]["zero_optimization"]["stage"] = c.stage;
  if (c.offload_cpu) {
    spec["deepspeed_config"]["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  }
  if (c.checkpointing) spec["deepspeed_config"]["activation_checkpointing"] = json::object();
  json& zero = spec["deepspeed_config"]["zero_optimization"];
  if (c.zenflow || c.superoffload) zero["offload_optimizer"] = {{"device", "cpu"}};
  if (c.zenflow) {
    zero["zenflow"] = {{"topk_ratio", 0.1}, {"update_interval", 4}, {"overlap_step", true}};
  }
  if (c.superoffload) zero["offload_optimizer"]["super_offload"] = true;
  if (c.bf16) spec["deepspeed_config"]["bf16"] = {{"enabled", true}};

  spec["resources"]["num_ranks"] = c.world;
  spec["training"]["sequence_length"] = c.sequence_length;
  spec["training"]["steps"] = std::to_string(kSteps);
  return spec.dump(2);
}

struct RankRun {
  std::vector<json> events;
  int exit_code = -1;
  int64_t max_rss_bytes = 0;  // ru_maxrss of the exited process
};

// Starts `world` ranks (rank 0 on port 0, the others on the port it reports), collects their
// events until every stdout closes or the deadline passes (then kills them all), and reaps each
// with wait4 for its peak resident set.
std::vector<RankRun> RunMeasured(const std::string& name, const std::string& spec, int world) {
  using namespace loom::trainer_test;  // NOLINT: test helpers
  const auto deadline = Clock::now() + std::chrono::seconds(kDeadlineSeconds);
  auto args = [&](int rank, int port) {
    return std::vector<std::string>{TrainerPath(), "--spec=" + spec,
                                    absl::StrCat("--rank=", rank),
                                    absl::StrCat("--world_size=", world),
                                    absl::StrCat("--master_port=", port),
                                    "--collective_timeout_s=60"};
  };
  std::vector<Child> kids;
  kids.push_back(Spawn(args(0, 0), absl::StrCat(TmpDir(), "/", name, ".rank0.stderr")));
  int port = 0;
  while (world > 1 && port == 0 && Clock::now() < deadline && !kids[0].eof) {
    Pump(kids[0], 100);
    for (const json& e : kids[0].events) {
      if (e["event"] == "rendezvous") port = e["port"].get<int>();
    }
  }
  for (int rank = 1; rank < world && port > 0; ++rank) {
    kids.push_back(
        Spawn(args(rank, port), absl::StrCat(TmpDir(), "/", name, ".rank", rank, ".stderr")));
  }
  EXPECT_EQ(static_cast<int>(kids.size()), world) << name << ": no rendezvous port";
  while (Clock::now() < deadline) {
    bool all_eof = true;
    for (Child& c : kids) {
      Pump(c, 20);
      all_eof = all_eof && c.eof;
    }
    if (all_eof) break;
  }
  if (Clock::now() >= deadline) {
    for (Child& c : kids) kill(c.pid, SIGKILL);
    ADD_FAILURE() << name << ": deadline of " << kDeadlineSeconds << " s passed; killed";
  }
  std::vector<RankRun> out;
  for (Child& c : kids) {
    int status = 0;
    rusage ru{};
    wait4(c.pid, &status, 0, &ru);
    RankRun r;
    r.events = c.events;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.max_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
    out.push_back(std::move(r));
  }
  return out;
}

int64_t MaxStepField(const RankRun& r, const std::string& field) {
  int64_t m = 0;
  for (const json& e : r.events) {
    if (e["event"] == "step" && e.contains(field)) m = std::max(m, e[field].get<int64_t>());
  }
  return m;
}

int64_t Term(const loom::spec::RankMemoryPlan& p, const std::string& name) {
  const loom::spec::MemoryTerm* t = p.Find(name);
  return t == nullptr ? 0 : t->bytes;
}

double RelErr(double predicted, double measured) {
  return measured == 0 ? 1.0 : (predicted - measured) / measured;
}

TEST(MemoryPlanTrainerTest, PlanMatchesMeasuredModelStatesAndPeakRss) {
  const std::vector<Config> configs = {
      {"z0_n1", 0, 1, false, false},        {"z1_n2", 1, 2, false, false},
      {"z2_n1", 2, 1, false, false},        {"z2_n1_ckpt", 2, 1, true, false},
      {"z2_n2", 2, 2, false, false},        {"z2_n1_offload", 2, 1, false, true},
      {"z3_n2", 3, 2, false, false},        {"z3_n2_ckpt", 3, 2, true, false},
      // Activations larger than the teardown's rise (kCpuTeardownBytes).
      {"z2_n1_s1024", 2, 1, false, false, 1024}, {"z2_n1_s1024_ckpt", 2, 1, true, false, 1024},
      {"z2_n1_bf16", 2, 1, false, false, 256, /*bf16=*/true},
      {"z2_n1_zenflow", 2, 1, false, false, 256, false, /*zenflow=*/true},
      {"z3_n1_superoffload", 3, 1, false, false, 256, false, false, /*superoffload=*/true},
      // Not asserted here: Ulysses (SP 2) and ALST tiling at S 1024, whose peak RSS the plan
      // under-predicts by 6-16% (bench/memory_plan_grid.py, docs/benchmarks.md "Memory planner
      // accuracy"): within the admission margin's 15% in the grid, not reliably within it here.
  };
  std::string table =
      "| config | rank | model states plan MiB | measured MiB | err | tracked peak plan MiB | "
      "peak_bytes MiB | peak RSS plan MiB | VmHWM MiB | err |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Config& c : configs) {
    const std::string text = SpecJson(c);
    const std::string path = absl::StrCat(loom::trainer_test::TmpDir(), "/", c.name, ".json");
    std::ofstream(path) << text;
    loom::v1::JobSpec spec;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &spec).ok()) << c.name;
    absl::StatusOr<loom::spec::MemoryPlanInput> in = loom::spec::MemoryPlanInputFromJobSpec(spec);
    ASSERT_TRUE(in.ok()) << c.name << ": " << in.status();
    absl::StatusOr<loom::spec::RankMemoryPlan> plan = loom::spec::PlanRankMemory(*in);
    ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
    const double states_plan =
        Term(*plan, "parameters") + Term(*plan, "persistent parameters") +
        Term(*plan, "gradients") + Term(*plan, "second gradient buffer") +
        Term(*plan, "optimizer states (Adam m, v)") +
        Term(*plan, "fp32 master weights");
    const double host_plan = plan->host_bytes();

    const std::vector<RankRun> runs = RunMeasured(c.name, path, c.world);
    ASSERT_EQ(static_cast<int>(runs.size()), c.world) << c.name;
    for (int rank = 0; rank < c.world; ++rank) {
      const RankRun& r = runs[rank];
      ASSERT_EQ(r.exit_code, 0) << c.name << " rank " << rank;
      int steps = 0;
      for (const json& e : r.events) steps += e["event"] == "step" ? 1 : 0;
      ASSERT_EQ(steps, kSteps) << c.name << " rank " << rank;
      const double states = MaxStepField(r, "param_bytes") + MaxStepField(r, "grad_bytes") +
                            MaxStepField(r, "optimizer_state_bytes");
      const double rss = r.max_rss_bytes;
      const double e_states = RelErr(states_plan, states);
      const double e_rss = RelErr(host_plan, rss);
      // Informational (not asserted): the tracker's peak of the sum, buffers included.
      const double tracked_plan = plan->tracked_bytes();
      const double tracked = MaxStepField(r, "peak_bytes");
      absl::StrAppendFormat(
          &table, "| %s | %d | %.1f | %.1f | %+.1f%% | %.1f | %.1f | %.1f | %.1f | %+.1f%% |\n",
          c.name, rank, states_plan / (1 << 20), states / (1 << 20), 100 * e_states,
          tracked_plan / (1 << 20), tracked / (1 << 20), host_plan / (1 << 20), rss / (1 << 20),
          100 * e_rss);
      EXPECT_LE(std::abs(e_states), kModelStatesTolerance)
          << c.name << " rank " << rank << ": model states planned " << states_plan
          << " B, measured " << states << " B";
      EXPECT_LE(std::abs(e_rss), kOverallTolerance)
          << c.name << " rank " << rank << ": host total planned " << host_plan
          << " B, measured VmHWM " << rss << " B";
    }
  }
  std::printf("%s", table.c_str());
}

}  // namespace
