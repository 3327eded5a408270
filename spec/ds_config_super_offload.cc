// SuperOffload keys of zero_optimization.offload_optimizer, as DeepSpeed spells them
// (docs/design/TECHNIQUES.md §4.2): super_offload (bool, default false), ratio (the fraction of
// sub-groups whose optimizer step runs on the CPU, the last ones; DeepSpeed's zero/stage3.py puts
// sub-group i on the CPU iff i >= floor((1 - ratio) * #sub-groups)) and cpuadam_cores_perc (the
// share of the rank's threads reserved for the speculative CPU Adam, default 0.8); and Loom's own
// key speculation ("adaptive", the default, or "always": super_offload_pipeline.h). device "cpu"
// keeps the optimizer state in host memory, "nvme" on files (held swap buffers instead of
// rollback copies: super_offload_pipeline.h). Errors:
// INVALID_ARGUMENT naming the key.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {

absl::Status ParseSuperOffload(const json& off, const std::string& path, bool is_param,
                               OffloadConfig* o) {
  RETURN_IF_ERROR(ReadBool(off, "super_offload", path, &o->super_offload));
  RETURN_IF_ERROR(ReadDouble(off, "cpuadam_cores_perc", path, &o->cpuadam_cores_perc));
  std::string speculation = "adaptive";
  RETURN_IF_ERROR(ReadString(off, "speculation", path, &speculation));
  if (speculation != "adaptive" && speculation != "always") {
    return Invalid(Join(path, "speculation"),
                   absl::StrCat("\"", speculation, "\" is not one of adaptive, always"));
  }
  o->speculate_always = speculation == "always";
  if (!o->super_offload) {
    if (off.contains("speculation")) {
      return Invalid(Join(path, "speculation"), "needs super_offload: true");
    }
    return absl::OkStatus();
  }
  if (is_param) {
    return Invalid(Join(path, "super_offload"), "belongs to offload_optimizer, not offload_param");
  }
  if (o->device != "cpu" && o->device != "nvme") {
    return Invalid(Join(path, "super_offload"),
                   absl::StrCat("needs device \"cpu\" or \"nvme\" (device is \"", o->device,
                                "\")"));
  }
  // ratio's range [0, 1] is checked by ParseOffload for every offload_optimizer.
  if (!(o->cpuadam_cores_perc > 0.0 && o->cpuadam_cores_perc <= 1.0)) {
    return Invalid(Join(path, "cpuadam_cores_perc"),
                   absl::StrCat(o->cpuadam_cores_perc, " is not in (0, 1]"));
  }
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
