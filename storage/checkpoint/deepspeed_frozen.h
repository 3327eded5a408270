// Frozen parameters (requires_grad=False) of a DeepSpeed ZeRO checkpoint, located in the
// model-states files without reading their bytes (internal to deepspeed_consolidate.cc).
//
// DeepSpeed's engine saves them in the model states (docs/design/TECHNIQUES.md §5.1;
// deepspeed/runtime/ engine.py _get_zero_frozen_param_attributes, for stage >= 2 unless
// exclude_frozen_parameters):
//   frozen_param_shapes     OrderedDict name -> torch.Size (the full shape), or None.
//   frozen_param_fragments  dict name -> tensor:
//     stage 1-2  the whole parameter (one mp_rank_00_model_states.pt), any shape;
//     stage 3    rank r's partition param.ds_tensor in zero_pp_rank_<r>_mp_rank_00_model_states.pt:
//                1-D, p = ceil(n / N) elements, rank r holding elements [r p, (r+1) p) of the
//                flattened parameter, the last ranks zero-padded.
// zero_to_fp32.py rebuilds them as _zero2_merge_frozen_params (the fragment as stored) and
// _zero3_merge_frozen_params (cat of the N fragments, first n elements, view(shape)); this gives
// the same elements as byte runs of the archives. Fragments may be F32, BF16 or F16 (the training
// dtype); the export widens them to F32 (exact), where zero_to_fp32 keeps their dtype.
//
// Errors, each naming the model-states file concerned:
//   FAILED_PRECONDITION  stage 3: a rank's model-states file is missing (names its path).
//   DATA_LOSS            a fragment's storage record is shorter than the fragment.
//   INVALID_ARGUMENT     frozen_param_shapes not a dict of torch.Size; frozen_param_fragments
//                        absent or lacking a listed parameter; a fragment that is not a tensor,
//                        not contiguous, of another dtype than F32/BF16/F16, or of the wrong
//                        number of elements (stage 1-2: numel of the shape; stage 3: ceil(n/N)),
//                        or whose dtype differs between ranks.
// Memory: one model-states pickle tree at a time, plus the pieces. Thread-compatible.
#ifndef LOOM_STORAGE_CHECKPOINT_DEEPSPEED_FROZEN_H_
#define LOOM_STORAGE_CHECKPOINT_DEEPSPEED_FROZEN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint/deepspeed_archive.h"
#include "storage/checkpoint/deepspeed_pickle.h"

namespace loom::storage::deepspeed {

// A run of `elements` elements of the fragment dtype at `byte_offset` of archives[file].
struct FrozenPiece {
  int file = 0;
  int64_t byte_offset = 0;
  int64_t elements = 0;
};

struct FrozenParam {
  std::string name;               // as in frozen_param_shapes (wrapper prefix not removed)
  std::vector<int64_t> shape;
  std::string dtype;              // "F32", "BF16" or "F16": the stored fragments' dtype
  std::vector<FrozenPiece> pieces;  // in element order; elements sum to numel(shape)
};

struct FrozenParams {
  std::vector<std::unique_ptr<TorchArchive>> archives;  // [0] = model0's; stage 3: rank order
  std::vector<FrozenParam> params;                      // frozen_param_shapes' order
};

// `model0` is the parsed pickle of `model0_archive` (mp_rank_00_model_states.pt for stage 1-2,
// zero_pp_rank_0_mp_rank_00_model_states.pt for stage 3); for stage 3 the other ranks' files are
// opened from `checkpoint_dir`. No frozen_param_shapes (absent, None or empty): no params.
absl::StatusOr<FrozenParams> ReadFrozenParams(std::unique_ptr<TorchArchive> model0_archive,
                                              const PyValue& model0, const std::string& checkpoint_dir,
                                              int zero_stage, int world_size);

// Bytes per element of a fragment dtype (4 for F32, 2 for BF16 and F16).
int FrozenElementBytes(const std::string& dtype);

// Widens `n` little-endian elements of `dtype` at `src` to fp32 at `dst` (exact: every bf16 and
// IEEE half value, subnormals, infinities and NaNs included, is an fp32 value).
void WidenToF32(const std::string& dtype, const char* src, int64_t n, float* dst);

}  // namespace loom::storage::deepspeed

#endif  // LOOM_STORAGE_CHECKPOINT_DEEPSPEED_FROZEN_H_
