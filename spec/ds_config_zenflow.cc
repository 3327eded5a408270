// zero_optimization.zenflow (docs/design/TECHNIQUES.md §2.6): every key as DeepSpeed spells it
// (runtime/zenflow/zenflow_config.py ZenFlowConfig), with DeepSpeed's defaults and constraints,
// plus the ones Loom's implementation needs. Each violation is INVALID_ARGUMENT naming the key.
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {
namespace {

// An interval key: a positive integer, or "auto" (-> 0). Absent keeps *out.
absl::Status ReadInterval(const json& zf, const std::string& key, const std::string& path,
                          int64_t* out) {
  auto it = zf.find(key);
  if (it == zf.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string() && it->get<std::string>() == "auto") {
    *out = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<int64_t>> v = json_fields::OptInt(zf, key, path);
  if (!v.ok()) {
    return Invalid(Join(path, key), absl::StrCat("expected a positive integer or \"auto\", got ",
                                                 it->dump()));
  }
  if (**v < 1) {
    return Invalid(Join(path, key),
                   absl::StrCat(**v, " is not a positive integer (or \"auto\")"));
  }
  *out = **v;
  return absl::OkStatus();
}

absl::Status InRange(const std::string& path, const char* key, double v, double lo, double hi,
                     bool lo_open) {
  if (!(v >= lo && v <= hi) || (lo_open && v == lo)) {  // NaN fails too
    return Invalid(Join(path, key), absl::StrCat(v, " is not in ", lo_open ? "(" : "[", lo, ", ",
                                                 hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseZenFlow(const json& zero, const std::string& zpath, ZeroConfig* zc,
                          std::vector<std::string>* warnings) {
  ASSIGN_OR_RETURN(const json* zf, OptObject(zero, "zenflow", zpath));
  if (zf == nullptr) return absl::OkStatus();
  const std::string path = Join(zpath, "zenflow");
  ZenFlowConfig& c = zc->zenflow;
  c.enabled = true;
  RETURN_IF_ERROR(CheckKeys(*zf, path,
                            {"topk_ratio", "select_strategy", "select_interval",
                             "update_interval", "overlap_step", "offload", "auto_ratio",
                             "full_warm_up_rounds", "pt_reserved_cores_perc",
                             "steps_per_epoch"}));
  RETURN_IF_ERROR(ReadDouble(*zf, "topk_ratio", path, &c.topk_ratio));
  RETURN_IF_ERROR(ReadString(*zf, "select_strategy", path, &c.select_strategy));
  RETURN_IF_ERROR(ReadInterval(*zf, "select_interval", path, &c.select_interval));
  RETURN_IF_ERROR(ReadInterval(*zf, "update_interval", path, &c.update_interval));
  RETURN_IF_ERROR(ReadBool(*zf, "overlap_step", path, &c.overlap_step));
  RETURN_IF_ERROR(ReadBool(*zf, "offload", path, &c.offload));
  RETURN_IF_ERROR(ReadDouble(*zf, "auto_ratio", path, &c.auto_ratio));
  RETURN_IF_ERROR(ReadInt(*zf, "full_warm_up_rounds", path, &c.full_warm_up_rounds));
  RETURN_IF_ERROR(ReadDouble(*zf, "pt_reserved_cores_perc", path, &c.pt_reserved_cores_perc));
  RETURN_IF_ERROR(ReadInt(*zf, "steps_per_epoch", path, &c.steps_per_epoch));

  RETURN_IF_ERROR(InRange(path, "topk_ratio", c.topk_ratio, 0.0, 1.0, false));
  RETURN_IF_ERROR(InRange(path, "auto_ratio", c.auto_ratio, 0.0, 1.0, true));
  RETURN_IF_ERROR(
      InRange(path, "pt_reserved_cores_perc", c.pt_reserved_cores_perc, 0.0, 1.0, false));
  if (c.full_warm_up_rounds < 0) {
    return Invalid(Join(path, "full_warm_up_rounds"),
                   absl::StrCat(c.full_warm_up_rounds, " is negative"));
  }
  const auto spe = zf->find("steps_per_epoch");
  if (spe != zf->end() && !spe->is_null() && c.steps_per_epoch < 1) {
    return Invalid(Join(path, "steps_per_epoch"),
                   absl::StrCat(c.steps_per_epoch, " is not a positive integer"));
  }
  if (c.select_strategy != "auto" && c.select_strategy != "step" &&
      c.select_strategy != "epoch") {
    return Invalid(Join(path, "select_strategy"),
                   absl::StrCat("\"", c.select_strategy, "\" is not one of auto, step, epoch"));
  }
  if (c.select_strategy != "auto" && c.select_interval == 0) {
    // DeepSpeed: "select_interval must be an int when select_strategy is not auto".
    return Invalid(Join(path, "select_interval"),
                   absl::StrCat("an integer is required with select_strategy \"",
                                c.select_strategy, "\""));
  }
  if (c.select_strategy == "auto" && c.select_interval != 0) {
    // DeepSpeed >= ZF-U7 warns and uses one epoch (it used to raise).
    warnings->push_back(absl::StrCat(Join(path, "select_interval"), ": ignored (",
                                     "select_strategy \"auto\" re-selects once per epoch)"));
    c.select_interval = 0;
  }
  if (c.select_strategy == "epoch" && c.steps_per_epoch > 0 &&
      c.select_interval > std::numeric_limits<int64_t>::max() / c.steps_per_epoch) {
    return Invalid(Join(path, "select_interval"),
                   absl::StrCat(c.select_interval, " epochs of steps_per_epoch ",
                                c.steps_per_epoch, " overflow a 64-bit step count"));
  }
  if (c.select_strategy == "step" && c.update_interval != 0 &&
      c.select_interval < c.update_interval) {
    return Invalid(Join(path, "select_interval"),
                   absl::StrCat(c.select_interval, " is below update_interval ",
                                c.update_interval, " (select_interval >= update_interval)"));
  }
  if (zc->stage < 1 || zc->stage > 3) {
    return Invalid(path, absl::StrCat("ZenFlow needs zero_optimization.stage 1, 2 or 3, not ",
                                      zc->stage));
  }
  if (zc->offload_optimizer.device != "cpu") {
    return Invalid(path, absl::StrCat("requires zero_optimization.offload_optimizer.device "
                                      "\"cpu\" (got \"",
                                      zc->offload_optimizer.device, "\")"));
  }
  if (zc->offload_param.device == "nvme") {
    return Unsupported(path, "ZenFlow with offload_param.device \"nvme\"");
  }
  if (c.offload) {
    if (!zc->overlap_comm_effective()) {
      // DeepSpeed: "ZenFlow offload requires overlap_comm".
      return Invalid(Join(path, "offload"), "requires zero_optimization.overlap_comm true");
    }
    warnings->push_back(absl::StrCat(Join(path, "offload"),
                                     ": ignored (on a CPU node the selective optimizer's "
                                     "moments are in host memory already)"));
  }
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
