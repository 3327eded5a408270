#include "spec/ds_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"
#include "spec/json_fields.h"

namespace loom::spec {

using nlohmann::json;
using json_fields::Join;

namespace {

using ds_config_internal::kRoot;
using ds_config_internal::Invalid;
using ds_config_internal::Unsupported;
using ds_config_internal::CheckKeys;
using ds_config_internal::WarnIgnored;
using ds_config_internal::OptObject;
using ds_config_internal::ReadInt;
using ds_config_internal::ReadDouble;
using ds_config_internal::ReadBool;
using ds_config_internal::ReadString;
using ds_config_internal::ParseOffload;
using ds_config_internal::ParseAio;

// The optimizer section's type and params (ParseOptimizer).
absl::Status ParseOptimizerFields(const json& opt, const std::string& path,
                                  OptimizerConfig* out) {
  OptimizerConfig& o = *out;
  std::string type;
  RETURN_IF_ERROR(ReadString(opt, "type", path, &type));
  const std::string lower = absl::AsciiStrToLower(type);
  // DeepSpeed builds FusedAdam (or DeepSpeedCPUAdam) for both names, whose weight_decay defaults
  // to 0 (torch.optim.AdamW's 0.01 applies only with "torch_adam": true).
  o.weight_decay = 0.0;
  if (lower == "adam") {
    o.type = OptimizerConfig::Type::kAdam;
  } else if (lower == "adamw") {
    o.type = OptimizerConfig::Type::kAdamW;
  } else if (type.empty()) {
    return Invalid(Join(path, "type"), "required field is missing (Adam or AdamW)");
  } else {
    return Unsupported(Join(path, "type"), absl::StrCat("optimizer \"", type, "\""));
  }
  ASSIGN_OR_RETURN(const json* params, OptObject(opt, "params", path));
  bool adam_w_mode = true;
  if (params != nullptr) {
    const std::string pp = Join(path, "params");
    Problems problems;  // every unknown key and unsupported flag, else the first bad value
    problems.Merge(CheckKeys(*params, pp,
                             {"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                              "bias_correction", "torch_adam", "amsgrad", "fused",
                              "foreach", "capturable", "maximize", "set_grad_none"}));
    for (const auto& [key, what] : {std::pair<const char*, const char*>{"amsgrad", "AMSGrad"},
                                    {"maximize", "maximize"}}) {
      bool flag = false;
      if (problems.Merge(ReadBool(*params, key, pp, &flag)) && flag) {
        problems.Merge(Unsupported(Join(pp, key), what));
      }
    }
    if (!problems.empty()) return problems.ToStatus();
    RETURN_IF_ERROR(ReadDouble(*params, "lr", pp, &o.lr));
    RETURN_IF_ERROR(ReadDouble(*params, "eps", pp, &o.eps));
    RETURN_IF_ERROR(ReadDouble(*params, "weight_decay", pp, &o.weight_decay));
    RETURN_IF_ERROR(ReadBool(*params, "adam_w_mode", pp, &adam_w_mode));
    RETURN_IF_ERROR(ReadBool(*params, "bias_correction", pp, &o.bias_correction));
    if (auto it = params->find("betas"); it != params->end() && !it->is_null()) {
      if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number() ||
          !(*it)[1].is_number()) {
        return Invalid(Join(pp, "betas"), "expected [beta1, beta2]");
      }
      o.beta1 = (*it)[0].get<double>();
      o.beta2 = (*it)[1].get<double>();
    }
    if (!(o.lr >= 0)) return Invalid(Join(pp, "lr"), "must be >= 0");
    if (!(o.eps > 0)) return Invalid(Join(pp, "eps"), "must be positive");
    if (!(o.weight_decay >= 0)) return Invalid(Join(pp, "weight_decay"), "must be >= 0");
    if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)) {
      return Invalid(Join(pp, "betas"), "each beta must be in [0, 1)");
    }
  }
  o.decoupled_weight_decay = o.type == OptimizerConfig::Type::kAdamW || adam_w_mode;
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const json& root, DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(const json* opt, OptObject(root, "optimizer", kRoot));
  const std::string path = Join(kRoot, "optimizer");
  OptimizerConfig& o = c->optimizer;
  if (opt == nullptr) {
    // DeepSpeed without an optimizer section expects a client optimizer; a job spec has none.
    return Invalid(path, "required section is missing (type Adam or AdamW)");
  }
  Problems problems;
  problems.Merge(CheckKeys(*opt, path, {"type", "params"}));
  problems.Merge(ParseOptimizerFields(*opt, path, &o));
  return problems.ToStatus();
}

