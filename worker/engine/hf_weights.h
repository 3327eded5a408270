// Reading a Hugging Face export (what `loomctl consolidate` writes) to initialise a model for
// fine-tuning: `model.safetensors`, or shards listed by `model.safetensors.index.json`
// ({"weight_map": {tensor name: file}}). No LibTorch: ranges are copied into fp32 buffers so that
// each rank reads only its own ZeRO-3 partition of every tensor.
#ifndef LOOM_WORKER_ENGINE_HF_WEIGHTS_H_
#define LOOM_WORKER_ENGINE_HF_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/safetensors/safetensors.h"

namespace loom::engine {

// Thread-safe after Open (the readers use pread).
class HfWeights {
 public:
  // NOT_FOUND if `dir` holds neither model.safetensors nor model.safetensors.index.json;
  // INVALID_ARGUMENT (naming the file) for a malformed index or safetensors file.
  static absl::StatusOr<std::unique_ptr<HfWeights>> Open(const std::string& dir);

  // Copies flat (row-major) elements [begin, begin + count) of tensor `name` into `dst` as fp32
  // (F32 as is, BF16 widened exactly). NOT_FOUND naming the tensor and directory if absent;
  // INVALID_ARGUMENT if its shape is not `shape` or its dtype is neither F32 nor BF16.
  absl::Status ReadRange(const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                         int64_t count, float* dst) const;

 private:
  HfWeights() = default;
  std::string dir_;
  std::map<std::string, std::unique_ptr<safetensors::Reader>> files_;  // by file name
  std::map<std::string, const safetensors::Reader*> by_tensor_;        // tensor -> its file
};

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_HF_WEIGHTS_H_
