// deepspeed_config.sequence_parallel_size and seq_parallel_communication_data_type (DeepSpeed's
// keys for Ulysses sequence parallelism, docs/design/TECHNIQUES.md §3.1/§3.5; issue 13). Called
// from ParseDeepSpeedConfig before the batch sizes, which count data-parallel ranks (world / P).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {

absl::Status ParseSequenceParallel(const json& root, int world_size, DeepSpeedConfig* c) {
  int64_t sp = 1;
  RETURN_IF_ERROR(ReadInt(root, "sequence_parallel_size", kRoot, &sp));
  const std::string path = Join(kRoot, "sequence_parallel_size");
  if (sp < 1) return Invalid(path, absl::StrCat(sp, " must be >= 1"));
  if (world_size % sp != 0) {
    return Invalid(path, absl::StrCat(sp, " does not divide the world size ", world_size,
                                      " (the sequence-parallel groups are P consecutive ranks)"));
  }
  c->sequence_parallel_size = sp;
  std::string dtype;
  RETURN_IF_ERROR(ReadString(root, "seq_parallel_communication_data_type", kRoot, &dtype));
  if (dtype.empty() || dtype == "fp32" || dtype == "float32") {
    c->seq_parallel_communication_bf16 = false;
  } else if (dtype == "bf16" || dtype == "bfloat16") {
    c->seq_parallel_communication_bf16 = true;
  } else {
    return Invalid(Join(kRoot, "seq_parallel_communication_data_type"),
                   absl::StrCat("\"", dtype, "\" is not one of fp32, bf16"));
  }
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
