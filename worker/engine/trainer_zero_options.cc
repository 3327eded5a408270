#include "worker/engine/trainer_zero_options.h"

#include <string>

namespace loom::engine {

ZeroOptions ZeroOptionsFor(const spec::DeepSpeedConfig& ds, const ProcessGroups& groups) {
  ZeroOptions z;
  z.stage = ds.zero.stage;
  z.param_dtype = ds.bf16_enabled ? at::kBFloat16 : ds.fp16.enabled ? at::kHalf : at::kFloat;
  z.reduce_bucket_size = ds.zero.reduce_bucket_size;
  z.allgather_bucket_size = ds.zero.allgather_bucket_size;
  z.contiguous_gradients = ds.zero.contiguous_gradients;
  z.overlap_comm = ds.zero.overlap_comm_effective();
  z.prefetch_bucket_size = ds.zero.stage3_prefetch_bucket_size;
  z.param_persistence_threshold = ds.zero.stage3_param_persistence_threshold;
  z.max_live_parameters = ds.zero.stage3_max_live_parameters;
  z.max_reuse_distance = ds.zero.stage3_max_reuse_distance;
  z.gradient_divide_factor = groups.zero_partition().grad_divide_factor;
  // communication_data_type (validated and canonicalised by ds_config_communication.cc); ""
  // leaves kUndefined: the provider's default (bf16 for bf16 jobs, fp32 otherwise).
  const std::string& comm = ds.communication_data_type;
  if (comm == "fp32") z.communication_dtype = at::kFloat;
  if (comm == "bf16") z.communication_dtype = at::kBFloat16;
  if (comm == "fp16") z.communication_dtype = at::kHalf;
  return z;
}

}  // namespace loom::engine
