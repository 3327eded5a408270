// ZeRO stages 0-3 end to end with real loom-trainer processes over Gloo on loopback, the rows
// that need gangs of their own (the shared every-(stage, world) runs are zero_stages_test.cc):
//   Row5 (rank-divergent collectives fail within the collective timeout instead of hanging),
//   Row6 (uneven sequence lengths per rank keep collective sequences equal), Row7 (a module
//   order change drops the prefetch trace; results equal the no-prefetch run bit for bit),
//   Row8 (after the first micro-step, stage-3 fetches are served by prefetch, not by blocking
//   gathers), Row9 (the offloaded optimizer step runs per sub-group and the sub-group size
//   does not change results), tied embeddings (one parameter, two gradient contributions) on
//   every stage, fp16 dynamic loss scaling (§1.11 #8) and fp16 on every stage, the per-step
//   communication volume (§1.2) and the key policy (warnings, partial offload refused at engine
//   start). Each test is independent (no shared runs), so the target is sharded.
// Every gang has a deadline; on expiry all children are killed and the test fails.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"
#include "worker/trainer/zero_stages_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

// Stage 3 with prefetching vs without, when the module order changes at step 3 (one layer
// skipped, or the two layers swapped) on every rank: the trace is dropped (no hang), and the
// results equal the no-prefetch run bit for bit.
TEST(ZeroStagesTraceTest, Row7_BrokenPrefetchTraceFallsBackWithIdenticalResults) {
  const json prefetch = Knobs(3, 1);
  json none = {{"stage", 3},
               {"reduce_bucket_size", 20000},
               {"overlap_comm", true},
               {"stage3_prefetch_bucket_size", 0},
               {"stage3_param_persistence_threshold", 0},
               {"stage3_max_reuse_distance", 0}};
  // The normal module order (the same for both cases below): run once.
  GangResult normal_run = RunGang("normal", Spec("normal", 2, 3, none), 2, {});
  ExpectSuccess(normal_run, "normal");
  const std::vector<double> normal = Losses(normal_run, "step");
  ASSERT_EQ(normal.size(), 3u);
  for (const std::string order : {"3:1", "3:1,0"}) {
    const std::string tag = order == "3:1" ? "skip" : "swap";
    const std::string a = "trace_" + tag, b = "notrace_" + tag;
    GangResult with = RunGang(a, Spec(a, 2, 5, prefetch), 2,
                              {"--checkpoint_dir=" + Dir(a), "--test_layer_order=" + order});
    GangResult without = RunGang(b, Spec(b, 2, 5, none), 2,
                                 {"--checkpoint_dir=" + Dir(b), "--test_layer_order=" + order});
    ExpectSuccess(with, a);
    ExpectSuccess(without, b);
    ExpectSameCollectives(with, a);
    std::vector<double> la = Losses(with, "step"), lb = Losses(without, "step");
    ASSERT_EQ(la.size(), 5u);
    EXPECT_EQ(la, lb) << tag << ": prefetching changed the losses";
    const std::string step5 = "/" + loom::storage::StepDirName(5);
    for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
      auto x = Reassemble(Dir(a) + step5, 2, section), y = Reassemble(Dir(b) + step5, 2, section);
      ASSERT_EQ(x.size(), ParamNumels().size());
      for (const auto& [pname, v] : x) EXPECT_EQ(v, y[pname]) << tag << " " << section << pname;
    }
    const json last = with.Of(0, "step").back();
    EXPECT_GT(last["prefetch_hits"].get<int64_t>(), 0) << tag;
    // Step 3 deviates from the step-2 trace; step 4 deviates from the trace recorded in step 3.
    EXPECT_GE(last["trace_invalidations"].get<int64_t>(), 2) << tag;
    EXPECT_EQ(with.Of(0, "step")[1]["trace_invalidations"].get<int64_t>(), 0) << tag;
    EXPECT_EQ(without.Of(0, "step").back()["prefetch_hits"].get<int64_t>(), 0) << tag;
    // The order change really changed the computation at step 3 (vs the normal order run).
    EXPECT_EQ(normal[1], lb[1]);
    EXPECT_GT(std::abs(normal[2] - lb[2]), 1e-4) << tag;
  }
}

