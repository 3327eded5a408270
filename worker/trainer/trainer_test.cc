// End-to-end tests of loom-trainer with real processes and real Gloo over loopback:
//   * ZeRO-3 equivalence: the same model, seed and global batch trained 12 steps on 1 rank
//     (micro 6), 2 ranks (micro 3) and 3 ranks (micro 2), GAS 2, clipping, AdamW + WarmupDecayLR
//     give the same per-step losses, eval losses and final parameters (reassembled from the
//     rank shards).
//   * Memory accounting: gathered bytes are 0 between steps; partition bytes = Σ ceil(n/N)*4.
//   * Resume: 2 ranks resumed from step 6 reproduce the uninterrupted run bit-exactly; resume
//     with another world size and from a corrupt shard are refused.
//   * Fine-tuning: a consolidated export initialises a 3-rank job with the same logits.
//   * The malloc flags change nothing and are validated.
// Every child has a deadline; on expiry all children are killed and the test fails. Offload is
// in trainer_offload_test.cc, config errors and signals in trainer_errors_test.cc (separate
// targets, so that Bazel runs them side by side); stage 0-2, mixed precision and the §7 rows
// are in zero_stages_test.cc and zero_stages_rows_test.cc.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    one_ = new GangResult(RunGang("one", WriteSpec("one", 6, 12), 1,
                                  {"--checkpoint_dir=" + Dir("one")}));
    two_ = new GangResult(RunGang("two", WriteSpec("two", 3, 12), 2,
                                  {"--checkpoint_dir=" + Dir("two")}));
    three_ = new GangResult(RunGang("three", WriteSpec("three", 2, 12), 3,
                                    {"--checkpoint_dir=" + Dir("three")}));
  }
  static void TearDownTestSuite() {
    delete one_;
    delete two_;
    delete three_;
  }
  static std::string Dir(const std::string& name) { return TmpDir() + "/ckpt_" + name; }
  // A fresh copy of the two-rank run's step-6 checkpoint under Dir(name), to damage.
  static std::string CopyOfStepSix(const std::string& name) {
    namespace fs = std::filesystem;
    const std::string from = Dir("two") + "/" + loom::storage::StepDirName(6);
    const std::string copy = Dir(name) + "/" + loom::storage::StepDirName(6);
    fs::remove_all(Dir(name));
    fs::create_directories(copy);
    for (const auto& e : fs::directory_iterator(from)) {
      fs::copy_file(e.path(), copy + "/" + e.path().filename().string());
    }
    return copy;
  }
  static void ExpectSuccess(const GangResult& r, const std::string& name) {
    for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
      EXPECT_EQ(r.exit_codes[rank], 0) << name << " rank " << rank << " (see "
                                       << name << ".rank" << rank << ".stderr)";
      EXPECT_EQ(r.Of(rank, "done").size(), 1u) << name << " rank " << rank;
    }
  }
  static GangResult* one_;
  static GangResult* two_;
  static GangResult* three_;
};
GangResult* TrainerTest::one_ = nullptr;
GangResult* TrainerTest::two_ = nullptr;
GangResult* TrainerTest::three_ = nullptr;

// Tolerances (fp32, 12 steps): losses rtol 1e-5; parameters |a-b| <= 2e-5 + 1e-4 |b|.
// Measured differences are ~1e-7 relative: only the order of fp32 sums differs.
constexpr double kLossRtol = 1e-5;
constexpr double kParamAtol = 2e-5;
constexpr double kParamRtol = 1e-4;

