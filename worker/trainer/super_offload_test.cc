// SuperOffload through real loom-trainer processes (issue 15's trainer-level acceptance): with
// zero_optimization.offload_optimizer.super_offload the run equals Loom's synchronous
// ZeRO-Offload (the same job without super_offload) for ratio 0, 0.5 and 1, GAS 4, on 1 rank and
// on 2 (ratio 1 bit for bit: the same CpuAdam on the same gradients; otherwise within fp32
// tolerance, in-memory Adam and CpuAdam differing by FMA rounding); with clipping active every
// speculative step is rolled back and replayed and still equals the synchronous clipped run; an
// injected inf (fp16) skips the step with every parameter and moment unchanged and the loss scale
// halved; a resume from a checkpoint continues the uninterrupted trajectory bit for bit.
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

constexpr int kSteps = 6;
constexpr double kParamAtol = 2e-5;
constexpr double kParamRtol = 1e-4;

std::string Dir(const std::string& name) { return TmpDir() + "/ckpt_" + name; }

// The tiny job (gang_test_util) on stage 3 with GAS 4, sub-groups of 20000 elements (7 per
// rank on 1 rank), this offload_optimizer section and clipping.
std::string Spec(const std::string& name, int world, const json& offload, double clipping,
                 const json& top = json::object(), int steps = kSteps) {
  const std::string path = WriteSpec(name, 2 / world, steps);
  json spec = json::parse(*ReadText(path));
  json& ds = spec["deepspeed_config"];
  ds["gradient_accumulation_steps"] = 4;
  ds["gradient_clipping"] = clipping;
  ds["zero_optimization"] = {{"stage", 3},
                             {"sub_group_size", 20000},
                             {"reduce_bucket_size", 20000},
                             {"overlap_comm", true},
                             {"offload_optimizer", offload}};
  for (auto it = top.begin(); it != top.end(); ++it) ds[it.key()] = *it;
  spec["checkpoint"]["interval_steps"] = "3";
  std::ofstream(path) << spec.dump(2);
  return path;
}

json Super(double ratio) {
  return {{"device", "cpu"}, {"super_offload", true}, {"ratio", ratio},
          {"cpuadam_cores_perc", 1.0}};
}
const json kSync = {{"device", "cpu"}};

void ExpectSuccess(const GangResult& r, const std::string& name) {
  ASSERT_FALSE(r.timed_out) << name;
  for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0)
        << name << " rank " << rank << " (see " << name << ".rank" << rank << ".stderr)";
    EXPECT_EQ(r.Of(rank, "done").size(), 1u) << name << " rank " << rank;
  }
}

GangResult RunJob(const std::string& name, const std::string& spec, int world,
               std::vector<std::string> extra = {}) {
  extra.push_back("--checkpoint_dir=" + Dir(name));
  GangResult r = RunGang(name, spec, world, extra);
  ExpectSuccess(r, name);
  return r;
}

std::map<std::string, std::vector<float>> Final(const std::string& name, int world,
                                                const std::string& section, int step = kSteps) {
  return Reassemble(Dir(name) + "/" + loom::storage::StepDirName(step), world, section);
}

void ExpectNear(const std::map<std::string, std::vector<float>>& a,
                const std::map<std::string, std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (const auto& [name, va] : a) {
    const std::vector<float>& vb = b.at(name);
    ASSERT_EQ(va.size(), vb.size()) << what << " " << name;
    double worst = -1;
    for (size_t i = 0; i < va.size(); ++i) {
      worst = std::max(worst, std::abs(double(va[i]) - vb[i]) - kParamRtol * std::abs(double(va[i])));
    }
    EXPECT_LE(worst, kParamAtol) << what << " " << name;
  }
}

int64_t LastField(const GangResult& r, const std::string& field) {
  std::vector<json> steps = r.Of(0, "step");
  return steps.empty() ? -1 : steps.back()[field].get<int64_t>();
}

