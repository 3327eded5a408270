// ZenFlow (zero_optimization.zenflow) end to end with real loom-trainer processes, 2 ranks over
// Gloo on loopback, the tiny Llama of gang_test_util.h:
//   * WarmUpCoveringEveryStepEqualsZeroOffload: full_warm_up_rounds >= steps gives the losses and
//     checkpointed parameters and moments of synchronous ZeRO-Offload bit for bit, stages 1-3.
//   * TrainsOnEveryStageAndBf16: topk 0.25, select every 2 steps, update every 2, overlap on:
//     stages 1, 2, 3 agree with each other (fp32 reduction order only), bf16 trains, the held-out
//     loss falls, and the step events carry the ZenFlow metrics (interval, mass, bytes).
//   * HostAccumulationEqualsTheFusedPassBitForBit: overlap_step's accumulation on the host thread,
//     after FinishStep and before the next backward, against the training thread's fused pass
//     (--test_zenflow_fused_accumulation), stages 1 and 3: losses and checkpoints bit for bit.
//   * OneRankDeferredSelectiveUpdateEqualsTheFusedPassBitForBit: on one rank the selective
//     update runs on the host thread while the next forward starts, fenced per parameter;
//     against the fused pass, stages 1-3: losses and checkpoints bit for bit.
//   * ResumeIsBitForBit: save at step 3 (a CPU step in flight) -> resume -> steps 4-6 and the
//     step-6 checkpoint equal the uninterrupted run's bit for bit; the state file is required.
//   * Fp16InjectedInfSkipsTheStepOnBothSides: fp16 with an inf injected into rank 0's gradient
//     at step 3 (selection live, an interval half accumulated): the step is skipped, the loss
//     scale halves, and the parameters, moments and ZenFlow's whole state (device-side selective
//     moments, host accumulators, CPU copy) equal step 2's bit for bit; step 4 trains again.
//   * FinalEvalSeesTheLastCpuUpdate: the final held-out loss and final_logits.json are computed
//     from the weights the final checkpoint holds (after the last CPU result is flushed):
//     the checkpoint, consolidated to Hugging Face safetensors, initialises a plain job that
//     trains one step at lr 0 and must compute the same logits (regression: at stages 1-2 the
//     replicas were not refreshed after the final flush).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

std::string Dir(const std::string& name) { return TmpDir() + "/ckpt_" + name; }

std::string Spec(const std::string& name, int steps, const json& zero, bool bf16 = false,
                 int checkpoint_interval = 3) {
  const std::string path = WriteSpec(name, 2, steps);
  json spec = json::parse(*ReadText(path));
  spec["deepspeed_config"]["zero_optimization"] = zero;
  if (bf16) spec["deepspeed_config"]["bf16"] = {{"enabled", true}};
  spec["checkpoint"]["interval_steps"] = std::to_string(checkpoint_interval);
  std::ofstream(path) << spec.dump(2);
  return path;
}

json Zero(int stage, const json& zenflow) {
  json z = {{"stage", stage},
            {"overlap_comm", stage != 1},
            {"reduce_bucket_size", 20000},
            {"offload_optimizer", {{"device", "cpu"}}}};
  if (!zenflow.is_null()) z["zenflow"] = zenflow;
  return z;
}

GangResult RunJob(const std::string& name, const std::string& spec,
               std::vector<std::string> extra = {}, int world = 2) {
  extra.push_back("--checkpoint_dir=" + Dir(name));
  GangResult r = RunGang(name, spec, world, extra);
  EXPECT_FALSE(r.timed_out) << name;
  for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0) << name << " rank " << rank << " (see " << name << ".rank"
                                     << rank << ".stderr)";
  }
  return r;
}

void ExpectSameSections(const std::string& a, const std::string& b, const std::string& what,
                        int world = 2) {
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto x = Reassemble(a, world, section);
    auto y = Reassemble(b, world, section);
    ASSERT_FALSE(x.empty()) << what;
    for (const auto& [pname, v] : x) {
      EXPECT_EQ(v, y[pname]) << what << ": " << section << " " << pname << " not bit-equal";
    }
  }
}

