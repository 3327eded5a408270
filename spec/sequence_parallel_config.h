// The cross-field preconditions of Ulysses sequence parallelism (docs/design/TECHNIQUES.md §3.1;
// DeepSpeed's UlyssesSPAttentionHF checks), shared by the scheduler's spec validation and the
// trainer so a job is refused at submission, not when its ranks start. Torch-free.
//
// With P = deepspeed_config.sequence_parallel_size (P dividing the world size is checked by
// ParseDeepSpeedConfig):
//   * model.config.num_attention_heads % P == 0 (every rank gets H/P query heads);
//   * model.config.num_key_value_heads % P == 0, or P % num_key_value_heads == 0 (KV heads are
//     split, or replicated P/Hkv times when there are fewer than P);
//   * training.sequence_length % P == 0 (contiguous equal chunks of S/P tokens).
// (sequence_length <= max_position_embeddings is checked for every job, naming both numbers.)
// Errors: INVALID_ARGUMENT naming the field and the numbers. Pure; thread-safe.
#ifndef LOOM_SPEC_SEQUENCE_PARALLEL_CONFIG_H_
#define LOOM_SPEC_SEQUENCE_PARALLEL_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace loom::spec {

absl::Status CheckSequenceParallelHeads(int64_t num_heads, int64_t num_kv_heads, int64_t sp_size);

absl::Status ValidateSequenceParallel(int64_t num_heads, int64_t num_kv_heads,
                                      int64_t sequence_length, int64_t sp_size);

}  // namespace loom::spec

#endif  // LOOM_SPEC_SEQUENCE_PARALLEL_CONFIG_H_