TEST_F(TrainerTest, Zero3OnTwoAndThreeRanksEqualsOneRank) {
  ExpectSuccess(*one_, "one");
  ExpectSuccess(*two_, "two");
  ExpectSuccess(*three_, "three");
  for (const std::string type : {"step", "eval"}) {
    std::vector<double> a = Losses(*one_, type), b = Losses(*two_, type),
                        c = Losses(*three_, type);
    ASSERT_EQ(a.size(), type == "step" ? 12u : 3u);
    ASSERT_EQ(b.size(), a.size());
    ASSERT_EQ(c.size(), a.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max({worst, std::abs(b[i] - a[i]) / a[i], std::abs(c[i] - a[i]) / a[i]});
      EXPECT_NEAR(b[i], a[i], kLossRtol * std::abs(a[i])) << type << " " << i;
      EXPECT_NEAR(c[i], a[i], kLossRtol * std::abs(a[i])) << type << " " << i;
    }
    std::cout << "max relative " << type << " loss difference = " << worst << "\n";
  }
  // Training made progress (held-out loss fell from ~ln 256).
  std::vector<double> ev = Losses(*one_, "eval");
  EXPECT_NEAR(ev.front(), std::log(256.0), 0.1);
  EXPECT_LT(ev.back(), ev.front() - 1.0);
  // The schedule: WarmupDecayLR linear, step 1 runs at warmup_min_lr, step 4 at
  // 1e-4 + (3e-3 - 1e-4) * 2/4 (last_batch_iteration 2).
  std::vector<json> steps = one_->Of(0, "step");
  EXPECT_DOUBLE_EQ(steps[0]["lr"].get<double>(), 1e-4);
  EXPECT_NEAR(steps[3]["lr"].get<double>(), 1e-4 + 2.9e-3 * 0.5, 1e-12);

  const std::string step12 = "/" + loom::storage::StepDirName(12);
  auto p1 = Reassemble(Dir("one") + step12, 1, "fp32_params");
  auto p2 = Reassemble(Dir("two") + step12, 2, "fp32_params");
  auto p3 = Reassemble(Dir("three") + step12, 3, "fp32_params");
  ASSERT_EQ(p1.size(), 1u + 2u * 9u + 2u);
  double max_param_diff = 0;
  for (const auto& [name, a] : p1) {
    for (const auto* other : {&p2, &p3}) {
      const std::vector<float>& b = other->at(name);
      ASSERT_EQ(b.size(), a.size()) << name;
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const double diff = std::abs(double(a[i]) - b[i]);
        max_param_diff = std::max(max_param_diff, diff);
        worst = std::max(worst, diff - kParamRtol * std::abs(double(a[i])));
      }
      EXPECT_LE(worst, kParamAtol) << name;
    }
  }
  std::cout << "max |param(1 rank) - param(N ranks)| = " << max_param_diff << "\n";
}

TEST_F(TrainerTest, MemoryAccounting) {
  const int64_t psi = 2 * 256 * 64 + 2 * (2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 +
                                          3 * 64 * 160) + 64;
  for (const auto& [r, world] : {std::pair{one_, 1}, {two_, 2}, {three_, 3}}) {
    std::vector<json> started = r->Of(0, "started");
    ASSERT_EQ(started.size(), 1u);
    EXPECT_EQ(started[0]["params"].get<int64_t>(), psi);
    const int64_t bytes = started[0]["partition_bytes"].get<int64_t>();
    // Σ ceil(n/N)*4 lies in [Ψ*4/N, Ψ*4/N + 4*(#params)] (at most N-1 padding per parameter).
    EXPECT_GE(bytes * world, psi * 4) << world;
    EXPECT_LE(bytes * world - psi * 4, 4 * (world - 1) * 21) << world;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<json> steps = r->Of(rank, "step");
      ASSERT_EQ(steps.size(), 12u);
      for (const json& e : steps) {
        EXPECT_EQ(e["gathered_bytes_between_steps"].get<int64_t>(), 0);
        EXPECT_EQ(e["partition_bytes"].get<int64_t>(), bytes);
        // Peak gathered = the largest full weight, or its gradient's reduce-scatter buffers
        // (one parameter per bucket, no overlap in this spec), not the model.
        EXPECT_LE(e["peak_gathered_bytes"].get<int64_t>(), 2 * 4 * (256 * 64 + world));
      }
    }
  }
  // Rank 0 wrote the logits of the live model.
  std::ifstream f(Dir("two") + "/final_logits.json");
  ASSERT_TRUE(f.good());
  json logits = json::parse(f);
  ASSERT_EQ(logits["tokens"].size(), 32u);
  ASSERT_EQ(logits["logits"].size(), 32u);
  EXPECT_EQ(logits["logits"][0].size(), 256u);
}

