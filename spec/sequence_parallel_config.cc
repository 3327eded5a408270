#include "spec/sequence_parallel_config.h"

#include "absl/strings/str_cat.h"

namespace loom::spec {

absl::Status CheckSequenceParallelHeads(int64_t num_heads, int64_t num_kv_heads,
                                        int64_t sp_size) {
  if (sp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("deepspeed_config.sequence_parallel_size: ", sp_size, " must be >= 1"));
  }
  if (num_heads % sp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.config.num_attention_heads: ", num_heads,
        " is not divisible by deepspeed_config.sequence_parallel_size ", sp_size,
        " (Ulysses gives every sequence-parallel rank H/P query heads)"));
  }
  if (num_kv_heads < 1 || (num_kv_heads % sp_size != 0 && sp_size % num_kv_heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.config.num_key_value_heads: ", num_kv_heads,
        " must be divisible by deepspeed_config.sequence_parallel_size ", sp_size,
        " or divide it (KV heads are split, or replicated when there are fewer than P)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSequenceParallel(int64_t num_heads, int64_t num_kv_heads,
                                      int64_t sequence_length, int64_t sp_size) {
  if (absl::Status s = CheckSequenceParallelHeads(num_heads, num_kv_heads, sp_size); !s.ok()) {
    return s;
  }
  if (sequence_length % sp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.sequence_length: ", sequence_length,
        " is not divisible by deepspeed_config.sequence_parallel_size ", sp_size,
        " (every sequence-parallel rank holds S/P contiguous tokens)"));
  }
  return absl::OkStatus();
}

}  // namespace loom::spec
