// deepspeed_config.communication_data_type: the dtype gradients are reduced in (DeepSpeed's
// runtime/config.py get_communication_data_type: "fp32", "fp16" or "bf16"; default the param
// dtype). Called from ParseDeepSpeedConfig after the precision sections (fp16 / bf16), since the
// default depends on them. ZeroProvider applies the default itself (ZeroOptions::
// communication_dtype, kUndefined: bf16 for bf16 jobs, fp32 otherwise), so the value the job
// gets is the parsed one only when it equals that default; any other value is refused until the
// trainer hands the parsed value to ZeroOptions (one line in ZeroOptionsFrom, engine.cc), so the
// parser only validates and stores nothing.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {

absl::Status ParseCommunicationDataType(const json& root, const DeepSpeedConfig* c) {
  std::string dtype;
  RETURN_IF_ERROR(ReadString(root, "communication_data_type", kRoot, &dtype));
  const std::string path = Join(kRoot, "communication_data_type");
  enum class Dtype { kFp32, kBf16, kFp16 };
  Dtype parsed;
  if (dtype.empty()) {
    return absl::OkStatus();
  } else if (dtype == "fp32" || dtype == "float32") {
    parsed = Dtype::kFp32;
  } else if (dtype == "bf16" || dtype == "bfloat16") {
    parsed = Dtype::kBf16;
  } else if (dtype == "fp16" || dtype == "float16") {
    parsed = Dtype::kFp16;
  } else {
    return Invalid(path, absl::StrCat("\"", dtype, "\" is not one of fp32, bf16, fp16"));
  }
  const Dtype applied = c->bf16_enabled ? Dtype::kBf16 : Dtype::kFp32;
  if (parsed != applied) {
    return Unsupported(path, absl::StrCat("\"", dtype, "\" with ",
                                          c->bf16_enabled  ? "bf16"
                                          : c->fp16.enabled ? "fp16"
                                                            : "fp32",
                                          " parameters (the ", applied == Dtype::kBf16
                                                                   ? "bf16" : "fp32",
                                          " default is the only value passed to ZeRO so far)"));
  }
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
