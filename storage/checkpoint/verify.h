// Offline verification of checkpoint outputs and inputs, used by `loomctl checkpoint verify` (no
// service needed) and tests. No LibTorch, no gRPC.
//
// Rules checked (docs/design/TECHNIQUES.md §5.3, §5.4 item 3; safetensors tensor.rs
// Metadata::validate):
//   safetensors file   8-byte little-endian header length N with N <= 100,000,000 and 8 + N <= file
//                      size; the header starts with '{' and any padding after the JSON object is
//                      spaces (0x20) only; N is a multiple of 8 (the reference writer's padding, so
//                      the data buffer is 8-byte aligned); the JSON is a valid header (known dtypes,
//                      string-only __metadata__, no duplicate names); tensors sorted by offset begin
//                      at 0, each begins where the previous ended (no gaps, no overlaps), each has
//                      exactly dtype bits x prod(shape) / 8 bytes, and the data buffer ends exactly
//                      at the end of the file (no trailing bytes).
//   sharded directory  model.safetensors.index.json is {"metadata": {"total_size": int},
//                      "weight_map": {name: file}}; every file it names is a plain file name that
//                      exists and is itself valid; every tensor of those files is in weight_map,
//                      mapped to the file that holds it, and in exactly one file; every weight_map
//                      entry is in its file; total_size = sum of tensor bytes; no
//                      model-*-of-*.safetensors file in the directory is left out of the index.
//   Loom step dir      (step_<8 digits> with rank manifests) VerifyCheckpointDir: all ranks
//                      reported, manifests agree, every shard's size and CRC-32 match (names file
//                      and rank).
// Errors name the first problem found, with the file and, where there is one, the tensor:
//   INVALID_ARGUMENT a format rule is broken; DATA_LOSS a file is shorter than its header says, a
//   shard fails its checksum, or a file the index names is missing; FAILED_PRECONDITION a
//   checkpoint whose ranks have not all reported; NOT_FOUND `path` does not exist or holds nothing
//   to verify. Thread-safe (no shared state).
#ifndef LOOM_STORAGE_CHECKPOINT_VERIFY_H_
#define LOOM_STORAGE_CHECKPOINT_VERIFY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::storage {

struct VerifyReport {
  // "safetensors", "sharded safetensors" or "loom checkpoint".
  std::string kind;
  std::vector<std::string> files;  // files checked (full paths)
  int64_t num_tensors = 0;         // tensors (safetensors) or parameters (loom checkpoint)
  int64_t tensor_bytes = 0;        // tensor data bytes (safetensors) or shard bytes (loom)
};

// One safetensors file.
absl::StatusOr<VerifyReport> VerifySafetensorsFile(const std::string& path);

// A safetensors file, a directory with model.safetensors.index.json (sharded) or
// model.safetensors, or a Loom checkpoint step directory (rank_*.manifest.json present).
absl::StatusOr<VerifyReport> VerifyPath(const std::string& path);

}  // namespace loom::storage

#endif  // LOOM_STORAGE_CHECKPOINT_VERIFY_H_
