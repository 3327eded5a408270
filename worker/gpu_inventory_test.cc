// ParseNvidiaSmiCsv against recorded nvidia-smi outputs of an 8x H100 80GB HBM3 node, an
// 8x H200 node and a 1x GH200 node (worker/testdata/nvidia_smi_*.csv), malformed lines, and
// DetectGpuInventory running a real executable standing in for nvidia-smi.
#include "worker/gpu_inventory.h"

#include <sys/stat.h>

#include <fstream>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using ::loom::testing::StatusIs;

const char kH100[] = "worker/testdata/nvidia_smi_8x_h100_80gb_hbm3.csv";
const char kH200[] = "worker/testdata/nvidia_smi_8x_h200.csv";
const char kGh200[] = "worker/testdata/nvidia_smi_1x_gh200.csv";

constexpr int64_t kMiB = 1024 * 1024;

TEST(GpuInventoryTest, EightH100) {
  absl::StatusOr<GpuInventory> inv = ReadGpuInventoryFile(kH100);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->kind, loom::v1::ACCELERATOR_KIND_H100);
  EXPECT_EQ(inv->model, "NVIDIA H100 80GB HBM3");
  ASSERT_EQ(inv->devices.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(inv->devices[i].index(), i);
    EXPECT_EQ(inv->devices[i].memory_bytes(), 81559 * kMiB);  // 85,520,809,984 bytes
    EXPECT_EQ(inv->devices[i].uuid().substr(0, 4), "GPU-");
    EXPECT_EQ(inv->devices[i].uuid().size(), 40u);
  }
  EXPECT_EQ(inv->devices[0].uuid(), "GPU-48f165d5-7b00-47f4-b81e-f86f5c8cc1ab");
  EXPECT_EQ(inv->devices[7].uuid(), "GPU-9a508bb1-f4c9-4a65-b868-e6d9ca0bc36c");
  EXPECT_EQ(inv->min_memory_bytes, 85520809984LL);

  loom::v1::NodeInventory node;
  node.set_slots(1);
  node.set_accelerator(loom::v1::ACCELERATOR_KIND_CPU);
  ApplyGpuInventory(*inv, &node);
  EXPECT_EQ(node.accelerator(), loom::v1::ACCELERATOR_KIND_H100);
  EXPECT_EQ(node.slots(), 8);
  EXPECT_EQ(node.accelerator_memory_bytes(), 85520809984LL);
  EXPECT_EQ(node.devices_size(), 8);
  EXPECT_FALSE(node.superchip());
}

TEST(GpuInventoryTest, EightH200) {
  absl::StatusOr<GpuInventory> inv = ReadGpuInventoryFile(kH200);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->kind, loom::v1::ACCELERATOR_KIND_H200);
  EXPECT_EQ(inv->model, "NVIDIA H200");
  ASSERT_EQ(inv->devices.size(), 8u);
  EXPECT_EQ(inv->min_memory_bytes, 143771 * kMiB);  // 140.4 GiB, "141 GB"
  EXPECT_EQ(inv->devices[3].index(), 3);
  EXPECT_EQ(inv->devices[3].uuid(), "GPU-fc45228f-4bd5-41b0-b41b-5669a0729b23");
}

TEST(GpuInventoryTest, OneGh200IsASuperchip) {
  absl::StatusOr<GpuInventory> inv = ReadGpuInventoryFile(kGh200);
  ASSERT_TRUE(inv.ok()) << inv.status();
  // "GH200" contains "H200": the GH200 must not be taken for an H200.
  EXPECT_EQ(inv->kind, loom::v1::ACCELERATOR_KIND_GH200);
  ASSERT_EQ(inv->devices.size(), 1u);
  EXPECT_EQ(inv->devices[0].memory_bytes(), 97871 * kMiB);  // 96 GB HBM3
  loom::v1::NodeInventory node;
  node.set_host_memory_bytes(480LL << 30);  // the Grace LPDDR5X, as the node reports it
  ApplyGpuInventory(*inv, &node);
  EXPECT_EQ(node.accelerator(), loom::v1::ACCELERATOR_KIND_GH200);
  EXPECT_EQ(node.slots(), 1);
  EXPECT_TRUE(node.superchip());
  EXPECT_EQ(node.host_memory_bytes(), 480LL << 30);
}

TEST(GpuInventoryTest, NoLinesIsACpuNode) {
  absl::StatusOr<GpuInventory> inv = ParseNvidiaSmiCsv("\n\n", "x");
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->kind, loom::v1::ACCELERATOR_KIND_CPU);
  EXPECT_TRUE(inv->devices.empty());
  loom::v1::NodeInventory node;
  node.set_slots(3);
  ApplyGpuInventory(*inv, &node);
  EXPECT_EQ(node.slots(), 3);
  EXPECT_EQ(node.devices_size(), 0);
}