// Stage 3 steady state: once the trace is recorded, every fetch of a training micro-step is
// served by a prefetch (or a kept/persistent parameter), not by a blocking on-demand gather.
TEST(ZeroStagesTraceTest, Row8_Stage3FetchesAreServedByPrefetchNotBlockingGathers) {
  json zero = {{"stage", 3},
               {"stage3_prefetch_bucket_size", 20000},
               {"stage3_param_persistence_threshold", 100},
               {"stage3_max_reuse_distance", 0}};
  GangResult r = RunGang("prefetch", Spec("prefetch", 2, 4, zero), 2, {});
  ExpectSuccess(r, "prefetch");
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<json> steps = r.Of(rank, "step");
    ASSERT_EQ(steps.size(), 4u);
    // Step 1: micro-step 0 records (on demand), micro-step 1 replays.
    EXPECT_GT(steps[0]["prefetch_hits"].get<int64_t>(), 0);
    EXPECT_EQ(steps[3]["on_demand_fetches"], steps[0]["on_demand_fetches"])
        << "blocking gathers after the trace was recorded";
    EXPECT_GT(steps[3]["prefetch_hits"].get<int64_t>(), steps[0]["prefetch_hits"].get<int64_t>());
    EXPECT_EQ(steps[3]["trace_invalidations"].get<int64_t>(), 0);
  }
}

// A collective sequence that differs between ranks (rank 1 skips a layer at step 2) must end
// in an error within the collective timeout, not in a hang.
TEST(ZeroStagesCollectiveTest, Row5_RankDivergentCollectivesFailWithinTheTimeout) {
  const auto t0 = Clock::now();
  GangResult r = RunGang("divergent", Spec("divergent", 2, 4, Knobs(3, 1)), 2, {}, 0,
                         {{}, {"--test_layer_order=2:0"}}, /*collective_timeout_s=*/10);
  EXPECT_FALSE(r.timed_out);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(secs, 60.0);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.exit_codes[rank], 0) << rank;
    EXPECT_TRUE(r.Of(rank, "done").empty()) << rank;
  }
  std::cout << "divergent ranks failed after " << secs << " s\n";
}

// Uneven data: rank 1 trains on 12-token samples, rank 0 on 32 (ranks "stop at different
// lengths"); the collective sequence is shape-independent by construction, so every stage
// finishes with identical collective sequences (a data-dependent collective would hang into
// the 20 s collective timeout and fail).
TEST(ZeroStagesCollectiveTest, Row6_UnevenSequenceLengthsKeepCollectiveSequencesEqual) {
  for (int stage : {0, 2, 3}) {
    const std::string name = absl::StrCat("uneven_s", stage);
    GangResult r = RunGang(name, Spec(name, 2, 3, Knobs(stage, 1)), 2, {}, 0,
                           {{}, {"--test_rank_sequence_length=12"}}, /*collective_timeout_s=*/20);
    ExpectSuccess(r, name);
    ExpectSameCollectives(r, name);
    EXPECT_EQ(r.Of(0, "step").size(), 3u);
    EXPECT_EQ(r.Of(1, "step").size(), 3u);
  }
}

// The optimizer step runs per sub-group (ApplyOptimizerStep); the sub-group size only changes
// how the partitions are grouped, not the result (bit-exact).
TEST(ZeroStagesOptimizerTest, Row9_SubGroupSizeDoesNotChangeResults) {
  std::vector<std::vector<double>> losses;
  std::vector<std::map<std::string, std::vector<float>>> params;
  for (int64_t sub : {1000000000LL, 5000LL, 1LL}) {
    const std::string name = absl::StrCat("subgroup_", sub);
    // With the optimizer offloaded (CpuAdam over host-memory state), where sub-groups are the
    // units of the step; in memory each partition is updated on its own anyway.
    json zero = {{"stage", 2}, {"sub_group_size", sub}, {"offload_optimizer", {{"device", "cpu"}}}};
    GangResult r = RunGang(name, Spec(name, 2, 3, zero), 2, {"--checkpoint_dir=" + Dir(name)});
    ExpectSuccess(r, name);
    losses.push_back(Losses(r, "step"));
    params.push_back(Reassemble(Dir(name) + "/" + loom::storage::StepDirName(3), 2,
                                "fp32_params"));
  }
  for (size_t i = 1; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i], losses[0]);
    EXPECT_EQ(params[i], params[0]);
  }
}