TEST(ZenFlowTrainerTest, WarmUpCoveringEveryStepEqualsZeroOffload) {
  const std::string last = "/" + loom::storage::StepDirName(4);
  for (int stage = 1; stage <= 3; ++stage) {
    const std::string off = absl::StrCat("offload_s", stage), zf = absl::StrCat("warm_s", stage);
    GangResult a = RunJob(off, Spec(off, 4, Zero(stage, nullptr)));
    GangResult b = RunJob(zf, Spec(zf, 4, Zero(stage, {{"full_warm_up_rounds", 4},
                                                    {"topk_ratio", 0.5},
                                                    {"select_strategy", "step"},
                                                    {"select_interval", 2},
                                                    {"update_interval", 2},
                                                    {"overlap_step", true}})));
    EXPECT_EQ(Losses(a, "step"), Losses(b, "step")) << "stage " << stage;
    EXPECT_EQ(Losses(a, "eval"), Losses(b, "eval")) << "stage " << stage;
    ExpectSameSections(Dir(off) + last, Dir(zf) + last, absl::StrCat("stage ", stage));
  }
}

json ZenFlowBlock() {
  return {{"topk_ratio", 0.25},      {"select_strategy", "step"}, {"select_interval", 2},
          {"update_interval", 2},    {"overlap_step", true},      {"full_warm_up_rounds", 1},
          {"pt_reserved_cores_perc", 0.5}};
}

TEST(ZenFlowTrainerTest, TrainsOnEveryStageAndBf16) {
  std::vector<std::vector<double>> losses;
  for (int stage = 1; stage <= 3; ++stage) {
    const std::string name = absl::StrCat("zf_s", stage);
    GangResult r = RunJob(name, Spec(name, 6, Zero(stage, ZenFlowBlock())));
    losses.push_back(Losses(r, "step"));
    ASSERT_EQ(losses.back().size(), 6u) << name;
    const std::vector<double> eval = Losses(r, "eval");
    ASSERT_GE(eval.size(), 2u);
    EXPECT_LT(eval.back(), eval.front()) << name;
    // Metrics: steps 3 and 5 close 2-step intervals (warm-up 1); bytes grow; mass in (0, 1].
    std::vector<json> steps = r.Of(0, "step");
    int64_t last_bytes = -1;
    for (size_t s = 0; s < steps.size(); ++s) {
      const int64_t bytes = steps[s]["zenflow_bytes_moved"].get<int64_t>();
      EXPECT_GT(bytes, last_bytes) << name << " step " << s + 1;
      last_bytes = bytes;
      if (s >= 1) {
        const double mass = steps[s]["zenflow_selected_mass_fraction"].get<double>();
        EXPECT_GT(mass, 0.0) << name;
        EXPECT_LE(mass, 1.0) << name;
      }
    }
    EXPECT_EQ(steps[2]["zenflow_update_interval"].get<int64_t>(), 2) << name;
    EXPECT_GE(steps[2]["zenflow_stall_s"].get<double>(), 0.0) << name;
  }
  for (size_t s = 1; s < losses.size(); ++s) {
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_NEAR(losses[s][i], losses[0][i], 1e-4 * std::fabs(losses[0][i]))
          << "stage " << s + 1 << " step " << i + 1;
    }
  }
  GangResult bf = RunJob("zf_bf16", Spec("zf_bf16", 6, Zero(2, ZenFlowBlock()), /*bf16=*/true));
  std::vector<double> bl = Losses(bf, "step");
  ASSERT_EQ(bl.size(), 6u);
  for (double l : bl) EXPECT_TRUE(std::isfinite(l));
  const std::vector<double> beval = Losses(bf, "eval");
  ASSERT_GE(beval.size(), 2u);
  EXPECT_LT(beval.back(), beval.front());
}

// The host thread's accumulation (overlap_step) reads the gradients after FinishStep returns, and
// the trainer clears them only after ReleaseGradients, before the next backward; stages 1-2 zero
// them there and stage 3 lets the next reduction overwrite them. Against the training thread's
// fused pass, the same arithmetic in the same order, the losses and the checkpointed parameters
// and moments are equal bit for bit; a gradient cleared or overwritten while the host thread
// still reads it would change them.
TEST(ZenFlowTrainerTest, HostAccumulationEqualsTheFusedPassBitForBit) {
  for (int stage : {1, 3}) {
    const std::string host = absl::StrCat("zf_host_s", stage);
    const std::string fused = absl::StrCat("zf_fused_s", stage);
    json zfb = ZenFlowBlock();
    zfb["full_warm_up_rounds"] = 0;
    const std::string spec = Spec(host, 7, Zero(stage, zfb), false, 7);
    GangResult a = RunJob(host, spec);
    GangResult b = RunJob(fused, spec, {"--test_zenflow_fused_accumulation"});
    ASSERT_EQ(Losses(a, "step").size(), 7u) << host;
    EXPECT_EQ(Losses(a, "step"), Losses(b, "step")) << "stage " << stage;
    EXPECT_EQ(Losses(a, "eval"), Losses(b, "eval")) << "stage " << stage;
    const std::string step7 = "/" + loom::storage::StepDirName(7);
    ExpectSameSections(Dir(host) + step7, Dir(fused) + step7, absl::StrCat("stage ", stage));
  }
}