TEST_F(TrainerTest, ResumeFromStepSixEqualsUninterruptedRun) {
  ExpectSuccess(*two_, "two");
  const std::string from = Dir("two") + "/" + loom::storage::StepDirName(6);
  GangResult resumed = RunGang("resumed", WriteSpec("resumed", 3, 12), 2,
                               {"--checkpoint_dir=" + Dir("resumed"), "--resume_from=" + from});
  ExpectSuccess(resumed, "resumed");
  std::vector<double> full = Losses(*two_, "step"), part = Losses(resumed, "step");
  ASSERT_EQ(part.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(part[i], full[i + 6]) << "step " << i + 7;
  EXPECT_EQ(resumed.Of(0, "step")[0]["step"].get<int>(), 7);
  const std::string step12 = "/" + loom::storage::StepDirName(12);
  for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
    auto a = Reassemble(Dir("two") + step12, 2, section);
    auto b = Reassemble(Dir("resumed") + step12, 2, section);
    ASSERT_FALSE(a.empty());
    for (const auto& [name, v] : a) {
      ASSERT_EQ(v, b[name]) << section << " " << name << " differs after resume (bit-exact)";
    }
  }
  auto m = loom::storage::ReadManifest(Dir("resumed") + step12, 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->optimizer_step, 12);
  EXPECT_EQ(m->optimizer, "adamw");
  EXPECT_EQ(m->params[0].name, "model.embed_tokens.weight");
  // The checkpoint records the step's training loss and the held-out loss measured at it.
  ASSERT_EQ(m->metrics.count("train_loss"), 1u);
  EXPECT_DOUBLE_EQ(m->metrics.at("train_loss"), full[11]);
  ASSERT_EQ(m->metrics.count("eval_loss"), 1u);
  EXPECT_DOUBLE_EQ(m->metrics.at("eval_loss"), Losses(*two_, "eval").back());
}

// Fine-tuning from an export: the step-12 checkpoint of the 2-rank run, consolidated into a
// Hugging Face directory, initialises a 3-rank job; trained one step with lr 0 (no change), it
// computes the logits the 2-rank trainer computed, and a wrong shape is refused by name.
TEST_F(TrainerTest, InitialisesFromAConsolidatedExport) {
  ExpectSuccess(*two_, "two");
  const std::string export_dir = TmpDir() + "/export_two";
  auto consolidated = loom::storage::Consolidate(Dir("two"), 12, export_dir);
  ASSERT_TRUE(consolidated.ok()) << consolidated.status();

  json spec = json::parse(*ReadText(WriteSpec("finetune", 2, 1)));
  spec["model"]["init_from"] = export_dir;
  spec["deepspeed_config"]["optimizer"]["params"]["lr"] = 0.0;
  spec["deepspeed_config"].erase("scheduler");
  const std::string spec_path = TmpDir() + "/finetune.lr0.spec.json";
  std::ofstream(spec_path) << spec.dump(2);
  GangResult r = RunGang("finetune", spec_path, 3, {"--checkpoint_dir=" + Dir("finetune")});
  ExpectSuccess(r, "finetune");
  json want = json::parse(*ReadText(Dir("two") + "/final_logits.json"));
  json got = json::parse(*ReadText(Dir("finetune") + "/final_logits.json"));
  ASSERT_EQ(want["tokens"], got["tokens"]);
  double max_diff = 0;
  for (size_t i = 0; i < want["logits"].size(); ++i) {
    for (size_t v = 0; v < want["logits"][i].size(); ++v) {
      max_diff = std::max(max_diff, std::abs(want["logits"][i][v].get<double>() -
                                             got["logits"][i][v].get<double>()));
    }
  }
  EXPECT_LT(max_diff, 1e-5) << "logits of the fine-tuning start differ from the exported model's";

  json wrong = spec;
  wrong["model"]["config"]["intermediate_size"] = 128;  // the export has 160
  const std::string wrong_path = TmpDir() + "/finetune.wrong.spec.json";
  std::ofstream(wrong_path) << wrong.dump(2);
  GangResult bad = RunGang("finetune_wrong", wrong_path, 1, {});
  EXPECT_NE(bad.exit_codes[0], 0);
  std::vector<json> errors = bad.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  const std::string msg = errors[0]["message"];
  EXPECT_NE(msg.find("model.init_from: model.layers.0.mlp.gate_proj.weight has shape [160,64]"),
            std::string::npos)
      << msg;
}

