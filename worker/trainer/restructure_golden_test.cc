// Golden-checkpoint test of the engine restructuring (issue 12): the same tiny fp32 job (2 ranks,
// GAS 2, clipping active, ZeRO stages 0-3 with buckets, overlap, prefetch and persistence knobs)
// must write checkpoint tensors BIT-IDENTICAL to the ones the pre-restructuring loom-trainer wrote
// (testdata/golden_ckpt/golden.json: per step, rank, section and parameter the SHA-256 of the raw
// fp32 partition bytes, plus the per-step losses), and the complete stage-3 step-3 checkpoint that
// the old binary wrote (testdata/golden_ckpt/stage3_step3/) must resume and train on to the same
// step-6 tensors and losses.
//
// The files were written by the pre-restructuring binary (f7c9aa7) and matched bit for bit through
// the issue-12 restructuring and the Trainer split; they were regenerated twice since, on purpose:
// when the plain data-parallel path moved to the global-sample-index window order
// (train_samples.h), which changes the samples of this GAS-2 job from micro-step 1 on; and when
// the in-memory optimizer of fp32 CPU partitions moved to CpuAdam's fused kernel (optimizer.h),
// which changes the last bits of every step's update (losses from step 4 on differ by ~1e-7).
//
// They were regenerated a third time, on purpose, when Loom moved from Debian's LibTorch 1.13
// (OpenBLAS GEMMs) to PyPI's LibTorch 2.11 (MKL GEMMs, issue 51): every tensor's last bits and the
// losses from step 1 on (by ~1e-7) changed with the BLAS.
//
// MKL and ATen's vectorised kernels both pick their code path by CPU at load time, and different
// paths round differently. The files were written with the AVX2 paths of both, so the test pins
// them for the trainers it starts (MKL_CBWR=AVX2: MKL's conditional numerical reproducibility;
// ATEN_CPU_CAPABILITY=avx2), which every x86-64 CPU this project runs on can execute, Intel or
// AMD; a value already in the environment is left as it is.
//
// Generate mode (scripts/make_golden_ckpt.sh): with
// LOOM_GOLDEN_OUT=<absolute dir> the test writes golden.json and stage3_step3/ there instead of
// comparing.
#include <openssl/sha.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/shard_format.h"
#include "worker/trainer/gang_test_util.h"

namespace {

using namespace loom::trainer_test;  // NOLINT: test helpers
namespace fs = std::filesystem;

constexpr int kWorld = 2;
constexpr int kSteps = 6;
constexpr int kInterval = 3;

std::string Hex(const unsigned char* d, size_t n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(k[d[i] >> 4]);
    s.push_back(k[d[i] & 15]);
  }
  return s;
}

std::string Sha256(const float* data, int64_t numel) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data), numel * sizeof(float), md);
  return Hex(md, sizeof(md));
}

// {rank: {section: {param: sha256}}} of one checkpoint step directory.
json HashStep(const std::string& step_dir) {
  json out = json::object();
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<loom::storage::ShardManifest> m = loom::storage::ReadManifest(step_dir, r);
    EXPECT_TRUE(m.ok()) << step_dir << ": " << m.status();
    if (!m.ok()) return out;
    absl::StatusOr<std::vector<float>> data = loom::storage::ReadShardVerified(step_dir, *m);
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return out;
    json& rank = out[std::to_string(r)];
    for (const std::string& section : m->sections) {
      const int64_t base = *loom::storage::SectionOffset(*m, section);
      for (const loom::storage::ShardParam& p : m->params) {
        rank[section][p.name] =
            Sha256(data->data() + base + p.partition_offset, p.partition_numel);
      }
    }
  }
  return out;
}

// The tiny job: 2 layers, hidden 32, intermediate 64, 4 heads / 2 KV heads, vocab 256 (byte
// tokenizer); 6 steps, a checkpoint every 3.
std::string Spec(const std::string& name, int stage) {
  const std::string path = WriteSpec(name, /*micro=*/2, kSteps);
  json spec = json::parse(*ReadText(path));
  json& cfg = spec["model"]["config"];
  cfg["hidden_size"] = 32;
  cfg["intermediate_size"] = 64;
  cfg["max_position_embeddings"] = 32;
  spec["training"]["sequence_length"] = 16;
  spec["checkpoint"]["interval_steps"] = std::to_string(kInterval);
  spec["deepspeed_config"]["zero_optimization"] = {
      {"stage", stage},
      {"reduce_bucket_size", 4000},
      {"allgather_bucket_size", 6000},
      {"overlap_comm", stage != 3},
      {"contiguous_gradients", false},
      {"sub_group_size", 6000},
      {"stage3_prefetch_bucket_size", 4000},
      {"stage3_param_persistence_threshold", 100},
      {"stage3_max_live_parameters", 12000},
      {"stage3_max_reuse_distance", 2000}};
  std::ofstream(path) << spec.dump(2);
  return path;
}