// Tied embedding/head: the shared parameter gets two gradient contributions per backward; stages
// 0/1 must reduce it once, after the second. Every stage equals the 1-rank run.
TEST(ZeroStagesTiedTest, TiedEmbeddingsEqualAcrossStages) {
  auto tied_spec = [](const std::string& name, int world, int stage) {
    json spec = json::parse(*ReadText(Spec(name, world, 3, Knobs(stage, 1))));
    spec["model"]["config"]["tie_word_embeddings"] = true;
    const std::string path = TmpDir() + "/" + name + ".tied.spec.json";
    std::ofstream(path) << spec.dump(2);
    return path;
  };
  GangResult ref = RunGang("tied_ref", tied_spec("tied_ref", 1, 0), 1, {});
  ExpectSuccess(ref, "tied_ref");
  const std::vector<double> want = Losses(ref, "step");
  ASSERT_EQ(want.size(), 3u);
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = absl::StrCat("tied_s", stage);
    GangResult r = RunGang(name, tied_spec(name, 2, stage), 2, {});
    ExpectSuccess(r, name);
    std::vector<double> got = Losses(r, "step");
    ASSERT_EQ(got.size(), 3u) << name;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(got[i], want[i], kLossRtol * want[i]) << name << " step " << i + 1;
    }
    EXPECT_GT(r.Of(0, "step")[2]["grad_norm"].get<double>(), 0);
    EXPECT_NEAR(r.Of(0, "step")[2]["grad_norm"].get<double>(),
                ref.Of(0, "step")[2]["grad_norm"].get<double>(),
                kLossRtol * ref.Of(0, "step")[2]["grad_norm"].get<double>())
        << name;
  }
}

