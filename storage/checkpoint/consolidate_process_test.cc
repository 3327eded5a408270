// The loom-consolidate binary on a 256 MB checkpoint: it consolidates under an address-space cap
// far below the checkpoint size (streaming, bounded memory), and a `kill -9` in the middle leaves
// nothing at the final names, after which a rerun completes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "storage/checkpoint/shard_format.h"
#include "storage/checkpoint/verify.h"
#include "storage/safetensors/safetensors.h"
#include "tests/testing/subprocess.h"

namespace loom::storage {
namespace {

constexpr int kTensors = 16;
constexpr int64_t kRows = 2048, kCols = 2048;  // 16 MiB of fp32 per tensor, 256 MiB in all

std::string Tmp() { return std::getenv("TEST_TMPDIR"); }

// Value of element `i` of tensor `t`: exact in fp32 and distinct across tensors.
float Value(int t, int64_t i) { return static_cast<float>(t * 1000003 + (i % 8388608)); }

void WriteBigCheckpoint(const std::string& dir, int tensors, int64_t rows) {
  for (int32_t r = 0; r < 2; ++r) {
    ShardManifest m;
    m.step = 1;
    m.rank = r;
    m.world_size = 2;
    m.model_config_json = R"({"model_type":"llama","tie_word_embeddings":false})";
    for (int t = 0; t < tensors; ++t) {
      m.params.push_back({absl::StrCat("model.layers.", t, ".mlp.up_proj.weight"), {rows, kCols},
                          rows * kCols});
    }
    AssignPartitionLayout(m);
    std::vector<float> section(static_cast<size_t>(m.section_numel));
    for (int t = 0; t < tensors; ++t) {
      const ShardParam& p = m.params[t];
      for (int64_t k = 0; k < p.partition_numel; ++k) {
        section[p.partition_offset + k] = Value(t, r * p.partition_numel + k);
      }
    }
    const float* ptr = section.data();
    ASSERT_TRUE(WriteShard(absl::StrCat(dir, "/step_00000001"), m, absl::MakeConstSpan(&ptr, 1))
                    .ok());
  }
}

struct Outcome {
  int wait_status = 0;
  std::string output;
};

// Runs loom-consolidate with `args` under RLIMIT_AS = `as_limit` (0 = none) and waits.
Outcome RunTool(const std::vector<std::string>& args, rlim_t as_limit, const std::string& log) {
  std::vector<std::string> argv = {testing::RunfilePath("storage/checkpoint/loom-consolidate")};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (as_limit > 0) {
      struct rlimit rl = {as_limit, as_limit};
      if (::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(120);
    }
    ::execv(cargv[0], cargv.data());
    ::_exit(121);
  }
  Outcome out;
  ::waitpid(pid, &out.wait_status, 0);
  out.output = *ReadFile(log);
  return out;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

class ConsolidateProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    WriteBigCheckpoint(Tmp() + "/big", kTensors, kRows);
    WriteBigCheckpoint(Tmp() + "/tiny", 1, 2);
  }
};

TEST_F(ConsolidateProcessTest, StreamsUnderAnAddressSpaceCapFarBelowTheCheckpointSize) {
  const int64_t checkpoint_bytes = int64_t{kTensors} * kRows * kCols * 4;
  // Baseline: the binary's peak virtual memory on a tiny checkpoint (same buffers, no data).
  Outcome base = RunTool({"--checkpoint_dir=" + Tmp() + "/tiny", "--report_memory"}, 0,
                         Tmp() + "/base.log");
  ASSERT_TRUE(WIFEXITED(base.wait_status) && WEXITSTATUS(base.wait_status) == 0) << base.output;
  nlohmann::json b = nlohmann::json::parse(base.output);
  const int64_t baseline_vm = b["vm_peak_bytes"].get<int64_t>();
  ASSERT_GT(baseline_vm, 0);
  const int64_t cap = baseline_vm + (32 << 20);
  std::printf("baseline VmPeak %lld bytes; cap %lld bytes; checkpoint %lld bytes\n",
              static_cast<long long>(baseline_vm), static_cast<long long>(cap),
              static_cast<long long>(checkpoint_bytes));
  ASSERT_LT(cap, checkpoint_bytes / 2) << "the cap would not prove anything";

  // Control: the same cap stops a run that maps a whole shard (half the checkpoint) at once: the
  // checksum pass before writing with chunks as large as the checkpoint.
  Outcome control = RunTool({"--checkpoint_dir=" + Tmp() + "/big",
                             "--output_dir=" + Tmp() + "/control", "--checksum_before_writing",
                             absl::StrCat("--io_buffer_bytes=", checkpoint_bytes)},
                            static_cast<rlim_t>(cap), Tmp() + "/control.log");
  EXPECT_FALSE(WIFEXITED(control.wait_status) && WEXITSTATUS(control.wait_status) == 0)
      << control.output;

  // The streaming run succeeds under the cap, sharded and in bf16 too.
  const std::string out = Tmp() + "/capped";
  Outcome run = RunTool({"--checkpoint_dir=" + Tmp() + "/big", "--output_dir=" + out,
                         "--report_memory"},
                        static_cast<rlim_t>(cap), Tmp() + "/capped.log");
  ASSERT_TRUE(WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0) << run.output;
  nlohmann::json r = nlohmann::json::parse(run.output);
  EXPECT_LE(r["vm_peak_bytes"].get<int64_t>(), cap);
  EXPECT_LT(r["rss_peak_bytes"].get<int64_t>(), checkpoint_bytes / 8);
  auto report = VerifyPath(out);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->num_tensors, kTensors);
  EXPECT_EQ(report->tensor_bytes, checkpoint_bytes);
  auto reader = safetensors::Reader::Open(out + "/model.safetensors");
  ASSERT_TRUE(reader.ok());
  for (int t : {0, 7, 15}) {
    const auto* e = (*reader)->Find(absl::StrCat("model.layers.", t, ".mlp.up_proj.weight"));
    ASSERT_NE(e, nullptr);
    for (int64_t i : {int64_t{0}, kRows * kCols / 2 - 1, kRows * kCols / 2, kRows * kCols - 1}) {
      float v = 0;
      ASSERT_TRUE((*reader)->ReadTensorRange(*e, i * 4, &v, 4).ok());
      EXPECT_EQ(v, Value(t, i)) << t << "[" << i << "]";
    }
  }