// One rank with fp32 parameters: forward reads the masters themselves, so the selective update
// runs on the host thread after FinishStep and each parameter's first read in the next forward
// waits for its own update (the provider's master fence; zenflow_pipeline.h, defer_selective).
// Against the training thread's fused pass (everything in FinishStep), stages 1-3: the step and
// evaluation losses (an evaluation every 3 steps reads the parameters between steps) and the
// checkpoints of steps 3 and 6 (written between steps) and 7 (after the final flush) are equal
// bit for bit. A forward that read a master before its update finished, or a checkpoint that
// read one mid-update, would differ (checked: without the fence the losses differ from step 2).
TEST(ZenFlowTrainerTest, OneRankDeferredSelectiveUpdateEqualsTheFusedPassBitForBit) {
  for (int stage : {1, 2, 3}) {
    const std::string deferred = absl::StrCat("zf_1rank_deferred_s", stage);
    const std::string fused = absl::StrCat("zf_1rank_fused_s", stage);
    json zfb = ZenFlowBlock();
    zfb["full_warm_up_rounds"] = 0;
    const std::string path = Spec(deferred, 7, Zero(stage, zfb), false, 3);
    json spec = json::parse(*ReadText(path));
    spec["training"]["eval_every_steps"] = "3";
    std::ofstream(path) << spec.dump(2);
    GangResult a = RunJob(deferred, path, {}, 1);
    GangResult b = RunJob(fused, path, {"--test_zenflow_fused_accumulation"}, 1);
    ASSERT_EQ(Losses(a, "step").size(), 7u) << deferred;
    EXPECT_EQ(Losses(a, "step"), Losses(b, "step")) << "stage " << stage;
    ASSERT_GE(Losses(a, "eval").size(), 3u) << deferred;
    EXPECT_EQ(Losses(a, "eval"), Losses(b, "eval")) << "stage " << stage;
    for (int step : {3, 6, 7}) {
      const std::string dir = "/" + loom::storage::StepDirName(step);
      ExpectSameSections(Dir(deferred) + dir, Dir(fused) + dir,
                         absl::StrCat("stage ", stage, " step ", step), 1);
    }
  }
}