// fp16 dynamic loss scaling (DeepSpeed DynamicLossScaler; §0, §1.11 #8): initial scale 2^8,
// window 2, hysteresis 2; rank 0 injects +inf into a gradient at steps 3 and 4.
//   step:        1    2    3     4     5    6    7
//   scale used:  256  256  512   512   256  256  512   (doubles after 2 clean iterations)
//   overflow:    -    -    yes   yes   -    -    -     (first uses up hysteresis, second halves)
// Skipped steps leave params, optimizer state, the optimizer step count and the LR schedule
// untouched; resuming after the skips reproduces the rest bit for bit.
TEST(ZeroStagesPrecisionTest, Fp16OverflowSkipsTheStepAndAdjustsTheLossScale) {
  const json fp16 = {{"fp16",
                      {{"enabled", true},
                       {"initial_scale_power", 8},
                       {"loss_scale_window", 2},
                       {"hysteresis", 2}}}};
  const std::string spec = Spec("fp16", 2, 7, Knobs(2, 1), fp16, /*checkpoint_interval=*/1);
  GangResult r = RunGang("fp16", spec, 2,
                         {"--checkpoint_dir=" + Dir("fp16"), "--test_inject_inf_grad_steps=3,4"});
  ExpectSuccess(r, "fp16");
  const std::vector<double> want_scale = {256, 256, 512, 512, 256, 256, 512};
  const std::vector<bool> want_skip = {false, false, true, true, false, false, false};
  const std::vector<int64_t> want_opt = {1, 2, 2, 2, 3, 4, 5};
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<json> steps = r.Of(rank, "step");
    ASSERT_EQ(steps.size(), 7u);
    for (size_t i = 0; i < 7; ++i) {
      EXPECT_EQ(steps[i]["loss_scale"].get<double>(), want_scale[i]) << rank << " step " << i + 1;
      EXPECT_EQ(steps[i]["skipped"].get<bool>(), want_skip[i]) << rank << " step " << i + 1;
      EXPECT_EQ(steps[i]["optimizer_step"].get<int64_t>(), want_opt[i]) << rank << " " << i + 1;
      EXPECT_TRUE(std::isfinite(steps[i]["loss"].get<double>()));
    }
    // The schedule did not advance over the skipped steps.
    EXPECT_EQ(steps[2]["lr"], steps[4]["lr"]);
    EXPECT_NE(steps[1]["lr"], steps[2]["lr"]);
  }
  auto dir = [](int s) { return Dir("fp16") + "/" + loom::storage::StepDirName(s); };
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto s2 = Reassemble(dir(2), 2, section), s3 = Reassemble(dir(3), 2, section),
         s4 = Reassemble(dir(4), 2, section), s5 = Reassemble(dir(5), 2, section);
    ASSERT_EQ(s2.size(), ParamNumels().size());
    EXPECT_EQ(s3, s2) << section << " changed by the skipped step 3";
    EXPECT_EQ(s4, s2) << section << " changed by the skipped step 4";
    EXPECT_NE(s5, s2) << section << " not updated by step 5";
  }
  auto m4 = loom::storage::ReadManifest(dir(4), 0);
  ASSERT_TRUE(m4.ok());
  EXPECT_EQ(m4->optimizer_step, 2);
  // Resume after the skips: the loss-scaler state comes back with the checkpoint.
  GangResult resumed = RunGang("fp16_resumed", spec, 2,
                               {"--checkpoint_dir=" + Dir("fp16_resumed"),
                                "--resume_from=" + dir(4)});
  ExpectSuccess(resumed, "fp16_resumed");
  std::vector<json> a = r.Of(0, "step"), b = resumed.Of(0, "step");
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b[i]["loss"], a[i + 4]["loss"]) << "step " << i + 5;
    EXPECT_EQ(b[i]["loss_scale"], a[i + 4]["loss_scale"]) << "step " << i + 5;
  }
  // Regression (break-it pass, 2026-12-05): loss_scaler.json was read without any check, and a
  // scale of 0 resumed into NaN weights with exit 0. It is listed in rank 0's manifest (size,
  // CRC-32), and its values are checked even where the manifest does not list it (older
  // checkpoints): both refusals are DATA_LOSS naming the file.
  auto m0 = loom::storage::ReadManifest(dir(4), 0);
  ASSERT_TRUE(m0.ok());
  ASSERT_EQ(m0->side_files.size(), 1u);
  EXPECT_EQ(m0->side_files[0].name, "loss_scaler.json");
  const std::string copy = Dir("fp16_scaler_copy");
  std::filesystem::copy(dir(4), copy, std::filesystem::copy_options::recursive);
  const std::string scaler = copy + "/loss_scaler.json";
  std::ofstream(scaler, std::ios::trunc)
      << R"({"cur_hysteresis":2,"cur_iter":4,"last_overflow_iter":3,"scale":0.0})";
  auto expect_refused = [&](const std::string& name, const std::string& why) {
    GangResult bad = RunGang(name, spec, 2, {"--resume_from=" + copy});
    ASSERT_FALSE(bad.timed_out) << name;
    EXPECT_EQ(bad.exit_codes[0], loom::kTrainerExitDataError) << name;
    std::vector<json> errors = bad.Of(0, "error");
    ASSERT_EQ(errors.size(), 1u) << name;
    const std::string message = errors[0]["message"].get<std::string>();
    EXPECT_NE(message.find(scaler), std::string::npos) << message;
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_TRUE(bad.Of(0, "step").empty()) << name;
  };
  expect_refused("fp16_scaler_crc", "manifest says");  // its size or CRC-32
  const std::string mf = copy + "/rank_0.manifest.json";
  std::ifstream in(mf);
  json m = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  m.erase("side_files");
  std::ofstream(mf, std::ios::trunc) << m.dump(1);
  expect_refused("fp16_scaler_zero", "\"scale\" 0 is not a positive finite number");
  std::ofstream(scaler, std::ios::trunc)
      << R"({"cur_hysteresis":2,"cur_iter":4,"last_overflow_iter":3,"scale":"abc"})";
  expect_refused("fp16_scaler_type", "\"scale\" is missing or not a number");
}

