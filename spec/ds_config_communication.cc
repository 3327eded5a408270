// deepspeed_config.communication_data_type: the dtype gradients are reduced in (DeepSpeed's
// runtime/config.py get_communication_data_type: "fp32", "fp16" or "bf16", also spelled
// "float32" / "float16" / "bfloat16"; default the param dtype). Called from ParseDeepSpeedConfig
// after the precision sections (fp16 / bf16) and zero_optimization, which the checks refer to.
// Stores the canonical name in c->communication_data_type ("" when absent: ZeroProvider applies
// the default, bf16 for bf16 jobs and fp32 otherwise); ZeroOptionsFor (worker/engine/
// trainer_zero_options.cc) hands it to ZeroOptions::communication_dtype.
// Stage 0 reduces with an fp32 all-reduce (Collectives has no 16-bit all-reduce on the wire), so
// a 16-bit value with zero_optimization.stage 0 is refused rather than ignored.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {

absl::Status ParseCommunicationDataType(const json& root, DeepSpeedConfig* c) {
  std::string dtype;
  RETURN_IF_ERROR(ReadString(root, "communication_data_type", kRoot, &dtype));
  const std::string path = Join(kRoot, "communication_data_type");
  std::string parsed;
  if (dtype.empty()) {
    return absl::OkStatus();
  } else if (dtype == "fp32" || dtype == "float32") {
    parsed = "fp32";
  } else if (dtype == "bf16" || dtype == "bfloat16") {
    parsed = "bf16";
  } else if (dtype == "fp16" || dtype == "float16") {
    parsed = "fp16";
  } else {
    return Invalid(path, absl::StrCat("\"", dtype, "\" is not one of fp32, bf16, fp16"));
  }
  if (parsed != "fp32" && c->zero.stage == 0) {
    return Unsupported(path, absl::StrCat("\"", dtype,
                                          "\" with zero_optimization.stage 0 (its gradient "
                                          "all-reduce is fp32; use stage 1-3 or fp32)"));
  }
  c->communication_data_type = parsed;
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