std::string Dir(const std::string& name) { return TmpDir() + "/ckpt_" + name; }

void ExpectSuccess(const GangResult& r, const std::string& name) {
  ASSERT_FALSE(r.timed_out) << name;
  for (size_t rank = 0; rank < r.exit_codes.size(); ++rank) {
    EXPECT_EQ(r.exit_codes[rank], 0)
        << name << " rank " << rank << " (see " << name << ".rank" << rank << ".stderr)";
  }
}

std::string GoldenDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir ? srcdir : ".", "/loom/worker/trainer/testdata/golden_ckpt");
}

// Every (rank, section, parameter) hash of `got` equals `want`; the key sets are equal.
void ExpectSameHashes(const json& want, const json& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  int compared = 0;
  for (auto r = want.begin(); r != want.end(); ++r) {
    ASSERT_TRUE(got.contains(r.key())) << what << " rank " << r.key();
    for (auto s = r->begin(); s != r->end(); ++s) {
      ASSERT_TRUE(got[r.key()].contains(s.key())) << what << " section " << s.key();
      const json& g = got[r.key()][s.key()];
      EXPECT_EQ(g.size(), s->size()) << what << " " << s.key();
      for (auto p = s->begin(); p != s->end(); ++p) {
        EXPECT_EQ(g.value(p.key(), std::string("missing")), p->get<std::string>())
            << what << ": rank " << r.key() << " " << s.key() << " " << p.key()
            << " is not bit-identical to the golden checkpoint";
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0) << what;
}

// The kernels the golden files were written with (see the top of the file), for the trainers
// this test starts.
void PinGoldenKernels() {
  setenv("MKL_CBWR", "AVX2", /*overwrite=*/0);
  setenv("ATEN_CPU_CAPABILITY", "avx2", /*overwrite=*/0);
}

TEST(RestructureGoldenTest, CheckpointsBitIdenticalToPreRestructuringBinaryAndGoldenResumes) {
  PinGoldenKernels();
  const char* out = std::getenv("LOOM_GOLDEN_OUT");
  const bool generate = out != nullptr && *out != '\0';
  json golden;
  if (!generate) {
    std::optional<std::string> text = ReadText(GoldenDir() + "/golden.json");
    ASSERT_TRUE(text.has_value());
    golden = json::parse(*text);
  }
  json produced = json::object();
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = absl::StrCat("golden_s", stage);
    GangResult r = RunGang(name, Spec(name, stage), kWorld, {"--checkpoint_dir=" + Dir(name)});
    ExpectSuccess(r, name);
    json& st = produced[std::to_string(stage)];
    st["losses"] = Losses(r, "step");
    ASSERT_EQ(st["losses"].size(), static_cast<size_t>(kSteps)) << name;
    for (int step : {kInterval, kSteps}) {
      st["steps"][std::to_string(step)] =
          HashStep(Dir(name) + "/" + loom::storage::StepDirName(step));
    }
    if (generate) continue;
    const json& g = golden.at(std::to_string(stage));
    EXPECT_EQ(st["losses"], g.at("losses")) << name << ": losses differ bit-wise";
    for (int step : {kInterval, kSteps}) {
      ExpectSameHashes(g.at("steps").at(std::to_string(step)),
                       st["steps"][std::to_string(step)], absl::StrCat(name, " step ", step));
    }
  }
  if (generate) {
    fs::create_directories(out);
    std::ofstream(std::string(out) + "/golden.json") << produced.dump(1) << "\n";
    const fs::path dst = fs::path(out) / "stage3_step3";
    fs::create_directories(dst);
    for (const auto& e :
         fs::directory_iterator(Dir("golden_s3") + "/" + loom::storage::StepDirName(kInterval))) {
      fs::copy_file(e.path(), dst / e.path().filename(), fs::copy_options::overwrite_existing);
    }
    std::cout << "wrote golden checkpoints to " << out << "\n";
    return;
  }
  // The stage-3 checkpoint written by the old binary resumes under the new code and trains on to
  // the old binary's step-6 tensors and losses.
  const std::string name = "golden_resume_s3";
  GangResult r = RunGang(name, Spec(name, 3), kWorld,
                         {"--checkpoint_dir=" + Dir(name), "--resume_from=" + GoldenDir() +
                                                               "/stage3_step3"});
  ExpectSuccess(r, name);
  const json& g = golden.at("3");
  std::vector<double> losses = Losses(r, "step");
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps - kInterval)) << name;
  for (int i = 0; i < kSteps - kInterval; ++i) {
    EXPECT_EQ(losses[i], g.at("losses")[kInterval + i].get<double>()) << name << " step "
                                                                      << kInterval + i + 1;
  }
  ExpectSameHashes(g.at("steps").at(std::to_string(kSteps)),
                   HashStep(Dir(name) + "/" + loom::storage::StepDirName(kSteps)),
                   name + " step 6");
}

}  // namespace
