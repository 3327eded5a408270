// ZeRO stages 0-3 end to end with real loom-trainer processes over Gloo on loopback; the 17 gangs
// of every (stage, world size) in fp32 and bf16 run once (SetUpTestSuite) and are shared by:
//   * Row16_StageDependentNumerics: stages 0/1/2/3 on 1, 2 and 4 ranks (GAS 2, clipping active,
//     bucket/overlap/contiguous/sub-group/prefetch knobs varied between runs) equal the 1-rank
//     stage-0 run (one process on the concatenated global batch): losses, eval losses and the
//     clipped global gradient norm within rtol 1e-5, final parameters |a-b| <= 2e-5 + 1e-4|b|
//     (docs/design/TECHNIQUES.md §1.11 #3, #4); every rank issued the same collective sequence
//     (#7).
//   * MemoryMatchesZeroFormulas: per-rank bytes of params / grads / optimizer states against the
//     ZeRO formulas adapted to Loom's fp32 and bf16 layouts (§1.1, §1.11 #5).
//   * Row4_CheckpointsHoldFullTensorsAndConsolidateAlikeForEveryStage: no empty or zero tensors;
//     consolidation gives the same safetensors layout for every stage, bit-equal to the shards.
//   * ResumeEqualsUninterruptedRunForEveryStage: save -> load -> continue is bit-exact (#9);
//     another world size is refused naming both sizes.
//   * Bf16LossTrajectoriesAgreeAcrossStages.
// The other rows (5-9, tied embeddings, fp16, communication volume, key policy) are independent
// gangs in zero_stages_rows_test.cc, a separate target so that Bazel runs the two (and its
// shards) side by side. Every gang has a deadline; on expiry all children are killed and the
// test fails.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/consolidate.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"
#include "worker/trainer/exit_codes.h"
#include "worker/trainer/gang_test_util.h"
#include "worker/trainer/zero_stages_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers


class ZeroStagesTest : public ::testing::Test {
 protected:
  // Every (stage, world) run once, shared by the tests below.
  static void SetUpTestSuite() {
    runs_ = new std::map<std::pair<int, int>, GangResult>;
    variants_ = new std::map<std::pair<int, int>, int>;
    int k = 0;
    for (int stage = 0; stage <= 3; ++stage) {
      for (int world : {1, 2, 4}) {
        const std::string name = RunName("eq", stage, world);
        const int variant = (stage == 0 && world == 1) ? 0 : (k++ % 2);
        (*variants_)[{stage, world}] = variant;
        (*runs_)[{stage, world}] = RunGang(name, Spec(name, world, kSteps, Knobs(stage, variant)),
                                           world, {"--checkpoint_dir=" + Dir(name)});
      }
    }
    bf16_ = new std::map<std::pair<int, int>, GangResult>;
    for (auto [stage, world] : {std::pair{0, 1}, {1, 2}, {2, 2}, {3, 2}, {3, 4}}) {
      const std::string name = RunName("bf16", stage, world);
      (*bf16_)[{stage, world}] =
          RunGang(name, Spec(name, world, kSteps, Knobs(stage, 1), {{"bf16", {{"enabled", true}}}}),
                  world, {"--checkpoint_dir=" + Dir(name)});
    }
  }
  static void TearDownTestSuite() {
    delete runs_;
    delete bf16_;
    delete variants_;
  }
  static const GangResult& Run(int stage, int world) { return runs_->at({stage, world}); }

  static std::map<std::pair<int, int>, GangResult>* runs_;
  static std::map<std::pair<int, int>, GangResult>* bf16_;
  static std::map<std::pair<int, int>, int>* variants_;
};
std::map<std::pair<int, int>, int>* ZeroStagesTest::variants_ = nullptr;
std::map<std::pair<int, int>, GangResult>* ZeroStagesTest::runs_ = nullptr;
std::map<std::pair<int, int>, GangResult>* ZeroStagesTest::bf16_ = nullptr;