TEST(ZenFlowTrainerTest, ResumeIsBitForBit) {
  const std::string step3 = "/" + loom::storage::StepDirName(3);
  const std::string step6 = "/" + loom::storage::StepDirName(6);
  json zfb = ZenFlowBlock();
  zfb["select_interval"] = 4;
  const std::string spec = Spec("zf_full", 6, Zero(2, zfb));
  GangResult full = RunJob("zf_full", spec);
  ASSERT_TRUE(std::filesystem::exists(Dir("zf_full") + step3 + "/zenflow_rank1.bin"));
  GangResult resumed = RunJob("zf_resumed", spec, {"--resume_from=" + Dir("zf_full") + step3});
  std::vector<double> a = Losses(full, "step"), b = Losses(resumed, "step");
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[i + 3]) << "step " << i + 4;
  EXPECT_EQ(Losses(full, "eval").back(), Losses(resumed, "eval").back());
  ExpectSameSections(Dir("zf_full") + step6, Dir("zf_resumed") + step6, "resumed");
  // Each rank's manifest lists its state file, so verifying the checkpoint covers it.
  // Regression: a corrupt state file verified OK, and the scheduler resumed from that step on
  // every restart instead of falling back to an older one.
  const std::string dir3 = Dir("zf_full") + step3;
  for (int r : {0, 1}) {
    absl::StatusOr<loom::storage::ShardManifest> m = loom::storage::ReadManifest(dir3, r);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->side_files.size(), 1u);
    EXPECT_EQ(m->side_files[0].name, absl::StrCat("zenflow_rank", r, ".bin"));
    EXPECT_EQ(m->side_files[0].bytes,
              static_cast<int64_t>(std::filesystem::file_size(dir3 + "/" + m->side_files[0].name)));
  }
  ASSERT_TRUE(loom::storage::VerifyCheckpointDir(dir3).ok());
  // The two ranks' files swapped (each intact by its own CRC): verification and resume both
  // refuse, naming the file. Regression: the resume went on silently with the wrong state.
  const std::string f0 = dir3 + "/zenflow_rank0.bin", f1 = dir3 + "/zenflow_rank1.bin";
  std::filesystem::rename(f0, dir3 + "/swap");
  std::filesystem::rename(f1, f0);
  std::filesystem::rename(dir3 + "/swap", f1);
  absl::Status verified = loom::storage::VerifyCheckpointDir(dir3).status();
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_NE(verified.message().find("zenflow_rank0.bin (rank 0)"), std::string::npos) << verified;
  GangResult swapped = RunGang("zf_swapped", spec, 2, {"--resume_from=" + dir3});
  ASSERT_FALSE(swapped.timed_out);
  EXPECT_EQ(swapped.exit_codes[0], loom::kTrainerExitDataError);
  std::vector<json> swap_errors = swapped.Of(0, "error");
  ASSERT_EQ(swap_errors.size(), 1u);
  EXPECT_NE(swap_errors[0]["message"].get<std::string>().find(
                "zenflow_rank0.bin (rank 0): CRC-32"),
            std::string::npos)
      << swap_errors[0]["message"];
  std::filesystem::rename(f0, dir3 + "/swap");
  std::filesystem::rename(f1, f0);
  std::filesystem::rename(dir3 + "/swap", f1);
  // A checkpoint written before 2026-12-05 (state format LOOMZF01, whose CRC-32 ended the file;
  // manifests without side files) still resumes bit for bit.
  const std::string old3 = Dir("zf_v1") + step3;
  std::filesystem::create_directories(old3);
  std::filesystem::copy(dir3, old3, std::filesystem::copy_options::recursive);
  for (int r : {0, 1}) {
    const std::string f = old3 + absl::StrCat("/zenflow_rank", r, ".bin");
    std::optional<std::string> text = ReadText(f);
    ASSERT_TRUE(text.has_value());
    std::string v2 = *text;
    ASSERT_EQ(v2.substr(0, 8), "LOOMZF02");
    std::string v1 = "LOOMZF01" + v2.substr(12);
    const uint32_t crc = static_cast<uint32_t>(
        ::crc32(0, reinterpret_cast<const Bytef*>(v1.data()), static_cast<uInt>(v1.size())));
    v1.append(reinterpret_cast<const char*>(&crc), 4);
    std::ofstream(f, std::ios::binary | std::ios::trunc) << v1;
    const std::string mf = old3 + absl::StrCat("/rank_", r, ".manifest.json");
    std::optional<std::string> mtext = ReadText(mf);
    ASSERT_TRUE(mtext.has_value());
    json m = json::parse(*mtext);
    m.erase("side_files");
    std::ofstream(mf, std::ios::trunc) << m.dump(1);
  }
  GangResult from_v1 = RunJob("zf_from_v1", spec, {"--resume_from=" + old3});
  EXPECT_EQ(Losses(from_v1, "step"), b);
  // Resumed without zenflow: allowed, but the dropped state is named in a warning.
  GangResult off = RunJob("zf_off", Spec("zf_off", 6, Zero(2, json())),
                          {"--resume_from=" + dir3});
  ASSERT_EQ(Losses(off, "step").size(), 3u);
  std::string warnings;
  for (const json& w : off.Of(0, "warning")) warnings += w["message"].get<std::string>() + "\n";
  EXPECT_NE(warnings.find("zenflow_rank0.bin: this checkpoint holds ZenFlow state"),
            std::string::npos)
      << warnings;
  // Without its state file a ZenFlow checkpoint is refused, naming the file.
  std::filesystem::remove(Dir("zf_full") + step3 + "/zenflow_rank0.bin");
  GangResult bad = RunGang("zf_bad", spec, 2, {"--resume_from=" + Dir("zf_full") + step3});
  ASSERT_FALSE(bad.timed_out);
  EXPECT_NE(bad.exit_codes[0], 0);
  std::vector<json> errors = bad.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("zenflow_rank0.bin"), std::string::npos)
      << errors[0]["message"];
}