// No clipping: every speculative step is a hit; ratio 1 equals ZeRO-Offload bit for bit.
TEST(SuperOffloadTrainerTest, EqualsSynchronousZeroOffloadForRatio0HalfAnd1OnOneAndTwoRanks) {
  for (int world : {1, 2}) {
    const std::string base = absl::StrCat("sync_w", world);
    GangResult sync = RunJob(base, Spec(base, world, kSync, 0.0), world);
    const auto sync_params = Final(base, world, "fp32_params");
    const std::vector<double> sync_loss = Losses(sync, "step");
    ASSERT_EQ(sync_loss.size(), static_cast<size_t>(kSteps));
    for (double ratio : {0.0, 0.5, 1.0}) {
      const std::string name = absl::StrCat("super_r", ratio, "_w", world);
      GangResult r = RunJob(name, Spec(name, world, Super(ratio), 0.0), world);
      const std::vector<double> loss = Losses(r, "step");
      ASSERT_EQ(loss.size(), sync_loss.size()) << name;
      for (size_t i = 0; i < loss.size(); ++i) {
        EXPECT_NEAR(loss[i], sync_loss[i], 1e-5 * std::abs(sync_loss[i])) << name << " " << i;
      }
      const auto params = Final(name, world, "fp32_params");
      ExpectNear(params, sync_params, name);
      if (ratio == 1.0) {
        EXPECT_EQ(params, sync_params) << name << ": not bit-identical to ZeRO-Offload";
        EXPECT_EQ(loss, sync_loss) << name;
      }
      for (int rank = 0; rank < world; ++rank) {
        std::vector<json> steps = r.Of(rank, "step");
        ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << name;
        const json& last = steps.back();
        EXPECT_EQ(last["speculation_hits"], last["speculated_sub_groups"]) << name;
        if (ratio > 0) {
          EXPECT_GT(last["speculated_sub_groups"].get<int64_t>(), 0) << name;
        }
        if (ratio == 0) {
          EXPECT_EQ(last["speculated_sub_groups"].get<int64_t>(), 0) << name;
        }
        EXPECT_EQ(last["rollbacks_clip"].get<int64_t>() + last["rollbacks_overflow"].get<int64_t>(),
                  0)
            << name;
        for (const json& s : steps) {
          EXPECT_GE(s["optimizer_overlap_fraction"].get<double>(), 0.0) << name;
          EXPECT_LE(s["optimizer_overlap_fraction"].get<double>(), 1.0) << name;
        }
        std::vector<json> started = r.Of(rank, "started");
        ASSERT_EQ(started.size(), 1u);
        EXPECT_EQ(started[0]["superoffload_casting"], "no transfer");
        EXPECT_EQ(started[0]["superoffload_sub_group_size"], 20000);
        // No clipping and no fp16: no step can be rolled back, so no snapshot is kept.
        EXPECT_EQ(started[0]["superoffload_copy_bytes"].get<int64_t>(), 0) << name;
      }
    }
  }
}