// The scheduler section's type and params (ParseScheduler).
absl::Status ParseSchedulerFields(const json* sch, const std::string& path, DeepSpeedConfig* c) {
  SchedulerConfig& s = c->scheduler;
  std::string type;
  RETURN_IF_ERROR(ReadString(*sch, "type", path, &type));
  // Each scheduler's params keys (DeepSpeed's lr_schedules.py).
  static const std::initializer_list<absl::string_view> kWarmupLR = {
      "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
      "last_batch_iteration"};
  static const std::initializer_list<absl::string_view> kWarmupDecayLR = {
      "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
      "last_batch_iteration", "total_num_steps"};
  static const std::initializer_list<absl::string_view> kWarmupCosineLR = {
      "total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
      "warmup_type", "last_batch_iteration"};
  const std::initializer_list<absl::string_view>* known = &kWarmupLR;
  if (type == "WarmupLR") {
    s.type = SchedulerConfig::Type::kWarmupLR;
    s.warmup_max_lr = c->optimizer.lr;  // DeepSpeed: warmup_max_lr None -> optimizer lr
  } else if (type == "WarmupDecayLR") {
    s.type = SchedulerConfig::Type::kWarmupDecayLR;
    s.warmup_max_lr = 0.001;
    known = &kWarmupDecayLR;
  } else if (type == "WarmupCosineLR") {
    s.type = SchedulerConfig::Type::kWarmupCosineLR;
    known = &kWarmupCosineLR;
  } else if (type.empty()) {
    return Invalid(Join(path, "type"), "required field is missing");
  } else {
    return Unsupported(Join(path, "type"), absl::StrCat("scheduler \"", type, "\""));
  }
  ASSIGN_OR_RETURN(const json* params, OptObject(*sch, "params", path));
  if (params == nullptr) {
    if (s.type != SchedulerConfig::Type::kWarmupLR) {
      return Invalid(Join(path, "params.total_num_steps"), "required field is missing");
    }
    return absl::OkStatus();
  }
  const std::string pp = Join(path, "params");
  RETURN_IF_ERROR(CheckKeys(*params, pp, *known));
  RETURN_IF_ERROR(ReadDouble(*params, "warmup_min_lr", pp, &s.warmup_min_lr));
  RETURN_IF_ERROR(ReadDouble(*params, "warmup_max_lr", pp, &s.warmup_max_lr));
  RETURN_IF_ERROR(ReadInt(*params, "warmup_num_steps", pp, &s.warmup_num_steps));
  RETURN_IF_ERROR(ReadDouble(*params, "warmup_min_ratio", pp, &s.warmup_min_ratio));
  RETURN_IF_ERROR(ReadDouble(*params, "cos_min_ratio", pp, &s.cos_min_ratio));
  std::string warmup_type = "log";
  RETURN_IF_ERROR(ReadString(*params, "warmup_type", pp, &warmup_type));
  if (warmup_type != "log" && warmup_type != "linear") {
    return Invalid(Join(pp, "warmup_type"),
                   absl::StrCat("\"", warmup_type, "\" is not \"log\" or \"linear\""));
  }
  s.warmup_log = warmup_type == "log";
  int64_t last = -1;
  RETURN_IF_ERROR(ReadInt(*params, "last_batch_iteration", pp, &last));
  if (last != -1) {
    return Unsupported(Join(pp, "last_batch_iteration"),
                       "a value other than -1 (resume restores the schedule from the step)");
  }
  if (s.warmup_num_steps < 0) return Invalid(Join(pp, "warmup_num_steps"), "must be >= 0");
  if (s.type != SchedulerConfig::Type::kWarmupLR) {
    std::optional<int64_t> total;
    ASSIGN_OR_RETURN(total, json_fields::OptInt(*params, "total_num_steps", pp));
    if (!total.has_value()) return Invalid(Join(pp, "total_num_steps"), "required field is missing");
    if (*total <= 0) return Invalid(Join(pp, "total_num_steps"), "must be positive");
    s.total_num_steps = *total;
    if (s.type == SchedulerConfig::Type::kWarmupCosineLR &&
        s.total_num_steps <= std::max<int64_t>(2, s.warmup_num_steps)) {
      return Invalid(Join(pp, "total_num_steps"),
                     "must exceed warmup_num_steps (the cosine phase divides by their difference)");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseScheduler(const json& root, DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(const json* sch, OptObject(root, "scheduler", kRoot));
  if (sch == nullptr) return absl::OkStatus();
  const std::string path = Join(kRoot, "scheduler");
  Problems problems;
  problems.Merge(CheckKeys(*sch, path, {"type", "params"}));
  problems.Merge(ParseSchedulerFields(sch, path, c));
  return problems.ToStatus();
}

absl::Status ParseZero(const json& root, int world_size, DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(const json* z, OptObject(root, "zero_optimization", kRoot));
  ZeroConfig& zc = c->zero;
  const std::string path = Join(kRoot, "zero_optimization");
  if (z != nullptr) {
    Problems problems;  // every unknown key and unsupported feature of the section
    problems.Merge(CheckKeys(
        *z, path,
        {"stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
         "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
         "overlap_comm", "load_from_fp32_weights", "sub_group_size",
         "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
         "stage3_model_persistence_threshold", "stage3_max_live_parameters",
         "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
         "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
         "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
         "round_robin_gradients", "ignore_unused_parameters", "offload_param",
         "offload_optimizer", "zenflow", "zero_hpz_partition_size", "zero_quantized_weights",
         "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "cpu_offload",
         "cpu_offload_param", "cpu_offload_use_pin_memory", "elastic_checkpoint",
         "memory_efficient_linear", "mics_shard_size", "mics_hierarchical_params_gather",
         "log_trace_cache_warnings", "pipeline_loading_checkpoint", "override_module_apply",
         "legacy_stage1", "reduce_bucket_size_in_elements"}));
    int64_t hpz = 1;
    if (problems.Merge(ReadInt(*z, "zero_hpz_partition_size", path, &hpz)) && hpz != 1) {
      problems.Merge(Unsupported(Join(path, "zero_hpz_partition_size"), "ZeRO++ hpZ"));
    }
    for (const char* key : {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                            "zero_quantized_gradients", "cpu_offload", "cpu_offload_param"}) {
      bool on = false;
      if (problems.Merge(ReadBool(*z, key, path, &on)) && on) {
        problems.Merge(Unsupported(Join(path, key), key));
      }
    }
    int64_t mics = -1;
    if (problems.Merge(ReadInt(*z, "mics_shard_size", path, &mics)) && mics > 0) {
      problems.Merge(Unsupported(Join(path, "mics_shard_size"), "MiCS sharding"));
    }
    if (!problems.empty()) return problems.ToStatus();
    int64_t stage = 0;
    RETURN_IF_ERROR(ReadInt(*z, "stage", path, &stage));
    zc.stage = static_cast<int>(stage);
    RETURN_IF_ERROR(ReadBool(*z, "contiguous_gradients", path, &zc.contiguous_gradients));
    RETURN_IF_ERROR(ReadBool(*z, "reduce_scatter", path, &zc.reduce_scatter));
    RETURN_IF_ERROR(ReadInt(*z, "reduce_bucket_size", path, &zc.reduce_bucket_size));
    RETURN_IF_ERROR(ReadBool(*z, "use_multi_rank_bucket_allreduce", path,
                             &zc.use_multi_rank_bucket_allreduce));
    RETURN_IF_ERROR(ReadBool(*z, "allgather_partitions", path, &zc.allgather_partitions));
    RETURN_IF_ERROR(ReadInt(*z, "allgather_bucket_size", path, &zc.allgather_bucket_size));
    ASSIGN_OR_RETURN(zc.overlap_comm, json_fields::OptBool(*z, "overlap_comm", path));
    RETURN_IF_ERROR(ReadBool(*z, "load_from_fp32_weights", path, &zc.load_from_fp32_weights));
    RETURN_IF_ERROR(ReadInt(*z, "sub_group_size", path, &zc.sub_group_size));
    zc.sub_group_size_set = z->contains("sub_group_size");  // SuperOffload sizes it when unset
    RETURN_IF_ERROR(ReadInt(*z, "stage3_prefetch_bucket_size", path,
                            &zc.stage3_prefetch_bucket_size));
    RETURN_IF_ERROR(ReadInt(*z, "stage3_param_persistence_threshold", path,
                            &zc.stage3_param_persistence_threshold));
    RETURN_IF_ERROR(ReadInt(*z, "stage3_model_persistence_threshold", path,
                            &zc.stage3_model_persistence_threshold));
    RETURN_IF_ERROR(ReadInt(*z, "stage3_max_live_parameters", path,
                            &zc.stage3_max_live_parameters));
    RETURN_IF_ERROR(ReadInt(*z, "stage3_max_reuse_distance", path,
                            &zc.stage3_max_reuse_distance));
    RETURN_IF_ERROR(ReadBool(*z, "stage3_gather_fp16_weights_on_model_save", path,
                             &zc.stage3_gather_16bit_weights_on_model_save));
    RETURN_IF_ERROR(ReadBool(*z, "stage3_gather_16bit_weights_on_model_save", path,
                             &zc.stage3_gather_16bit_weights_on_model_save));
    RETURN_IF_ERROR(ReadInt(*z, "stage3_module_granularity_threshold", path,
                            &zc.stage3_module_granularity_threshold));
    RETURN_IF_ERROR(ReadBool(*z, "stage3_use_all_reduce_for_fetch_params", path,
                             &zc.stage3_use_all_reduce_for_fetch_params));
    RETURN_IF_ERROR(ReadBool(*z, "stage3_allgather_sequential", path,
                             &zc.stage3_allgather_sequential));
    RETURN_IF_ERROR(ReadBool(*z, "round_robin_gradients", path, &zc.round_robin_gradients));
    RETURN_IF_ERROR(
        ReadBool(*z, "ignore_unused_parameters", path, &zc.ignore_unused_parameters));
    RETURN_IF_ERROR(ParseOffload(*z, "offload_param", path, &zc.offload_param, true,
                                 &c->warnings));
    RETURN_IF_ERROR(ParseOffload(*z, "offload_optimizer", path, &zc.offload_optimizer, false,
                                 &c->warnings));
    RETURN_IF_ERROR(ds_config_internal::ParseZenFlow(*z, path, &zc, &c->warnings));
    if (zc.zenflow.enabled && zc.offload_optimizer.super_offload) {
      // Both replace the offload optimizer's step (two OptimizerPipelines): one at a time.
      return Invalid(Join(path, "zenflow"),
                     "cannot be combined with offload_optimizer.super_offload: choose one");
    }
    WarnIgnored(*z, path,
                {"reduce_scatter", "use_multi_rank_bucket_allreduce", "allgather_partitions",
                 "load_from_fp32_weights", "stage3_model_persistence_threshold",
                 "stage3_gather_16bit_weights_on_model_save",
                 "stage3_gather_fp16_weights_on_model_save",
                 "stage3_module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
                 "stage3_allgather_sequential", "round_robin_gradients",
                 "ignore_unused_parameters", "cpu_offload_use_pin_memory", "elastic_checkpoint",
                 "memory_efficient_linear", "mics_hierarchical_params_gather",
                 "log_trace_cache_warnings", "pipeline_loading_checkpoint",
                 "override_module_apply", "legacy_stage1"},
                "a communication/layout knob Loom does not implement; results are unchanged up "
                "to reduction-order rounding",
                &c->warnings);
  }
  const std::string stage_path = Join(path, "stage");
  if (zc.stage < 0 || zc.stage > 3) {
    return Invalid(stage_path, absl::StrCat(zc.stage, " is not one of 0, 1, 2, 3"));
  }
  if (zc.offload_param.device != "none" && zc.stage != 3) {
    return Invalid(Join(Join(path, "offload_param"), "device"),
                   absl::StrCat("parameter offload needs stage 3, not stage ", zc.stage));
  }
  // The offload sections' combinations, checked here so that submission refuses them (the
  // trainer parses the same config): they used to be checked only when a rank started.
  const OffloadConfig& oo = zc.offload_optimizer;
  if (oo.super_offload && zc.stage == 0) {
    // The speculative step needs partitioned fp32 masters, which stage 0 does not keep apart
    // from the replicas.
    return Invalid(Join(Join(path, "offload_optimizer"), "super_offload"),
                   "needs ZeRO stage 1, 2 or 3 (stage is 0)");
  }
  if (oo.device != "none" && zc.stage == 0) {
    return Invalid(Join(Join(path, "offload_optimizer"), "device"),
                   "offload needs ZeRO stage 1, 2 or 3 (stage is 0)");
  }
  if (zc.offload_param.device == "nvme" && oo.device == "none") {
    // DeepSpeed keeps the fp32 master with the optimizer; here the optimizer must own it to
    // let the parameter partitions leave memory.
    return Invalid(Join(Join(path, "offload_param"), "device"),
                   "parameter offload to nvme needs offload_optimizer too");
  }
  if (oo.super_offload && zc.offload_param.device == "nvme") {
    return Invalid(Join(Join(path, "offload_param"), "device"),
                   "SuperOffload keeps the parameters in memory (\"nvme\" is not supported with "
                   "offload_optimizer.super_offload)");
  }
  if (zc.reduce_bucket_size <= 0) return Invalid(Join(path, "reduce_bucket_size"), "must be > 0");
  if (zc.allgather_bucket_size <= 0) {
    return Invalid(Join(path, "allgather_bucket_size"), "must be > 0");
  }
  // DeepSpeed accepts 0 (pydantic ge=0): its stage 3 closes a sub-group once it holds
  // sub_group_size elements, so 0 puts every parameter in its own sub-group, as 1 does here
  // (axolotl's zero3 configs say 0).
  if (zc.sub_group_size < 0) return Invalid(Join(path, "sub_group_size"), "must be >= 0");
  if (zc.sub_group_size == 0) zc.sub_group_size = 1;
  for (const auto& [key, v] :
       {std::pair<const char*, int64_t>{"stage3_prefetch_bucket_size",
                                        zc.stage3_prefetch_bucket_size},
        {"stage3_param_persistence_threshold", zc.stage3_param_persistence_threshold},
        {"stage3_max_live_parameters", zc.stage3_max_live_parameters},
        {"stage3_max_reuse_distance", zc.stage3_max_reuse_distance}}) {
    if (v < 0) return Invalid(Join(path, key), "must be >= 0");
  }
  (void)world_size;
  return absl::OkStatus();
}

absl::Status ParsePrecision(const json& root, DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(const json* fp16, OptObject(root, "fp16", kRoot));
  if (fp16 != nullptr) {
    const std::string path = Join(kRoot, "fp16");
    Problems problems;  // every unknown key and unsupported feature of the section
    problems.Merge(CheckKeys(*fp16, path,
                             {"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                              "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                              "min_loss_scale", "fp16_master_weights_and_grads"}));
    for (const auto& [key, what] :
         {std::pair<const char*, const char*>{"auto_cast", "fp16 auto_cast"},
          {"fp16_master_weights_and_grads", "fp16 master weights"}}) {
      bool flag = false;
      if (problems.Merge(ReadBool(*fp16, key, path, &flag)) && flag) {
        problems.Merge(Unsupported(Join(path, key), what));
      }
    }
    if (!problems.empty()) return problems.ToStatus();
    Fp16Config& f = c->fp16;
    RETURN_IF_ERROR(ReadBool(*fp16, "enabled", path, &f.enabled));
    RETURN_IF_ERROR(ReadDouble(*fp16, "loss_scale", path, &f.loss_scale));
    RETURN_IF_ERROR(ReadInt(*fp16, "initial_scale_power", path, &f.initial_scale_power));
    RETURN_IF_ERROR(ReadInt(*fp16, "loss_scale_window", path, &f.loss_scale_window));
    RETURN_IF_ERROR(ReadInt(*fp16, "hysteresis", path, &f.hysteresis));
    RETURN_IF_ERROR(ReadBool(*fp16, "consecutive_hysteresis", path, &f.consecutive_hysteresis));
    RETURN_IF_ERROR(ReadDouble(*fp16, "min_loss_scale", path, &f.min_loss_scale));
    if (!(f.loss_scale >= 0)) return Invalid(Join(path, "loss_scale"), "must be >= 0");
    if (f.initial_scale_power < 0 || f.initial_scale_power > 62) {
      return Invalid(Join(path, "initial_scale_power"), "must be in [0, 62]");
    }
    if (f.loss_scale_window <= 0) return Invalid(Join(path, "loss_scale_window"), "must be > 0");
    if (f.hysteresis <= 0) return Invalid(Join(path, "hysteresis"), "must be > 0");
    if (!(f.min_loss_scale > 0)) return Invalid(Join(path, "min_loss_scale"), "must be > 0");
  }
  for (const char* key : {"bf16", "bfloat16"}) {
    ASSIGN_OR_RETURN(const json* sec, OptObject(root, key, kRoot));
    if (sec == nullptr) continue;
    const std::string path = Join(kRoot, key);
    Problems problems;  // every unknown key and unsupported feature of the section
    problems.Merge(CheckKeys(*sec, path,
                             {"enabled", "immediate_grad_update", "check_grad_overflow",
                              "bf16_master_weights_and_grads", "bf16_optimizer_states"}));
    bool enabled = false;
    problems.Merge(ReadBool(*sec, "enabled", path, &enabled));
    c->bf16_enabled = c->bf16_enabled || enabled;
    for (const char* k : {"bf16_master_weights_and_grads", "bf16_optimizer_states"}) {
      bool on = false;
      if (problems.Merge(ReadBool(*sec, k, path, &on)) && on) {
        problems.Merge(Unsupported(Join(path, k), "bf16 master weights / optimizer states"));
      }
    }
    if (!problems.empty()) return problems.ToStatus();
    WarnIgnored(*sec, path, {"immediate_grad_update", "check_grad_overflow"},
                "Loom accumulates fp32 gradient partitions and does not skip bf16 steps",
                &c->warnings);
  }
  if (c->fp16.enabled && c->bf16_enabled) {
    return Invalid(Join(kRoot, "bf16.enabled"), "fp16 and bf16 cannot both be enabled");
  }
  return absl::OkStatus();
}

// `ranks`: how the messages name the rank count the batch is divided by ("world size 2", or the
// data-parallel size under sequence parallelism).
absl::Status ParseBatch(const json& root, int world_size, const std::string& ranks,
                        DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(std::optional<int64_t> tbs,
                   json_fields::OptInt(root, "train_batch_size", kRoot));
  ASSIGN_OR_RETURN(std::optional<int64_t> micro,
                   json_fields::OptInt(root, "train_micro_batch_size_per_gpu", kRoot));
  ASSIGN_OR_RETURN(std::optional<int64_t> gas,
                   json_fields::OptInt(root, "gradient_accumulation_steps", kRoot));
  const std::string tbs_path = Join(kRoot, "train_batch_size");
  const std::string micro_path = Join(kRoot, "train_micro_batch_size_per_gpu");
  const std::string gas_path = Join(kRoot, "gradient_accumulation_steps");
  if (tbs && *tbs <= 0) return Invalid(tbs_path, "must be positive");
  if (micro && *micro <= 0) return Invalid(micro_path, "must be positive");
  if (gas && *gas <= 0) return Invalid(gas_path, "must be positive");
  // Bounded so that the batch arithmetic below cannot overflow (the products are 128-bit) and a
  // typo does not become a step of 1e12 micro-batches.
  constexpr int64_t kMaxBatch = 2147483647;
  auto too_large = [&](const std::optional<int64_t>& v, const std::string& path) {
    return v.has_value() && *v > kMaxBatch
               ? Invalid(path, absl::StrCat(*v, " is larger than ", kMaxBatch))
               : absl::OkStatus();
  };
  RETURN_IF_ERROR(too_large(tbs, tbs_path));
  RETURN_IF_ERROR(too_large(micro, micro_path));
  RETURN_IF_ERROR(too_large(gas, gas_path));
  const int64_t w = world_size;
  if (tbs && micro && gas) {
    // all given: checked below
  } else if (tbs && micro) {
    if (*tbs % (*micro * w) != 0) {
      return Invalid(tbs_path, absl::StrCat(*tbs, " is not divisible by micro batch ", *micro,
                                            " x ", ranks));
    }
    gas = *tbs / (*micro * w);
  } else if (tbs && gas) {
    if (*tbs % (*gas * w) != 0) {
      return Invalid(tbs_path, absl::StrCat(*tbs, " is not divisible by gradient accumulation ",
                                            *gas, " x ", ranks));
    }
    micro = *tbs / (*gas * w);
  } else if (micro) {
    gas = gas.value_or(1);
    const __int128 product = static_cast<__int128>(*micro) * *gas * w;
    if (product > kMaxBatch) {
      return Invalid(micro_path,
                     absl::StrCat("train_micro_batch_size_per_gpu ", *micro,
                                  " * gradient_accumulation_steps ", *gas, " * ", ranks,
                                  " is larger than ", kMaxBatch));
    }
    tbs = static_cast<int64_t>(product);
  } else if (tbs) {
    gas = 1;
    if (*tbs % w != 0) {
      return Invalid(tbs_path, absl::StrCat(*tbs, " is not divisible by ", ranks));
    }
    micro = *tbs / w;
  } else {
    return Invalid(micro_path,
                   "required: set train_micro_batch_size_per_gpu or train_batch_size");
  }
  if (static_cast<__int128>(*tbs) != static_cast<__int128>(*micro) * *gas * w) {
    return Invalid(tbs_path, absl::StrCat(*tbs, " != train_micro_batch_size_per_gpu ", *micro,
                                          " * gradient_accumulation_steps ", *gas,
                                          " * ", ranks));
  }
  c->train_batch_size = *tbs;
  c->train_micro_batch_size_per_gpu = *micro;
  c->gradient_accumulation_steps = *gas;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfig(const std::string& json_text,
                                                     int world_size) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    if (world_size < 1) return Invalid("world_size", absl::StrCat(world_size, " must be >= 1"));
    return Invalid(kRoot, "not a JSON object");
  }
  return ParseDeepSpeedConfigValue(root, world_size);
}

absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfigValue(const nlohmann::json& written,
                                                          int world_size) {
  if (world_size < 1) return Invalid("world_size", absl::StrCat(world_size, " must be >= 1"));
  if (!written.is_object()) return Invalid(kRoot, "not a JSON object");
  // One spelling of each ZeRO key (ds_config_keys.cc); the copy is small next to the parse.
  json root = written;
  RETURN_IF_ERROR(ds_config_internal::NormalizeZeroAliases(&root));
  DeepSpeedConfig c;
  // Every problem of the config in one answer (common/problems.h): the sections are checked
  // independently; a check that needs what a failed one reads is skipped.
  Problems problems;
  problems.Merge(ds_config_internal::CheckRootKeys(root, &c.warnings));
  // Ulysses (ds_config_sequence_parallel.cc): the batch counts data-parallel ranks, world / P.
  if (problems.Merge(ds_config_internal::ParseSequenceParallel(root, world_size, &c))) {
    const int dp = world_size / static_cast<int>(c.sequence_parallel_size);
    problems.Merge(ParseBatch(
        root, dp,
        c.sequence_parallel_size > 1
            ? absl::StrCat("data-parallel size ", dp, " (world size ", world_size,
                           " / sequence_parallel_size ", c.sequence_parallel_size, ")")
            : absl::StrCat("world size ", world_size),
        &c));
  }
  if (problems.Merge(ReadDouble(root, "gradient_clipping", kRoot, &c.gradient_clipping)) &&
      !(c.gradient_clipping >= 0)) {
    problems.Add(Join(kRoot, "gradient_clipping"), "must be >= 0");
  }
  problems.Merge(ReadInt(root, "steps_per_print", kRoot, &c.steps_per_print));
  problems.Merge(ReadBool(root, "wall_clock_breakdown", kRoot, &c.wall_clock_breakdown));
  problems.Merge(ParseOptimizer(root, &c));
  problems.Merge(ParseScheduler(root, &c));
  const bool zero_ok = problems.Merge(ParseZero(root, world_size, &c));
  WarnIgnored(root, kRoot,
              {"wall_clock_breakdown", "dump_state", "flops_profiler", "comms_logger",
               "memory_breakdown", "timers", "checkpoint",
               "prescale_gradients", "zero_allow_untested_optimizer",
               "zero_force_ds_cpu_optimizer", "disable_allgather"},
              "logging, checkpoint-engine or recomputation knob Loom does not implement; results "
              "are unchanged",
              &c.warnings);
  {
    double predivide = 1.0;
    if (problems.Merge(ReadDouble(root, "gradient_predivide_factor", kRoot, &predivide)) &&
        predivide != 1.0) {
      problems.Merge(
          Unsupported(Join(kRoot, "gradient_predivide_factor"), "a predivide factor != 1"));
    }
  }

  const bool precision_ok = problems.Merge(ParsePrecision(root, &c));
  problems.Merge(ParseAio(root, &c));
  problems.Merge(ds_config_internal::ParseMonitors(root, &c));
  problems.Merge(ds_config_internal::ParseActivationCheckpointing(root, &c));
  if (absl::StatusOr<const json*> amp = OptObject(root, "amp", kRoot);
      problems.Merge(amp.status()) && *amp != nullptr) {
    auto it = (*amp)->find("enabled");
    if (it != (*amp)->end() && it->is_boolean() && it->get<bool>()) {
      problems.Merge(Unsupported(Join(kRoot, "amp.enabled"), "Apex AMP"));
    }
  }
  for (const char* key : {"compile", "elasticity", "curriculum_learning"}) {
    absl::StatusOr<const json*> sec = OptObject(root, key, kRoot);
    if (!problems.Merge(sec.status()) || *sec == nullptr) continue;
    auto it = (*sec)->find("enabled");
    if (it != (*sec)->end() && it->is_boolean() && it->get<bool>()) {
      problems.Merge(Unsupported(Join(Join(kRoot, key), "enabled"), key));
    }
  }
  if (zero_ok && precision_ok) {  // checked against the stage and the precision
    problems.Merge(ds_config_internal::ParseCommunicationDataType(root, &c));
  }
  if (absl::StatusOr<const json*> dt = OptObject(root, "data_types", kRoot);
      problems.Merge(dt.status()) && *dt != nullptr) {
    const std::string path = Join(kRoot, "data_types");
    std::string g;
    if (problems.Merge(CheckKeys(**dt, path, {"grad_accum_dtype"})) &&
        problems.Merge(ReadString(**dt, "grad_accum_dtype", path, &g)) && !g.empty() &&
        g != "fp32") {
      problems.Merge(Unsupported(Join(path, "grad_accum_dtype"), absl::StrCat("\"", g, "\"")));
    }
  }
  {
    bool sparse = false;
    if (problems.Merge(ReadBool(root, "sparse_gradients", kRoot, &sparse)) && sparse) {
      problems.Merge(Unsupported(Join(kRoot, "sparse_gradients"), "sparse gradients"));
    }
  }
  if (!problems.empty()) return problems.ToStatus();
  return c;
}

}  // namespace loom::spec
