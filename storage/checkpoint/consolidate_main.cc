// loom-consolidate: offline consolidation of one Loom ZeRO-3 checkpoint into a Hugging Face model
// directory (storage/checkpoint/consolidate.h), without the service. Used by the memory-cap and
// crash tests and by the benchmark; also handy on a machine that only has the checkpoint files.
//
//   loom-consolidate --checkpoint_dir=DIR [--step=0] [--output_dir=D] [--max_shard_size=5GB]
//                    [--dtype=fp32|bf16] [--io_buffer_bytes=4194304] [--verify_checksums=true]
//                    [--report_memory]
//
// Prints one JSON line {"step", "files", "num_tensors", "safetensors_bytes", "seconds"} on success
// (plus "vm_peak_bytes" and "rss_peak_bytes" from /proc/self/status with --report_memory).
// Exit status: 0 OK, 2 usage error, otherwise the absl::StatusCode of the failure.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "storage/checkpoint/consolidate.h"

ABSL_FLAG(std::string, checkpoint_dir, "", "A job's checkpoint directory (holds step_* dirs).");
ABSL_FLAG(int64_t, step, 0, "Step to consolidate (0 = newest committed).");
ABSL_FLAG(std::string, output_dir, "",
          "Output directory (default <checkpoint_dir>/step_N/hf, or .../hf-bf16 for --dtype=bf16).");
ABSL_FLAG(std::string, max_shard_size, "", "Split into shards of at most this size (\"5GB\").");
ABSL_FLAG(std::string, dtype, "fp32", "Output dtype: fp32 or bf16.");
ABSL_FLAG(int64_t, io_buffer_bytes, 4 << 20, "Bytes of a shard mapped at a time (checksums and copies).");
ABSL_FLAG(bool, verify_checksums, true, "Check every shard's CRC-32 before writing.");
ABSL_FLAG(bool, checksum_before_writing, false,
          "Full CRC-32 pass before writing (default: checksum the bytes as they are copied).");
ABSL_FLAG(int64_t, writeback_bytes, 32 << 20,
          "Start writeback of the output every this many bytes (0 = only the final fsync).");
ABSL_FLAG(bool, report_memory, false, "Add vm_peak_bytes / rss_peak_bytes to the output line.");

namespace {

// "VmPeak:   12345 kB" -> bytes; -1 if absent.
int64_t ProcStatusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line.substr(key.size() + 1), ' ', absl::SkipWhitespace());
    int64_t kb = 0;
    if (!parts.empty() && absl::SimpleAtoi(parts[0], &kb)) return kb * 1024;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "loom-consolidate: --checkpoint_dir is required\n");
    return 2;
  }
  loom::storage::ConsolidateOptions options;
  options.io_buffer_bytes = absl::GetFlag(FLAGS_io_buffer_bytes);
  options.verify_checksums = absl::GetFlag(FLAGS_verify_checksums);
  options.checksum_before_writing = absl::GetFlag(FLAGS_checksum_before_writing);
  options.writeback_bytes = absl::GetFlag(FLAGS_writeback_bytes);
  auto dtype = loom::storage::NormalizeOutputDtype(absl::GetFlag(FLAGS_dtype));
  auto shard = loom::storage::ParseShardSize(absl::GetFlag(FLAGS_max_shard_size));
  if (!dtype.ok() || !shard.ok()) {
    std::fprintf(stderr, "loom-consolidate: %s\n",
                 std::string((!dtype.ok() ? dtype.status() : shard.status()).message()).c_str());
    return 2;
  }
  options.dtype = *dtype;
  options.max_shard_size_bytes = *shard;
  auto result = loom::storage::Consolidate(dir, absl::GetFlag(FLAGS_step),
                                           absl::GetFlag(FLAGS_output_dir), options);
  if (!result.ok()) {
    std::fprintf(stderr, "loom-consolidate: %s\n", result.status().ToString().c_str());
    return static_cast<int>(result.status().code());
  }
  nlohmann::json out = {{"step", result->step},
                        {"files", result->files},
                        {"index", result->index_path},
                        {"num_tensors", result->num_tensors},
                        {"safetensors_bytes", result->safetensors_bytes},
                        {"seconds", result->seconds}};
  if (absl::GetFlag(FLAGS_report_memory)) {
    out["vm_peak_bytes"] = ProcStatusBytes("VmPeak");
    out["rss_peak_bytes"] = ProcStatusBytes("VmHWM");
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