// Clipping 0.5 is active on every step of this job: with speculation "always" each speculative
// sub-group step is rolled back and replayed with the clip coefficient, and the run equals the
// synchronous clipped one.
TEST(SuperOffloadTrainerTest, ClippingRollsBackAndReplaysToTheSynchronousClippedRun) {
  const int world = 2;
  GangResult sync = RunJob("clip_sync", Spec("clip_sync", world, kSync, 0.5), world);
  json always = Super(1.0);
  always["speculation"] = "always";
  GangResult r = RunJob("clip_super", Spec("clip_super", world, always, 0.5), world);
  EXPECT_EQ(Final("clip_super", world, "fp32_params"), Final("clip_sync", world, "fp32_params"));
  EXPECT_EQ(Losses(r, "step"), Losses(sync, "step"));
  const int64_t spec = LastField(r, "speculated_sub_groups");
  EXPECT_GT(spec, 0);
  EXPECT_EQ(LastField(r, "rollbacks_clip"), spec);
  EXPECT_EQ(LastField(r, "replays"), spec);
  EXPECT_EQ(LastField(r, "speculation_hits"), 0);
  int rolled_back_steps = 0;
  for (const json& s : r.Of(0, "step")) rolled_back_steps += s["optimizer_rollbacks"].get<int>();
  EXPECT_EQ(rolled_back_steps, kSteps);
  // Clipping configured: the snapshots exist (3 floats per CPU element).
  EXPECT_GT(r.Of(0, "started")[0]["superoffload_copy_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(LastField(r, "speculation_paused"), 0);
}

// The same job with the default, adaptive speculation: step 1 is speculated (no step before it)
// and rolled back; every later step follows a clipped one, so none is speculated (its CPU
// sub-groups step after validation), and the run still equals the synchronous clipped one.
TEST(SuperOffloadTrainerTest, AdaptiveSpeculationPausesWhileClippingIsActive) {
  const int world = 2;
  GangResult sync = RunJob("adapt_sync", Spec("adapt_sync", world, kSync, 0.5), world);
  GangResult r = RunJob("adapt_super", Spec("adapt_super", world, Super(1.0), 0.5), world);
  EXPECT_EQ(Final("adapt_super", world, "fp32_params"), Final("adapt_sync", world, "fp32_params"));
  EXPECT_EQ(Losses(r, "step"), Losses(sync, "step"));
  std::vector<json> steps = r.Of(0, "step");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  const int64_t per_step = steps[0]["speculated_sub_groups"].get<int64_t>();  // step 1: all
  EXPECT_GT(per_step, 0);
  EXPECT_EQ(steps[0]["optimizer_rollbacks"].get<int>(), 1);
  EXPECT_EQ(steps[0]["speculation_paused"].get<int64_t>(), 0);
  for (int i = 1; i < kSteps; ++i) {
    EXPECT_EQ(steps[i]["optimizer_rollbacks"].get<int>(), 0) << "step " << i + 1;
    EXPECT_EQ(steps[i]["speculated_sub_groups"].get<int64_t>(), per_step) << "step " << i + 1;
    EXPECT_EQ(steps[i]["speculation_paused"].get<int64_t>(), i * per_step) << "step " << i + 1;
  }
  EXPECT_EQ(LastField(r, "rollbacks_clip"), per_step);
}

// fp16 with an inf injected into rank 0's gradient at step 3 (after the speculative steps
// started): every sub-group's parameters and moments equal step 2's, the step is skipped and the
// loss scale halves (hysteresis 1). Run with the state in memory (restored from the snapshots)
// and on NVMe (the held buffers are dropped, so the files the checkpoints read keep step 2's
// state).
void ExpectInjectedInfSkipsTheStep(const std::string& name, const json& offload) {
  const json fp16 = {{"fp16",
                      {{"enabled", true},
                       {"initial_scale_power", 8},
                       {"loss_scale_window", 100},
                       {"hysteresis", 1}}}};
  std::string spec = Spec(name, 2, offload, 0.0, fp16, 4);
  json j = json::parse(*ReadText(spec));
  j["checkpoint"]["interval_steps"] = "1";
  std::ofstream(spec) << j.dump(2);
  GangResult r = RunJob(name, spec, 2, {"--test_inject_inf_grad_steps=3"});
  std::vector<json> steps = r.Of(0, "step");
  ASSERT_EQ(steps.size(), 4u) << name;
  EXPECT_FALSE(steps[1]["skipped"].get<bool>()) << name;
  EXPECT_TRUE(steps[2]["skipped"].get<bool>()) << name;
  EXPECT_EQ(steps[2]["loss_scale"].get<double>(), 256.0) << name;
  EXPECT_EQ(steps[3]["loss_scale"].get<double>(), 128.0) << name;
  EXPECT_EQ(steps[2]["optimizer_rollbacks"].get<int>(), 1) << name;
  EXPECT_GT(steps[2]["rollbacks_overflow"].get<int64_t>(), 0) << name;
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto s2 = Final(name, 2, section, 2), s3 = Final(name, 2, section, 3),
         s4 = Final(name, 2, section, 4);
    ASSERT_FALSE(s2.empty()) << name;
    EXPECT_EQ(s3, s2) << name << ": " << section << " changed by the skipped step 3";
    EXPECT_NE(s4, s2) << name << ": " << section << " not updated by step 4";
  }
}

TEST(SuperOffloadTrainerTest, InjectedInfSkipsTheStepRestoresEverythingAndHalvesTheScale) {
  ExpectInjectedInfSkipsTheStep("fp16_super", Super(0.5));
}

TEST(SuperOffloadTrainerTest, NvmeInjectedInfSkipsTheStepAndLeavesTheFilesUnchanged) {
  json off = Super(0.5);
  off["device"] = "nvme";
  off["nvme_path"] = TmpDir();
  off["buffer_count"] = 30;
  ExpectInjectedInfSkipsTheStep("fp16_nvme", off);
}

// Regression (break-it pass, 2026-12-05): the inf-injection hook wrote the inf after
// SuperOffload's speculation had read rank 0's gradient, so with speculation "always" in fp32 the
// inf was never seen and the step stood: the run equalled the one without injection. Now the
// injected run equals the synchronous offload run with the same injection (ratio 1: the same
// CpuAdam on the same gradients) and differs from the run without it.
TEST(SuperOffloadTrainerTest, InjectedInfReachesSpeculationAlways) {
  json always = Super(1.0);
  always["speculation"] = "always";
  const std::string inject = "--test_inject_inf_grad_steps=2";
  const GangResult so =
      RunJob("inj_always", Spec("inj_always", 2, always, 0.5, json::object(), 4), 2, {inject});
  const GangResult sync =
      RunJob("inj_sync", Spec("inj_sync", 2, kSync, 0.5, json::object(), 4), 2, {inject});
  const GangResult clean =
      RunJob("inj_none", Spec("inj_none", 2, always, 0.5, json::object(), 4), 2);
  const std::vector<double> a = Losses(so, "step"), b = Losses(sync, "step"),
                            c = Losses(clean, "step");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE((std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i])
        << "step " << i + 1 << ": " << a[i] << " vs synchronous " << b[i];
  }
  EXPECT_FALSE(a[2] == c[2]) << "step 3 equals the run without the injected inf: " << a[2];
}