TEST_F(ZeroStagesTest, Row16_StageDependentNumerics_AllStagesAndWorldSizesEqualOneRank) {
  const GangResult& ref = Run(0, 1);
  ExpectSuccess(ref, "eq_s0_w1");
  const std::vector<double> ref_loss = Losses(ref, "step"), ref_eval = Losses(ref, "eval");
  const std::vector<double> ref_norm = Field(ref, 0, "step", "grad_norm");
  ASSERT_EQ(ref_loss.size(), static_cast<size_t>(kSteps));
  // Clipping (max norm 0.5) is active on some step, so equal norms mean equal clipping.
  EXPECT_GT(*std::max_element(ref_norm.begin(), ref_norm.end()), 0.5);
  const std::string step_dir = "/" + loom::storage::StepDirName(kSteps);
  auto ref_params = Reassemble(Dir("eq_s0_w1") + step_dir, 1, "fp32_params");
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {1, 2, 4}) {
      const std::string name = RunName("eq", stage, world);
      const GangResult& r = Run(stage, world);
      ExpectSuccess(r, name);
      ExpectSameCollectives(r, name);
      std::vector<double> loss = Losses(r, "step"), eval = Losses(r, "eval");
      std::vector<double> norm = Field(r, 0, "step", "grad_norm");
      ASSERT_EQ(loss.size(), ref_loss.size()) << name;
      ASSERT_EQ(eval.size(), ref_eval.size()) << name;
      for (size_t i = 0; i < loss.size(); ++i) {
        EXPECT_NEAR(loss[i], ref_loss[i], kLossRtol * ref_loss[i]) << name << " step " << i + 1;
        EXPECT_NEAR(norm[i], ref_norm[i], kLossRtol * ref_norm[i]) << name << " step " << i + 1;
        worst_loss = std::max(worst_loss, std::abs(loss[i] - ref_loss[i]) / ref_loss[i]);
        worst_norm = std::max(worst_norm, std::abs(norm[i] - ref_norm[i]) / ref_norm[i]);
      }
      for (size_t i = 0; i < eval.size(); ++i) {
        EXPECT_NEAR(eval[i], ref_eval[i], kLossRtol * ref_eval[i]) << name << " eval " << i;
      }
      for (int rank = 0; rank < world; ++rank) {
        EXPECT_EQ(r.Of(rank, "step").size(), static_cast<size_t>(kSteps));
        EXPECT_EQ(r.Of(rank, "started")[0]["zero_stage"], stage);
      }
      worst_param = std::max(
          worst_param,
          CompareParams(ref_params, Reassemble(Dir(name) + step_dir, world, "fp32_params"), name));
    }
  }
  std::cout << "max relative loss difference " << worst_loss << ", grad norm " << worst_norm
            << ", max |param - param(1 rank, stage 0)| " << worst_param << "\n";
}

// Bytes of the gathered persistent parameters of a stage-3 rank (threshold in elements).
int64_t PersistentBytes(int64_t threshold, int world, int64_t bytes_per_elem) {
  int64_t b = 0;
  for (int64_t n : ParamNumels()) {
    if (n <= threshold) b += bytes_per_elem * world * ((n + world - 1) / world);
  }
  return b;
}