  Outcome sharded = RunTool({"--checkpoint_dir=" + Tmp() + "/big",
                             "--output_dir=" + Tmp() + "/capped_sharded", "--dtype=bf16",
                             "--max_shard_size=40MB"},
                            static_cast<rlim_t>(cap), Tmp() + "/capped_sharded.log");
  ASSERT_TRUE(WIFEXITED(sharded.wait_status) && WEXITSTATUS(sharded.wait_status) == 0)
      << sharded.output;
  auto sharded_report = VerifyPath(Tmp() + "/capped_sharded");
  ASSERT_TRUE(sharded_report.ok()) << sharded_report.status();
  // bf16 tensors are 8 MiB (8,388,608 bytes): four per 40 MB file -> index + 4 files.
  EXPECT_EQ(sharded_report->files.size(), 1u + 4u);
  EXPECT_EQ(sharded_report->tensor_bytes, checkpoint_bytes / 2);
}

TEST_F(ConsolidateProcessTest, KillDuringConsolidationLeavesNothingAndRerunCompletes) {
  const std::string out = Tmp() + "/killed";
  ASSERT_TRUE(MakeDirs(out).ok());
  auto proc = testing::Subprocess::Start(
      {testing::RunfilePath("storage/checkpoint/loom-consolidate"),
       "--checkpoint_dir=" + Tmp() + "/big", "--output_dir=" + out, "--dtype=bf16",
       "--io_buffer_bytes=65536"},
      Tmp() + "/killed.log");
  ASSERT_TRUE(proc.ok()) << proc.status();
  const std::string tmp_file = absl::StrCat(out, "/.consolidate.tmp.", proc->pid(),
                                            "/model.safetensors.tmp.", proc->pid());
  // Wait until the output is partly written, then kill -9.
  const int64_t full = int64_t{kTensors} * kRows * kCols * 2;
  int64_t seen = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    struct stat st;
    if (::stat(tmp_file.c_str(), &st) == 0 && st.st_size > (8 << 20)) {
      seen = st.st_size;
      break;
    }
    ASSERT_TRUE(proc->Running()) << "finished before it could be killed: "
                                 << testing::Tail(proc->log_path());
    absl::SleepFor(absl::Microseconds(500));
  }
  proc->Kill();
  std::printf("killed with %lld of %lld output bytes written\n", static_cast<long long>(seen),
              static_cast<long long>(full));
  ASSERT_GT(seen, 0);
  ASSERT_LT(seen, full) << "the kill must land mid-way";
  EXPECT_FALSE(Exists(out + "/model.safetensors"));
  EXPECT_FALSE(Exists(out + "/config.json"));
  EXPECT_FALSE(Exists(out + "/model.safetensors.index.json"));
  EXPECT_EQ(VerifyPath(out).status().code(), absl::StatusCode::kNotFound);

  Outcome rerun = RunTool({"--checkpoint_dir=" + Tmp() + "/big", "--output_dir=" + out,
                           "--dtype=bf16"},
                          0, Tmp() + "/rerun.log");
  ASSERT_TRUE(WIFEXITED(rerun.wait_status) && WEXITSTATUS(rerun.wait_status) == 0)
      << rerun.output;
  auto report = VerifyPath(out);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->tensor_bytes, full);
  EXPECT_TRUE(Exists(out + "/config.json"));
  // The dead run's staging directory is gone.
  EXPECT_FALSE(Exists(absl::StrCat(out, "/.consolidate.tmp.", proc->pid())));
}

}  // namespace
}  // namespace loom::storage