TEST(GpuInventoryTest, MalformedLinesNameTheSourceAndLine) {
  const std::string good = "0, GPU-48f165d5-7b00-47f4-b81e-f86f5c8cc1ab, NVIDIA H100 80GB HBM3, 81559\n";
  struct Case {
    std::string second_line;
    absl::StatusCode code;
    std::string message;
  } cases[] = {
      {"1, GPU-aa, NVIDIA H100 80GB HBM3", absl::StatusCode::kInvalidArgument,
       "f.csv:2: expected 4 columns"},
      {"1, GPU-aa, NVIDIA H100 80GB HBM3, [N/A]", absl::StatusCode::kInvalidArgument,
       "f.csv:2: memory.total '[N/A]' is not a positive number of MiB"},
      {"1, GPU-aa, NVIDIA H100 80GB HBM3, 81559 MiB", absl::StatusCode::kInvalidArgument,
       "f.csv:2: memory.total '81559 MiB'"},
      {"-1, GPU-aa, NVIDIA H100 80GB HBM3, 81559", absl::StatusCode::kInvalidArgument,
       "f.csv:2: index '-1' is not a non-negative integer"},
      {"0, GPU-aa, NVIDIA H100 80GB HBM3, 81559", absl::StatusCode::kInvalidArgument,
       "f.csv:2: index 0 repeats"},
      {"1, 00000000:19:00.0, NVIDIA H100 80GB HBM3, 81559", absl::StatusCode::kInvalidArgument,
       "f.csv:2: uuid '00000000:19:00.0' does not start with GPU-"},
      {"1, GPU-aa, NVIDIA A100-SXM4-80GB, 81920", absl::StatusCode::kFailedPrecondition,
       "f.csv:2: accelerator 'NVIDIA A100-SXM4-80GB' is not a kind"},
      {"1, GPU-aa, NVIDIA H200, 143771", absl::StatusCode::kFailedPrecondition,
       "f.csv:2: accelerator 'NVIDIA H200' differs from line 1's"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseNvidiaSmiCsv(good + c.second_line + "\n", "f.csv"),
                StatusIs(c.code, c.message))
        << c.second_line;
  }
  EXPECT_THAT(ReadGpuInventoryFile("/nonexistent/nvidia_smi.csv"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/nvidia_smi.csv"));
}

std::string WriteScript(const std::string& name, const std::string& body) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(GpuInventoryTest, DetectRunsTheCommandWithTheQuery) {
  // A stand-in nvidia-smi that prints the recorded H200 output only when asked exactly
  // loom-worker's query.
  const std::string recorded = absl::StrCat(::getenv("TEST_SRCDIR"), "/",
                                            ::getenv("TEST_WORKSPACE"), "/", kH200);
  const std::string smi = WriteScript(
      "nvidia-smi-h200",
      absl::StrCat("[ \"$*\" = \"", kNvidiaSmiQuery, "\" ] || { echo bad args: $* >&2; exit 2; }\n",
                   "cat '", recorded, "'\n"));
  absl::StatusOr<GpuInventory> inv = DetectGpuInventory(smi);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->kind, loom::v1::ACCELERATOR_KIND_H200);
  EXPECT_EQ(inv->devices.size(), 8u);

  // nvidia-smi on a node whose driver sees no GPU: "No devices were found" on stdout, exit 6.
  absl::StatusOr<GpuInventory> none =
      DetectGpuInventory(WriteScript("nvidia-smi-none", "echo 'No devices were found' >&2\nexit 6\n"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->devices.empty());

  // No nvidia-smi at all: a CPU node, as before.
  absl::StatusOr<GpuInventory> absent = DetectGpuInventory("/nonexistent/nvidia-smi");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->kind, loom::v1::ACCELERATOR_KIND_CPU);
  absl::StatusOr<GpuInventory> not_on_path = DetectGpuInventory("loom-no-such-nvidia-smi");
  ASSERT_TRUE(not_on_path.ok());
  EXPECT_TRUE(not_on_path->devices.empty());

  // Output that is not the CSV: an error naming the executable.
  EXPECT_THAT(DetectGpuInventory(WriteScript("nvidia-smi-garbage", "echo hello\n")),
              StatusIs(absl::StatusCode::kInvalidArgument, "nvidia-smi-garbage:1:"));
}

}  // namespace
}  // namespace loom::worker