// Per-rank model-state bytes (peaks over the run's steps) against ZeRO's formulas (§1.1) with
// Loom's layouts. Ψ = parameters, P = Σ ceil(n_i/N) = this rank's partition elements
// (Ψ/N <= P <= Ψ/N + #params). fp32 (K = 8: m, v; the master is the parameter itself where it
// can be, else counted with the optimizer state; on one rank stages 1/2 too, P = Ψ, so there
// their optimizer term is 8P: ZeroOptions::params_view_masters):
//   stage 0: params 4Ψ,  grads 4Ψ,                  optimizer 8Ψ           (16Ψ)
//   stage 1: params 4Ψ,  grads in [4Ψ, 4Ψ + 4P],    optimizer 12P          (8Ψ + 12Ψ/N)
//   stage 2: params 4Ψ,  grads 4P,                  optimizer 12P          (4Ψ + 16Ψ/N)
//   stage 3: params 4P + R, grads 4P, optimizer 8P                         (16Ψ/N + R)
// where R = Σ 4·N·ceil(n_i/N) over persistent params (numel <= persistence threshold: kept
// gathered, i.e. replicated, as in DeepSpeed; with the default threshold 1e5 that is every
// parameter of this tiny model); R = 0 on one rank, where a gathered parameter is a view of
// its shard (ZeroOptions::params_view_masters).
// bf16 stage 3: params 2P, grads 4P (fp32 accumulation), optimizer 12P = 18Ψ/N, DeepSpeed's
// estimate_zero3_model_states_mem_needs GPU term 18Ψ/N_total (its largest-layer term is our
// buffer_bytes). Tolerance of the Ψ/N formulas: the padding, 18 bytes per padded element.
TEST_F(ZeroStagesTest, MemoryMatchesZeroFormulas) {
  const int64_t psi = Psi();
  const int64_t num_params = ParamNumels().size();
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {1, 2, 4}) {
      const std::string name = RunName("eq", stage, world);
      const GangResult& r = Run(stage, world);
      const int64_t p = PartitionElems(world);
      const int64_t pad_tol = 18 * num_params * (world - 1);
      // One rank, stages 1/2: the replica is the master (not counted again as optimizer state).
      const int64_t master = world == 1 && (stage == 1 || stage == 2) ? 0 : 4 * p;
      for (int rank = 0; rank < world; ++rank) {
        ASSERT_EQ(r.Of(rank, "step").size(), static_cast<size_t>(kSteps)) << name;
        const int64_t params = MaxField(r, rank, "param_bytes");
        const int64_t grads = MaxField(r, rank, "grad_bytes");
        const int64_t opt = MaxField(r, rank, "optimizer_state_bytes");
        const int64_t total = params + grads + opt;
        double formula = 0;
        switch (stage) {
          case 0:
            EXPECT_EQ(params, 4 * psi) << name;
            EXPECT_EQ(grads, 4 * psi) << name;
            EXPECT_EQ(opt, 8 * psi) << name;
            formula = 16.0 * psi;
            break;
          case 1:
            EXPECT_EQ(params, 4 * psi) << name;
            EXPECT_GE(grads, 4 * psi) << name;
            EXPECT_LE(grads, 4 * psi + 4 * p) << name;
            EXPECT_EQ(opt, 8 * p + master) << name;
            formula = 8.0 * psi + 8.0 * psi / world + master;
            break;
          case 2:
            EXPECT_EQ(params, 4 * psi) << name;
            EXPECT_EQ(grads, 4 * p) << name;
            EXPECT_EQ(opt, 8 * p + master) << name;
            formula = 4.0 * psi + 12.0 * psi / world + master;
            break;
          case 3: {
            // One rank: a gathered parameter is a view of its shard (params_view_masters), so
            // the persistent ones hold no second copy.
            const int64_t persistent =
                world == 1 ? 0
                           : PersistentBytes(variants_->at({stage, world}) == 0 ? 100000 : 100,
                                             world, 4);
            EXPECT_EQ(params, 4 * p + persistent) << name;
            EXPECT_EQ(grads, 4 * p) << name;
            EXPECT_EQ(opt, 8 * p) << name;
            formula = 16.0 * psi / world + persistent;
            break;
          }
        }
        const double tol = pad_tol + (stage == 1 ? 4.0 * p : 0);
        EXPECT_LE(std::abs(total - formula), tol) << name << " rank " << rank;
        for (const json& e : r.Of(rank, "step")) {
          EXPECT_EQ(e["gathered_bytes_between_steps"].get<int64_t>(), 0) << name;
          EXPECT_GE(e["peak_bytes"].get<int64_t>(), total - e["buffer_bytes"].get<int64_t>());
        }
      }
    }
  }
  for (int world : {2, 4}) {
    const GangResult& r = bf16_->at({3, world});
    ExpectSuccess(r, RunName("bf16", 3, world));
    const int64_t p = PartitionElems(world);
    const int64_t persistent = PersistentBytes(100, world, 2);  // Knobs(3, 1): threshold 100
    const int64_t params = MaxField(r, 0, "param_bytes");
    EXPECT_EQ(params, 2 * p + persistent);
    EXPECT_EQ(MaxField(r, 0, "grad_bytes"), 4 * p);
    EXPECT_EQ(MaxField(r, 0, "optimizer_state_bytes"), 12 * p);
    const int64_t total = 2 * p + 4 * p + 12 * p;
    EXPECT_LE(std::abs(total - 18.0 * psi / world), 18.0 * num_params * (world - 1))
        << "bf16 stage 3 on " << world << " ranks: " << total << " vs 18Ψ/N";
  }
}

TEST_F(ZeroStagesTest, Row4_CheckpointsHoldFullTensorsAndConsolidateAlikeForEveryStage) {
  std::vector<std::pair<std::string, int64_t>> layout0;
  int64_t file_bytes0 = -1;
  std::map<std::string, std::vector<float>> values0;
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = RunName("eq", stage, 2);
    ExpectSuccess(Run(stage, 2), name);
    auto m = loom::storage::ReadManifest(Dir(name) + "/" + loom::storage::StepDirName(kSteps), 1);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->zero_stage, stage);
    auto shards = Reassemble(Dir(name) + "/" + loom::storage::StepDirName(kSteps), 2,
                             "fp32_params");
    const std::string out = TmpDir() + "/export_" + name;
    auto res = loom::storage::Consolidate(Dir(name), kSteps, out);
    ASSERT_TRUE(res.ok()) << name << ": " << res.status();
    auto reader = loom::safetensors::Reader::Open(res->safetensors_path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<std::pair<std::string, int64_t>> layout;
    std::map<std::string, std::vector<float>> values;
    for (const auto& t : (*reader)->tensors()) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      layout.emplace_back(t.name, numel);
      absl::StatusOr<std::string> bytes = (*reader)->ReadTensor(t.name);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      ASSERT_GT(numel, 0) << name << " " << t.name << " is empty";
      ASSERT_EQ(static_cast<int64_t>(bytes->size()), numel * 4) << name << " " << t.name;
      std::vector<float> v(numel);
      std::memcpy(v.data(), bytes->data(), bytes->size());
      EXPECT_EQ(v, shards.at(t.name)) << name << " " << t.name << " differs from the shards";
      double max_abs = 0;
      for (float x : v) max_abs = std::max(max_abs, double(std::abs(x)));
      EXPECT_GT(max_abs, 0) << name << " " << t.name << " is all zeros";
      values[t.name] = std::move(v);
    }
    EXPECT_EQ(layout.size(), ParamNumels().size());
    if (stage == 0) {
      layout0 = layout;
      file_bytes0 = res->safetensors_bytes;
      values0 = values;
    } else {
      EXPECT_EQ(layout, layout0) << "stage " << stage << " export layout differs from stage 0";
      EXPECT_EQ(res->safetensors_bytes, file_bytes0) << "stage " << stage;
      CompareParams(values0, values, absl::StrCat("export of stage ", stage));
    }
  }
}

