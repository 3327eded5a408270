// `loomctl checkpoint verify PATH` runs offline (links the verification library): exit 0 for a
// valid file/dir, 3 with the first problem on stderr for an invalid one, 5 for nothing there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/safetensors/safetensors.h"
#include "tests/testing/subprocess.h"

namespace loom {
namespace {

struct CliRun {
  int code;
  std::string output;
};

CliRun Loomctl(const std::vector<std::string>& args) {
  static int n = 0;
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/loomctl_", n++, ".log");
  std::vector<std::string> argv = {testing::RunfilePath("services/cli/loomctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  // No cluster and no addresses: verify must not need the service.
  argv.push_back("--cluster_dir=/nonexistent");
  auto p = testing::Subprocess::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, ""};
  int status = p->Wait(absl::Seconds(30));
  return {testing::ExitCode(status), *ReadFile(log)};
}

TEST(LoomctlVerifyTest, ValidInvalidAndMissing) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/export");
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::vector<safetensors::TensorData> t = {{{"w", "F32", {2, 2}}, std::string(16, '\1')},
                                            {{"b", "BF16", {3}}, std::string(6, '\2')}};
  ASSERT_TRUE(safetensors::WriteFile(dir + "/model.safetensors", t).ok());

  CliRun ok = Loomctl({"checkpoint", "verify", dir});
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("OK " + dir + ": safetensors, 1 files, 2 tensors, 22 bytes"),
            std::string::npos)
      << ok.output;

  std::string bytes = *ReadFile(dir + "/model.safetensors");
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors", bytes + "xy").ok());
  CliRun bad = Loomctl({"checkpoint", "verify", dir + "/model.safetensors"});
  EXPECT_EQ(bad.code, 3) << bad.output;
  EXPECT_NE(bad.output.find("model.safetensors"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("2 trailing bytes"), std::string::npos) << bad.output;

  // A Loom step directory with a flipped byte: names the file and the rank.
  const std::string step_dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/job/step_00000005");
  storage::ShardManifest m;
  m.step = 5;
  m.world_size = 1;
  m.params = {{"w", {4}, 4}};
  storage::AssignPartitionLayout(m);
  std::vector<float> data = {1, 2, 3, 4};
  const float* ptr = data.data();
  ASSERT_TRUE(storage::WriteShard(step_dir, m, absl::MakeConstSpan(&ptr, 1)).ok());
  EXPECT_EQ(Loomctl({"checkpoint", "verify", step_dir}).code, 0);
  std::string shard = *ReadFile(step_dir + "/rank_0.shard");
  shard[0] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomically(step_dir + "/rank_0.shard", shard).ok());
  CliRun corrupt = Loomctl({"checkpoint", "verify", step_dir});
  EXPECT_EQ(corrupt.code, 3) << corrupt.output;
  EXPECT_NE(corrupt.output.find("rank_0.shard (rank 0): CRC-32"), std::string::npos)
      << corrupt.output;

  EXPECT_EQ(Loomctl({"checkpoint", "verify", dir + "/nope"}).code, 5);
  EXPECT_EQ(Loomctl({"checkpoint", "verify"}).code, 2);
}

// Regression (break-it pass, 2026-12-05): extra positional arguments were ignored silently
// (`loomctl get a b` showed job a). They are a usage error (exit 2) before anything connects.
TEST(LoomctlUsageTest, ExtraPositionalArgumentsAreRefused) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"get", "a", "b"},
                                             {"submit", "x.yaml", "y.yaml"},
                                             {"queues", "extra"},
                                             {"checkpoint", "verify", "/p", "/q"}}) {
    CliRun run = Loomctl(args);
    EXPECT_EQ(run.code, 2) << args[0] << ": " << run.output;
    EXPECT_NE(run.output.find("loomctl " + args[0] + ": unexpected argument '" + args.back() + "'"),
              std::string::npos)
        << run.output;
  }
}

}  // namespace
}  // namespace loom