TEST(ZenFlowTrainerTest, Fp16InjectedInfSkipsTheStepOnBothSides) {
  json zfb = ZenFlowBlock();
  zfb["select_interval"] = 4;
  zfb["update_interval"] = 4;  // steps 2-5 form one interval: step 3 is mid-interval
  const std::string spec = Spec("zf_fp16", 4, Zero(2, zfb), /*bf16=*/false,
                                /*checkpoint_interval=*/1);
  json j = json::parse(*ReadText(spec));
  j["deepspeed_config"]["fp16"] = {{"enabled", true},
                                   {"initial_scale_power", 8},
                                   {"loss_scale_window", 100},
                                   {"hysteresis", 1}};
  std::ofstream(spec) << j.dump(2);
  GangResult r = RunJob("zf_fp16", spec, {"--test_inject_inf_grad_steps=3"});
  std::vector<json> steps = r.Of(0, "step");
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_FALSE(steps[1]["skipped"].get<bool>());
  EXPECT_TRUE(steps[2]["skipped"].get<bool>());
  EXPECT_FALSE(steps[3]["skipped"].get<bool>());
  EXPECT_EQ(steps[2]["loss_scale"].get<double>(), 256.0);
  EXPECT_EQ(steps[3]["loss_scale"].get<double>(), 128.0);
  EXPECT_GT(steps[2]["zenflow_selected_mass_fraction"].get<double>(), 0.0);
  auto dir = [](int step) { return Dir("zf_fp16") + "/" + loom::storage::StepDirName(step); };
  ExpectSameSections(dir(2), dir(3), "skipped step 3 vs step 2");
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = absl::StrCat("/zenflow_rank", rank, ".bin");
    std::optional<std::string> s2 = ReadText(dir(2) + file), s3 = ReadText(dir(3) + file),
                               s4 = ReadText(dir(4) + file);
    ASSERT_TRUE(s2 && s3 && s4) << file;
    EXPECT_TRUE(*s3 == *s2) << file << ": ZenFlow state changed by the skipped step 3";
    EXPECT_FALSE(*s4 == *s2) << file << ": step 4 did not update ZenFlow's state";
  }
  auto p2 = Reassemble(dir(2), 2, "fp32_params"), p4 = Reassemble(dir(4), 2, "fp32_params");
  ASSERT_FALSE(p2.empty());
  EXPECT_NE(p4, p2) << "step 4 did not update the parameters";
}

}  // namespace

namespace {

double MaxLogitDiff(const json& want, const json& got) {
  EXPECT_EQ(want["tokens"], got["tokens"]);
  double max_diff = 0;
  for (size_t i = 0; i < want["logits"].size(); ++i) {
    for (size_t v = 0; v < want["logits"][i].size(); ++v) {
      max_diff = std::max(max_diff, std::abs(want["logits"][i][v].get<double>() -
                                             got["logits"][i][v].get<double>()));
    }
  }
  return max_diff;
}

TEST(ZenFlowTrainerTest, FinalEvalSeesTheLastCpuUpdate) {
  for (int stage : {1, 3}) {
    const std::string name = absl::StrCat("zf_final_s", stage);
    // 5 steps, update every 2 with overlap: a CPU step is still in flight when training ends,
    // so its result reaches the weights only through the final flush.
    const int steps = 5;
    RunJob(name, Spec(name, steps, Zero(stage, ZenFlowBlock()), /*bf16=*/false,
                      /*checkpoint_interval=*/100));
    const std::string export_dir = TmpDir() + "/export_" + name;
    auto consolidated = loom::storage::Consolidate(Dir(name), steps, export_dir);
    ASSERT_TRUE(consolidated.ok()) << consolidated.status();

    const std::string ft = name + "_lr0";
    json spec = json::parse(*ReadText(WriteSpec(ft, 2, 1)));
    spec["model"]["init_from"] = export_dir;
    spec["deepspeed_config"]["optimizer"]["params"]["lr"] = 0.0;
    spec["deepspeed_config"].erase("scheduler");
    const std::string spec_path = TmpDir() + "/" + ft + ".spec.json";
    std::ofstream(spec_path) << spec.dump(2);
    RunJob(ft, spec_path);
    const double diff =
        MaxLogitDiff(json::parse(*ReadText(Dir(name) + "/final_logits.json")),
                     json::parse(*ReadText(Dir(ft) + "/final_logits.json")));
    EXPECT_LT(diff, 1e-5) << "stage " << stage
                          << ": the final logits are not those of the final checkpoint's weights";
  }
}

}  // namespace