TEST_F(ZeroStagesTest, ResumeEqualsUninterruptedRunForEveryStage) {
  const std::string step3 = "/" + loom::storage::StepDirName(3);
  const std::string step6 = "/" + loom::storage::StepDirName(kSteps);
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = RunName("eq", stage, 2), resumed = RunName("resumed", stage, 2);
    const GangResult& full = Run(stage, 2);
    ExpectSuccess(full, name);
    // Same spec as the uninterrupted run (its variant's knobs).
    json spec = json::parse(*ReadText(TmpDir() + "/" + name + ".spec.json"));
    const std::string spec_path = TmpDir() + "/" + resumed + ".spec.json";
    std::ofstream(spec_path) << spec.dump(2);
    GangResult r = RunGang(resumed, spec_path, 2,
                           {"--checkpoint_dir=" + Dir(resumed), "--resume_from=" + Dir(name) + step3});
    ExpectSuccess(r, resumed);
    std::vector<double> a = Losses(full, "step"), b = Losses(r, "step");
    ASSERT_EQ(b.size(), 3u) << resumed;
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[i + 3]) << resumed << " step " << i + 4;
    for (const char* section : {"fp32_params", "exp_avg", "exp_avg_sq"}) {
      auto x = Reassemble(Dir(name) + step6, 2, section);
      auto y = Reassemble(Dir(resumed) + step6, 2, section);
      ASSERT_EQ(x.size(), ParamNumels().size());
      for (const auto& [pname, v] : x) {
        EXPECT_EQ(v, y[pname]) << resumed << " " << section << " " << pname
                               << " differs after resume (bit-exact)";
      }
    }
  }
  // Another world size is refused, naming both sizes.
  GangResult bad = RunGang("resume_w4", Spec("resume_w4", 4, kSteps, Knobs(1, 1)), 4,
                           {"--resume_from=" + Dir(RunName("eq", 1, 2)) + step3});
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(bad.exit_codes[rank], 1) << rank;
    std::vector<json> errors = bad.Of(rank, "error");
    ASSERT_EQ(errors.size(), 1u) << rank;
    const std::string msg = errors[0]["message"];
    EXPECT_NE(msg.find("world size 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world size 4"), std::string::npos) << msg;
  }
}

TEST_F(ZeroStagesTest, Bf16LossTrajectoriesAgreeAcrossStages) {
  const GangResult& ref = bf16_->at({0, 1});
  ExpectSuccess(ref, "bf16_s0_w1");
  const std::vector<double> ref_loss = Losses(ref, "step");
  const std::vector<double> fp32_loss = Losses(Run(0, 1), "step");
  ASSERT_EQ(ref_loss.size(), static_cast<size_t>(kSteps));
  double worst = 0, worst_fp32 = 0;
  for (size_t i = 0; i < ref_loss.size(); ++i) {
    worst_fp32 = std::max(worst_fp32, std::abs(ref_loss[i] - fp32_loss[i]) / fp32_loss[i]);
    EXPECT_NEAR(ref_loss[i], fp32_loss[i], 2e-2 * fp32_loss[i]) << "bf16 vs fp32 step " << i;
  }
  for (auto& [key, r] : *bf16_) {
    const std::string name = RunName("bf16", key.first, key.second);
    ExpectSuccess(r, name);
    ExpectSameCollectives(r, name);
    std::vector<double> loss = Losses(r, "step");
    ASSERT_EQ(loss.size(), ref_loss.size()) << name;
    for (size_t i = 0; i < loss.size(); ++i) {
      worst = std::max(worst, std::abs(loss[i] - ref_loss[i]) / ref_loss[i]);
      EXPECT_NEAR(loss[i], ref_loss[i], 1e-2 * ref_loss[i]) << name << " step " << i + 1;
    }
  }
  std::cout << "bf16: max relative loss difference across stages/world sizes " << worst
            << ", bf16 vs fp32 " << worst_fp32 << "\n";
}

}  // namespace
