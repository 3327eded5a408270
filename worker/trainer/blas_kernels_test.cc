// blas_kernels.h: the choice table written out, and a real loom-trainer's report of the OpenBLAS
// core it runs, against this test process's own OpenBLAS detection (the test links LibTorch, so
// the same libblas.so.3 is loaded here with the environment Bazel gives it).
#include "worker/trainer/blas_kernels.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "worker/trainer/gang_test_util.h"

namespace loom::trainer {
namespace {

using trainer_test::ReadText;
using trainer_test::Spawn;
using trainer_test::TmpDir;
using trainer_test::TrainerPath;

TEST(BlasCoreTypeForTest, UpgradesOnlyThePrescottFallbackToWhatTheCpuRuns) {
  const CpuFeatures skx{/*avx512_skx=*/true, /*avx2_fma=*/true};
  const CpuFeatures hsw{/*avx512_skx=*/false, /*avx2_fma=*/true};
  const CpuFeatures old{/*avx512_skx=*/false, /*avx2_fma=*/false};
  EXPECT_EQ(BlasCoreTypeFor("Prescott", skx), "SKYLAKEX");
  EXPECT_EQ(BlasCoreTypeFor("PRESCOTT", skx), "SKYLAKEX");
  EXPECT_EQ(BlasCoreTypeFor("Prescott", hsw), "HASWELL");
  EXPECT_EQ(BlasCoreTypeFor("Prescott", old), std::nullopt);  // a CPU Prescott's kernels suit
  for (const char* known : {"SkylakeX", "Haswell", "Zen", "Cooperlake", "Sandybridge", ""}) {
    EXPECT_EQ(BlasCoreTypeFor(known, skx), std::nullopt) << known;
  }
}

// Runs loom-trainer with an invalid --rank (it exits at once with 78, after its BLAS report);
// returns its stderr.
std::string TrainerStderr(const std::string& name) {
  const std::string err = absl::StrCat(TmpDir(), "/", name, ".stderr");
  trainer_test::Child c = Spawn({TrainerPath(), "--rank=5", "--world_size=1"}, err);
  while (!c.eof) trainer_test::Pump(c, 1000);
  int status = 0;
  EXPECT_EQ(::waitpid(c.pid, &status, 0), c.pid);
  EXPECT_TRUE(WIFEXITED(status)) << name;
  EXPECT_EQ(WEXITSTATUS(status), 78) << name;
  return ReadText(err).value_or("");
}

std::string Lower(std::string s) {
  absl::AsciiStrToLower(&s);
  return s;
}

TEST(TrainerBlasKernelsTest, RunsTheUpgradedKernelsOnlyWhenOpenBlasFellBack) {
  const std::string detected = LoadedBlasCoreName();
  ASSERT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr) << "the test needs OpenBLAS's own choice";
  if (detected.empty()) {  // another BLAS (not what install_deps.sh installs): nothing to report
    const std::string out = Lower(TrainerStderr("not_openblas"));
    EXPECT_EQ(out.find("blas:"), std::string::npos) << out;
    return;
  }
  const std::optional<std::string> upgrade = BlasCoreTypeFor(detected, DetectCpuFeatures());
  const std::string out = Lower(TrainerStderr("auto"));
  const std::string want = Lower(upgrade.value_or(detected));
  EXPECT_NE(out.find("blas: openblas core " + want), std::string::npos)
      << "detected here: " << detected << "\n" << out;
  EXPECT_EQ(out.find("set by loom-trainer") != std::string::npos, upgrade.has_value()) << out;

  // An OPENBLAS_CORETYPE in the environment is kept, whatever it is.
  ::setenv("OPENBLAS_CORETYPE", detected.c_str(), 1);
  const std::string kept = Lower(TrainerStderr("explicit"));
  ::unsetenv("OPENBLAS_CORETYPE");
  EXPECT_NE(kept.find("blas: openblas core " + Lower(detected)), std::string::npos) << kept;
  EXPECT_EQ(kept.find("set by loom-trainer"), std::string::npos) << kept;
}

}  // namespace
}  // namespace loom::trainer