// Resume from step 3's checkpoint: steps 4-6 and the final state equal the uninterrupted run.
TEST(SuperOffloadTrainerTest, ResumeMatchesTheUninterruptedRun) {
  const int world = 2;
  const std::string spec = Spec("resume_full", world, Super(0.5), 0.5);
  GangResult full = RunJob("resume_full", spec, world);
  GangResult resumed =
      RunJob("resume_part", spec, world,
          {"--resume_from=" + Dir("resume_full") + "/" + loom::storage::StepDirName(3)});
  std::vector<double> a = Losses(full, "step"), b = Losses(resumed, "step");
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[i + 3]) << "step " << i + 4;
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    EXPECT_EQ(Final("resume_part", world, section), Final("resume_full", world, section))
        << section;
  }
}

// Optimizer state on NVMe (offload_optimizer.device "nvme"): the speculative steps are held in
// swap buffers and written back on a hit, dropped and replayed from the files on a clip. Each
// run equals synchronous ZeRO-Infinity (the same job without super_offload) bit for bit, without
// clipping (every speculation a hit) and with clipping active on every step (every speculation
// rolled back and replayed), also at ZeRO stage 1 and with buffer_count 3 (one sub-group held
// at a time); a resume
// from step 3 continues the trajectory bit for bit.
TEST(SuperOffloadTrainerTest, NvmeStateEqualsSynchronousNvmeOffloadAndResumes) {
  const int world = 2;
  auto nvme = [](json o) {
    o["device"] = "nvme";
    o["nvme_path"] = TmpDir();
    o["buffer_count"] = 30;  // 10 sub-groups held at once: every CPU sub-group of a rank
    o["pipeline_read"] = true;
    o["pipeline_write"] = true;
    return o;
  };
  json always = nvme(Super(1.0));
  always["speculation"] = "always";
  for (double clip : {0.0, 0.5}) {
    const std::string tag = clip > 0 ? "nvme_clip_" : "nvme_";
    GangResult sync = RunJob(tag + "sync", Spec(tag + "sync", world, nvme(kSync), clip), world);
    const std::string spec = Spec(tag + "super", world, always, clip);
    GangResult r = RunJob(tag + "super", spec, world);
    EXPECT_EQ(Losses(r, "step"), Losses(sync, "step")) << tag;
    for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
      EXPECT_EQ(Final(tag + "super", world, section), Final(tag + "sync", world, section))
          << tag << section;
    }
    const int64_t spec_steps = LastField(r, "speculated_sub_groups");
    EXPECT_GT(spec_steps, 0) << tag;
    EXPECT_EQ(LastField(r, "speculation_hits"), clip > 0 ? 0 : spec_steps) << tag;
    EXPECT_EQ(LastField(r, "rollbacks_clip"), clip > 0 ? spec_steps : 0) << tag;
    EXPECT_EQ(LastField(r, "speculation_no_buffer"), 0) << tag;
    // No snapshot: the files are the rollback copy.
    EXPECT_EQ(r.Of(0, "started")[0]["superoffload_copy_bytes"].get<int64_t>(), 0) << tag;
    if (clip == 0) {
      // ZeRO stage 1 (the masters are all-gathered after the step, not sharded working copies):
      // the same equality with ZeRO-Infinity at stage 1.
      const json stage1 = {{"zero_optimization", {{"stage", 1},
                                                  {"sub_group_size", 20000},
                                                  {"offload_optimizer", always}}}};
      GangResult s1 = RunJob("nvme_s1_sync", Spec("nvme_s1_sync", world, nvme(kSync), clip,
                             {{"zero_optimization", {{"stage", 1},
                                                     {"sub_group_size", 20000},
                                                     {"offload_optimizer", nvme(kSync)}}}}),
                             world);
      GangResult r1s = RunJob("nvme_s1_super", Spec("nvme_s1_super", world, always, clip, stage1),
                              world);
      EXPECT_EQ(Losses(r1s, "step"), Losses(s1, "step"));
      EXPECT_EQ(Final("nvme_s1_super", world, "fp32_params"),
                Final("nvme_s1_sync", world, "fp32_params"));
      EXPECT_EQ(Final("nvme_s1_super", world, "exp_avg_sq"),
                Final("nvme_s1_sync", world, "exp_avg_sq"));
      EXPECT_GT(LastField(r1s, "speculation_hits"), 0);
      // buffer_count 3: one sub-group held at a time; the others step after validation.
      json one = always;
      one["buffer_count"] = 3;
      one["pipeline_read"] = false;
      GangResult r1 = RunJob("nvme_one", Spec("nvme_one", world, one, clip), world);
      EXPECT_EQ(Losses(r1, "step"), Losses(sync, "step"));
      EXPECT_EQ(Final("nvme_one", world, "fp32_params"), Final(tag + "sync", world, "fp32_params"));
      EXPECT_EQ(LastField(r1, "speculated_sub_groups"), kSteps);  // one per step on rank 0
      EXPECT_GT(LastField(r1, "speculation_no_buffer"), 0);
      continue;
    }
    GangResult resumed = RunJob(
        tag + "resume", spec, world,
        {"--resume_from=" + Dir(tag + "super") + "/" + loom::storage::StepDirName(3)});
    std::vector<double> a = Losses(r, "step"), b = Losses(resumed, "step");
    ASSERT_EQ(b.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[i + 3]) << "step " << i + 4;
    for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
      EXPECT_EQ(Final(tag + "resume", world, section), Final(tag + "super", world, section))
          << section;
    }
  }
}

// Bad SuperOffload specs fail at start with the key named.
TEST(SuperOffloadTrainerTest, StageZeroIsRefusedNamingTheKey) {
  std::string spec = Spec("stage0", 1, Super(1.0), 0.0);
  json j = json::parse(*ReadText(spec));
  j["deepspeed_config"]["zero_optimization"]["stage"] = 0;
  std::ofstream(spec) << j.dump(2);
  GangResult r = RunGang("stage0", spec, 1, {});
  EXPECT_EQ(r.exit_codes[0], loom::kTrainerExitConfigError);  // a configuration error
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find(
                "zero_optimization.offload_optimizer.super_offload"),
            std::string::npos)
      << errors[0]["message"];
}

}  // namespace
