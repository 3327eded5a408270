// The top-level keys of a DeepSpeed config, judged as DeepSpeed 0.19 judges them
// (deepspeed/runtime/config.py reads the keys it knows and ignores the rest; its sections are
// pydantic models that refuse unknown keys), with what Loom does not implement named as such:
//   * a key Loom reads or knowingly ignores: handled by the parser;
//   * a DeepSpeed feature Loom does not implement (AutoTP, the hybrid engine, compression, ...):
//     refused when it would act ("deepspeed_config.tensor_parallel: tensor parallelism (AutoTP)
//     is not implemented in Loom"), a warning when it is switched off;
//   * a DeepSpeed knob that cannot change results here (logging, autotuning, the data loader's
//     drop_last): a warning;
//   * a key within edit distance max(2, len/4) of one Loom reads: refused with "did you mean"
//     (DeepSpeed would ignore `gradient_clippping` and train without clipping);
//   * anything else (`_comment`, `comms_config`, `monitor_config`): a warning saying DeepSpeed
//     does not read it either.
// Every refusal of the top level is returned in one error (common/problems.h), one problem each.
// ZeRO's key aliases (DeepSpeed's pydantic aliases: prefetch_bucket_size for
// stage3_prefetch_bucket_size, ...; the deprecated stage3_gather_fp16_weights_on_model_save) are
// rewritten to the stage3_ names first, so "auto" and the parser see one spelling.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spec/ds_config_internal.h"

namespace loom::spec {
namespace ds_config_internal {
namespace {

// Keys the parser reads or knowingly ignores (ParseDeepSpeedConfigValue).
constexpr absl::string_view kParsedKeys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "optimizer", "scheduler",
    "zero_optimization", "bf16", "bfloat16", "fp16", "amp", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "communication_data_type",
    "seq_parallel_communication_data_type", "sequence_parallel_size", "aio",
    "activation_checkpointing", "compile", "prescale_gradients", "gradient_predivide_factor",
    "dump_state", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger",
    "memory_breakdown", "checkpoint", "data_types", "elasticity", "curriculum_learning",
    "data_efficiency", "disable_allgather", "sparse_gradients", "timers"};

// DeepSpeed features Loom does not implement. `active` decides whether the block would act.
struct Feature {
  absl::string_view key;
  absl::string_view what;
  bool (*active)(const nlohmann::json& v);
};

bool Enabled(const nlohmann::json& v) {
  if (!v.is_object()) return !v.is_null() && v != false;
  auto it = v.find("enabled");
  return it == v.end() || !(it->is_boolean() && !it->get<bool>());
}
bool NonEmpty(const nlohmann::json& v) { return !v.is_null() && !v.empty() && Enabled(v); }
bool TensorParallel(const nlohmann::json& v) {
  if (!v.is_object()) return !v.is_null();
  for (const char* k : {"autotp_size", "tp_size"}) {
    auto it = v.find(k);
    if (it != v.end() && it->is_number() && it->get<double>() > 1) return true;
  }
  auto tp = v.find("tp");  // {"tp": {"tp_size": N}}
  return tp != v.end() && TensorParallel(*tp);
}
bool Always(const nlohmann::json& v) { return !v.is_null(); }

constexpr Feature kUnimplemented[] = {
    {"tensor_parallel", "tensor parallelism (AutoTP)", TensorParallel},
    {"hybrid_engine", "the RLHF hybrid engine", Enabled},
    {"compression_training", "compression training (DeepSpeed Compression)", NonEmpty},
    {"quantize_training", "quantization-aware training (MoQ)", Enabled},
    {"weight_quantization", "weight quantization", NonEmpty},
    {"eigenvalue", "eigenvalue computation", Enabled},
    {"progressive_layer_drop", "progressive layer drop", Enabled},
    {"sparse_attention", "sparse attention (removed from DeepSpeed too)", Always},
    {"torch_autocast", "torch autocast", Enabled},
    {"pipeline", "pipeline parallelism", NonEmpty},
};

// DeepSpeed knobs that cannot change what Loom computes: a warning each.
constexpr absl::string_view kHarmless[] = {
    "autotuning", "nebula", "comet", "log_level", "dataloader_drop_last", "graph_harvesting",
    "use_data_before_expert_parallelism", "legacy_fusion", "disable_python_gc",
    "gradient_allreduce_op"};

// zero_optimization aliases (DeepSpeed's Field(alias=...)): bare name -> the stage3_ name.
constexpr std::pair<absl::string_view, absl::string_view> kZeroAliases[] = {
    {"prefetch_bucket_size", "stage3_prefetch_bucket_size"},
    {"param_persistence_threshold", "stage3_param_persistence_threshold"},
    {"model_persistence_threshold", "stage3_model_persistence_threshold"},
    {"max_live_parameters", "stage3_max_live_parameters"},
    {"max_reuse_distance", "stage3_max_reuse_distance"},
    {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
    {"stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
    {"module_granularity_threshold", "stage3_module_granularity_threshold"},
    {"use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"},
    {"allgather_sequential", "stage3_allgather_sequential"},
};

template <typename Range>
bool Contains(const Range& r, absl::string_view k) {
  for (const auto& x : r) {
    if (absl::string_view(x) == k) return true;
  }
  return false;
}

}  // namespace

absl::Status CheckRootKeys(const json& root, std::vector<std::string>* warnings) {
  Problems refusals;
  for (const auto& [key, value] : root.items()) {
    if (Contains(kParsedKeys, key)) continue;
    const std::string path = Join(kRoot, key);
    const Feature* feature = nullptr;
    for (const Feature& f : kUnimplemented) {
      if (f.key == key) feature = &f;
    }
    if (feature != nullptr) {
      if (feature->active(value)) {
        refusals.Add(path, absl::StrCat(feature->what, " is not implemented in Loom"));
      } else {
        warnings->push_back(absl::StrCat(path, ": ignored (", feature->what,
                                         " is switched off here, and not implemented in Loom)"));
      }
      continue;
    }
    if (Contains(kHarmless, key)) {
      warnings->push_back(absl::StrCat(path, ": ignored (a DeepSpeed setting that cannot change "
                                             "what Loom computes)"));
      continue;
    }
    const std::string nearest = json_fields::NearestKey(key, kParsedKeys);
    if (!nearest.empty()) {
      refusals.Add(path, absl::StrCat("unknown key (did you mean ", nearest, "?)"));
      continue;
    }
    warnings->push_back(absl::StrCat(path, ": ignored (not a DeepSpeed key: DeepSpeed's config "
                                           "reader does not read it either)"));
  }
  return refusals.ToStatus();
}

absl::Status NormalizeZeroAliases(json* root) {
  if (!root->is_object()) return absl::OkStatus();
  auto zero = root->find("zero_optimization");
  if (zero == root->end() || !zero->is_object()) return absl::OkStatus();
  for (const auto& [alias, name] : kZeroAliases) {
    auto it = zero->find(std::string(alias));
    if (it == zero->end()) continue;
    json value = *it;
    zero->erase(it);
    const std::string canonical(name);
    if (auto existing = zero->find(canonical); existing != zero->end() && *existing != value) {
      return Invalid(Join(Join(kRoot, "zero_optimization"), std::string(alias)),
                     absl::StrCat("and ", canonical, " are the same setting with different "
                                  "values; give one"));
    }
    (*zero)[canonical] = std::move(value);
  }
  return absl::OkStatus();
}

}  // namespace ds_config_internal

absl::Status NormalizeDeepSpeedAliases(nlohmann::json* ds) {
  return ds_config_internal::NormalizeZeroAliases(ds);
}

}  // namespace loom::spec
