// An unpickler for the subset of Python's pickle that torch.save writes (protocol 2, as
// torch/serialization.py _save: dicts, OrderedDicts, lists, tuples, str, int, float, bool, None,
// torch.Size, tensors as torch._utils._rebuild_tensor_v2 over a persistent-id storage), plus the
// two DeepSpeed objects found in real ZeRO optimizer states: ZeroStageEnum (an int enum, read as
// its int, pickled as ZeroStageEnum(2) or, by Python 3.11+, getattr(ZeroStageEnum, "gradients"))
// and the fp16 loss scalers (kept as inert attribute dicts). Nothing is ever executed:
// each allowed GLOBAL is a fixed, named interpretation here; any other GLOBAL, and any opcode
// outside the subset, is INVALID_ARGUMENT naming the file, the byte and the global.
//
// Why not torch::jit::unpickle with a type resolver and a tensor callback (LibTorch 1.13 has it,
// torch/csrc/jit/serialization/pickle.h): linking libtorch_cpu makes the process ~151 MiB
// resident before main() runs (measured here: getrusage ru_maxrss of a program that only links
// it, 154,644 KiB), while a streaming consolidation must stay under 64 MiB. Tensors here record
// their storage key, dtype, offset, sizes and strides; no storage bytes are read.
//
// Memory: the tree of the pickled metadata (parameter names, shapes, small config dicts).
// Thread-compatible (pure function).
#ifndef LOOM_STORAGE_CHECKPOINT_DEEPSPEED_PICKLE_H_
#define LOOM_STORAGE_CHECKPOINT_DEEPSPEED_PICKLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::storage::deepspeed {

// A tensor as _rebuild_tensor_v2 describes it; its bytes live in record "data/<storage_key>".
struct TensorRef {
  std::string storage_key;   // e.g. "0"
  std::string dtype;         // safetensors name: "F32", "BF16", "F16", "F64", "I64", ...
  int element_bytes = 0;
  int64_t storage_numel = 0;   // elements of the storage
  int64_t storage_offset = 0;  // elements
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t numel() const;
  // Row-major contiguous (strides match sizes; size-1 dims ignored).
  bool contiguous() const;
};

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kTensor,
                    kStorage, kGlobal, kObject };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                 // kString, kBytes; kGlobal "module.name"
  std::vector<PyRef> items;                      // kList, kTuple
  std::vector<std::pair<PyRef, PyRef>> entries;  // kDict (insertion order); kObject attributes
  TensorRef tensor;                              // kTensor, kStorage (storage fields only)

  bool is(Kind k) const { return kind == k; }
  // kDict: the value under string key `key`, or nullptr.
  const PyValue* Get(absl::string_view key) const;
};

// Parses `bytes` (a data.pkl). `file` names the archive in errors ("<file>: data.pkl: ...").
absl::StatusOr<PyRef> Unpickle(absl::string_view bytes, absl::string_view file);

// "<kind>" for messages ("dict", "list", "tensor", ...).
const char* KindName(PyValue::Kind kind);

}  // namespace loom::storage::deepspeed

#endif  // LOOM_STORAGE_CHECKPOINT_DEEPSPEED_PICKLE_H_