TEST_F(TrainerTest, ResumeWithAnotherWorldSizeIsRefused) {
  const std::string from = Dir("two") + "/" + loom::storage::StepDirName(6);
  GangResult r = RunGang("wrong_world", WriteSpec("wrong_world", 6, 12), 1,
                         {"--resume_from=" + from});
  EXPECT_EQ(r.exit_codes[0], 1);
  std::vector<json> errors = r.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  const std::string msg = errors[0]["message"];
  EXPECT_NE(msg.find("world size 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world size 1"), std::string::npos) << msg;
}

// A checkpoint whose shard was damaged after it was committed is refused when resuming, by the
// rank that reads it, with an error naming the file (DATA_LOSS: CRC-32 mismatch), before any of
// it is loaded; the other rank stops too instead of hanging.
TEST_F(TrainerTest, ResumeFromACorruptShardIsRefusedNamingTheFile) {
  ExpectSuccess(*two_, "two");
  const std::string copy = CopyOfStepSix("corrupt_copy");
  {
    std::fstream f(copy + "/rank_1.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    const char c = static_cast<char>(f.get());
    f.seekp(1000);
    f.put(static_cast<char>(c ^ 0x40));
  }
  GangResult r = RunGang("corrupt", WriteSpec("corrupt", 3, 12), 2, {"--resume_from=" + copy});
  EXPECT_EQ(r.exit_codes[1], loom::kTrainerExitDataError);
  EXPECT_NE(r.exit_codes[0], 0);
  std::vector<json> errors = r.Of(1, "error");
  ASSERT_EQ(errors.size(), 1u);
  const std::string msg = errors[0]["message"];
  EXPECT_NE(msg.find("rank_1.shard"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
  EXPECT_TRUE(r.Of(1, "step").empty()) << "rank 1 must not train from a corrupt shard";
}

// A directory whose ranks' manifests disagree on the step (not committed by storage's rules) is
// refused by every rank, naming the disagreement. Regression: each rank resumed its own
// manifest's step, trained wrong losses, and rank 0 aborted when the collectives fell out of step.
TEST_F(TrainerTest, ResumeFromManifestsThatDisagreeOnTheStepIsRefused) {
  ExpectSuccess(*two_, "two");
  const std::string copy = CopyOfStepSix("disagree_copy");
  const std::string manifest = copy + "/rank_1.manifest.json";
  json m = json::parse(*ReadText(manifest));
  m["step"] = 7;
  std::ofstream(manifest, std::ios::trunc) << m.dump(1);
  GangResult r = RunGang("disagree", WriteSpec("disagree", 3, 12), 2, {"--resume_from=" + copy});
  ASSERT_FALSE(r.timed_out);
  for (int rank : {0, 1}) {
    EXPECT_EQ(r.exit_codes[rank], loom::kTrainerExitDataError) << "rank " << rank;
    EXPECT_TRUE(r.Of(rank, "step").empty()) << "rank " << rank << " must not train";
    std::vector<json> errors = r.Of(rank, "error");
    ASSERT_EQ(errors.size(), 1u) << "rank " << rank;
    const std::string msg = errors[0]["message"];
    EXPECT_NE(msg.find("manifests disagree (steps 6 to 7"), std::string::npos) << msg;
  }
}

// The glibc allocator flags change where memory comes from, never the arithmetic: the same run
// with a fixed 4 MiB mmap threshold and 64 MiB trim threshold gives bit-identical losses, and an
// out-of-range threshold is an invalid flag (exit 78, error event naming it).
TEST_F(TrainerTest, MallocFlagsDoNotChangeTheRunAndAreValidated) {
  GangResult r = RunGang("malloc", WriteSpec("malloc", 6, 12), 1,
                         {"--malloc_mmap_threshold_bytes=4194304",
                          "--malloc_trim_threshold_bytes=67108864"});
  ExpectSuccess(r, "malloc");
  for (const std::string type : {"step", "eval"}) {
    std::vector<double> a = Losses(*one_, type), b = Losses(r, type);
    ASSERT_EQ(a.size(), type == "step" ? 12u : 3u);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i]) << type << " " << i;
  }
  GangResult bad = RunGang("malloc_bad", WriteSpec("malloc_bad", 6, 2), 1,
                           {"--malloc_mmap_threshold_bytes=67108864"});
  EXPECT_EQ(bad.exit_codes[0], loom::kTrainerExitConfigError);
  std::vector<json> errors = bad.Of(0, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["message"].get<std::string>().find("--malloc_mmap_threshold_bytes"),
            std::string::npos);
}

}  // namespace