// fp16 weights on every stage (fp32 activations on CPU): trains, no overflow at the default
// initial scale 2^16 for this model, loss trajectories within fp16 noise of each other.
TEST(ZeroStagesPrecisionTest, Fp16TrainsOnEveryStage) {
  std::vector<double> first;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = absl::StrCat("fp16_s", stage);
    GangResult r = RunGang(name, Spec(name, 2, 3, Knobs(stage, 1), {{"fp16", {{"enabled", true}}}}),
                           2, {});
    ExpectSuccess(r, name);
    ExpectSameCollectives(r, name);
    std::vector<double> loss = Losses(r, "step");
    ASSERT_EQ(loss.size(), 3u) << name;
    for (const json& e : r.Of(0, "step")) {
      EXPECT_FALSE(e["skipped"].get<bool>()) << name;
      EXPECT_EQ(e["loss_scale"].get<double>(), 65536.0) << name;
    }
    if (first.empty()) first = loss;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(loss[i], first[i], 1e-2 * first[i]) << name;
  }
}

// Communication volume per step (§1.2, §1.11 #6), GAS 1, no persistence or reuse, counted as
// ZeRO does (all-gather / reduce-scatter: N*p elements, all-reduce: 2x its size). With
// G = Σ N*ceil(n_i/N) (= Ψ + padding):
//   stage 0:   all-reduce of the gradients                      2Ψ
//   stage 1/2: reduce-scatter G + all-gather of the update G    2G  (≈ 2Ψ: no extra traffic)
//   stage 3:   forward gathers G + backward gathers G - N*p(embedding; its backward needs no
//              weight) + reduce-scatter G                       ≈ 3Ψ (1.5x data parallelism)
//              (from step 2 on, with the trace: minus lm_head's backward gather, reused at
//              distance 0)
// plus the scalar all-reduces of the step (loss mean, and the gradient norm when partitioned:
// 2 elements each).
TEST(ZeroStagesCommunicationTest, StepVolumeMatchesZeroAccounting) {
  const int world = 2;
  const int64_t psi = Psi();
  const int64_t g = world * PartitionElems(world);
  const int64_t embed = world * ((256 * 64 + world - 1) / world);
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = absl::StrCat("volume_s", stage);
    json zero = {{"stage", stage},
                 {"reduce_bucket_size", 20000},
                 {"stage3_param_persistence_threshold", 0},
                 {"stage3_max_reuse_distance", 0}};
    GangResult r = RunGang(name, Spec(name, world, 2, zero, {{"gradient_accumulation_steps", 1}}),
                           world, {});
    ExpectSuccess(r, name);
    const int64_t want = stage == 0 ? 2 * psi + 2
                         : stage < 3 ? 2 * g + 4
                                     : 3 * g - embed + 4;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<json> steps = r.Of(rank, "step");
      ASSERT_EQ(steps.size(), 2u);
      EXPECT_EQ(steps[0]["comm_elements"].get<int64_t>(), want) << name << " rank " << rank;
      // Step 2 replays step 1's trace: lm_head, used last in forward and first in backward
      // (reuse distance 0), is not gathered again.
      EXPECT_EQ(steps[1]["comm_elements"].get<int64_t>(), stage == 3 ? want - embed : want)
          << name << " rank " << rank;
    }
    std::cout << "stage " << stage << ": " << double(want) / psi << " x Ψ per step\n";
  }
}

// Keys Loom accepts but does not implement are "warning" events naming the key; partial offload
// (offload_optimizer.ratio < 1) is refused when the trainer parses the spec (as at submission),
// with an error naming the key.
TEST(ZeroStagesKeyPolicyTest, WarningsAndOffloadRefusal) {
  json zero = {{"stage", 2}, {"round_robin_gradients", true}};
  GangResult r = RunGang("warn", Spec("warn", 1, 1, zero, {{"wall_clock_breakdown", true}}), 1,
                         {});
  ExpectSuccess(r, "warn");
  std::string all;
  for (const json& w : r.Of(0, "warning")) all += w["message"].get<std::string>() + "\n";
  EXPECT_NE(all.find("deepspeed_config.zero_optimization.round_robin_gradients: ignored"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("deepspeed_config.wall_clock_breakdown: ignored"), std::string::npos);

  // Offload itself is implemented (worker/engine/offload); partial offload is not.
  json off = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}};
  GangResult o = RunGang("offload", Spec("offload", 1, 1, off), 1, {});
  EXPECT_EQ(o.exit_codes[0], loom::kTrainerExitConfigError);  // a configuration error: no restart
  std::vector<json> errors = o.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find(
                "deepspeed_config.zero_optimization.offload_optimizer.ratio"),
            std::string::npos);
}

}  // namespace
