// Benchmark (not a test: tags manual): SuperOffload vs Loom's synchronous ZeRO-Offload on the same
// model, ranks and threads, alternating in one process, median of 3 runs each. Two shapes:
//   opt-heavy  hidden 512, 4 layers, seq 16, micro-batch 1, 1 rank: the synchronous optimizer is
//              >= 30% of the step (the first line per run prints the measured share);
//   example    examples/fortunes-llama's model and batch (hidden 384, 4 layers, seq 128,
//              micro-batch 8, 2 ranks, threads_per_rank 1), clipping 1.0 as written there.
// Step time: median over steps 3..N of each run (the first steps warm caches), then the median
// of the 3 runs. overlap_fraction: the mean of SuperOffload's per-step share of the optimizer's
// work done before FinishStep. rollback_rate: rolled-back speculative sub-group steps /
// speculative sub-group steps, with clipping on (the example's 1.0, active on these steps) and
// off (opt-heavy, clipping 0).
// Last line: superoffload_vs_offload speedup=<x> overlap_fraction=<y> rollback_rate=<z>
// (x, y: the opt-heavy shape; z: with clipping on, the example's; every figure is printed).
// Run: bazel test //worker/trainer:super_offload_bench --test_output=streamed
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Shape {
  std::string name;
  int hidden, intermediate, layers, heads, kv_heads, seq, micro, world, steps;
  double clipping;
};

std::string Spec(const std::string& name, const Shape& s, bool super) {
  const std::string path = WriteSpec(name, s.micro, s.steps);
  json spec = json::parse(*ReadText(path));
  json& cfg = spec["model"]["config"];
  cfg["hidden_size"] = s.hidden;
  cfg["intermediate_size"] = s.intermediate;
  cfg["num_hidden_layers"] = s.layers;
  cfg["num_attention_heads"] = s.heads;
  cfg["num_key_value_heads"] = s.kv_heads;
  cfg["max_position_embeddings"] = std::max(64, s.seq);
  json& ds = spec["deepspeed_config"];
  ds["gradient_accumulation_steps"] = 1;
  ds["gradient_clipping"] = s.clipping;
  json off = {{"device", "cpu"}};
  if (super) off = {{"device", "cpu"}, {"super_offload", true}, {"ratio", 1.0},
                    {"cpuadam_cores_perc", 1.0}};
  ds["zero_optimization"] = {{"stage", 3}, {"overlap_comm", true},
                             {"stage3_param_persistence_threshold", 0},
                             {"offload_optimizer", off}};
  spec["training"]["sequence_length"] = s.seq;
  spec["training"]["eval_batches"] = 1;
  spec["training"]["eval_every_steps"] = "0";
  spec["training"]["threads_per_rank"] = 1;
  spec["checkpoint"]["interval_steps"] = "0";
  std::ofstream(path) << spec.dump(2);
  return path;
}

struct Result {
  double step_s = 0, opt_share = 0, overlap = 0;
  int64_t speculated = 0, rolled_back = 0;
};

Result RunOnce(const std::string& name, const Shape& s, bool super) {
  GangResult g = RunGang(name, Spec(name, s, super), s.world, {});
  Result r;
  EXPECT_FALSE(g.timed_out) << name;
  std::vector<json> steps = g.Of(0, "step");
  EXPECT_EQ(static_cast<int>(steps.size()), s.steps) << name << " (see its stderr)";
  std::vector<double> t, share, overlap;
  for (size_t i = 2; i < steps.size(); ++i) {
    t.push_back(steps[i]["step_time_s"].get<double>());
    share.push_back(steps[i]["optimizer_s"].get<double>() / steps[i]["step_time_s"].get<double>());
    if (super) overlap.push_back(steps[i]["optimizer_overlap_fraction"].get<double>());
  }
  r.step_s = Median(t);
  r.opt_share = Median(share);
  double sum = 0;
  for (double o : overlap) sum += o;
  r.overlap = overlap.empty() ? 0 : sum / overlap.size();
  if (super && !steps.empty()) {
    r.speculated = steps.back()["speculated_sub_groups"].get<int64_t>();
    r.rolled_back = steps.back()["rollbacks_clip"].get<int64_t>() +
                    steps.back()["rollbacks_overflow"].get<int64_t>();
  }
  return r;
}

TEST(SuperOffloadBench, SpeedupOverlapAndRollbackRate) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // each trial's line as it finishes
  std::vector<Shape> shapes = {
      {"opt_heavy", 512, 1536, 4, 8, 2, 16, 1, 1, 10, 0.0},
      {"example", 384, 1024, 4, 6, 2, 128, 8, 2, 8, 1.0},
  };
  // LOOM_BENCH_SHAPES=opt_heavy runs one shape (on a loaded machine the example's steps can
  // outlast the gang deadline of gang_test_util.h).
  if (const char* only = std::getenv("LOOM_BENCH_SHAPES"); only != nullptr) {
    std::vector<Shape> keep;
    for (const Shape& s : shapes) {
      if (std::string(only).find(s.name) != std::string::npos) keep.push_back(s);
    }
    shapes = keep;
  }
  double speedup_heavy = 0, overlap_heavy = 0, rollback_clip = 0;
  for (const Shape& s : shapes) {
    std::vector<double> sync_t, super_t, share, overlap;
    int64_t spec = 0, rolled = 0;
    for (int trial = 0; trial < 3; ++trial) {
      Result a = RunOnce(absl::StrCat(s.name, "_sync_", trial), s, false);
      Result b = RunOnce(absl::StrCat(s.name, "_super_", trial), s, true);
      sync_t.push_back(a.step_s);
      super_t.push_back(b.step_s);
      share.push_back(a.opt_share);
      overlap.push_back(b.overlap);
      spec += b.speculated;
      rolled += b.rolled_back;
      std::printf("%s trial %d: sync step %.4f s (optimizer %.0f%% of it), superoffload step "
                  "%.4f s, overlap %.3f, %lld/%lld speculative sub-group steps rolled back\n",
                  s.name.c_str(), trial, a.step_s, 100 * a.opt_share, b.step_s, b.overlap,
                  static_cast<long long>(b.rolled_back), static_cast<long long>(b.speculated));
    }
    const double speedup = Median(sync_t) / std::max(Median(super_t), 1e-9);
    const double rate = spec == 0 ? 0 : double(rolled) / spec;
    std::printf("%s: sync %.4f s, superoffload %.4f s (medians of 3), speedup %.3f, sync "
                "optimizer share %.0f%%, overlap_fraction %.3f, rollback_rate %.3f (clipping "
                "%.1f)\n",
                s.name.c_str(), Median(sync_t), Median(super_t), speedup, 100 * Median(share),
                Median(overlap), rate, s.clipping);
    if (s.name == "opt_heavy") {
      speedup_heavy = speedup;
      overlap_heavy = Median(overlap);
    } else {
      rollback_clip = rate;
    }
  }
  std::printf("superoffload_vs_offload speedup=%.3f overlap_fraction=%.3f rollback_rate=%.3f\n",
              speedup_heavy, overlap_heavy, rollback_clip);
  std::fflush(stdout);
}

}  // namespace
