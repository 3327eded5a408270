#include "spec/hf_trainer_config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spec/struct_json.h"

namespace loom::spec {
namespace {

using nlohmann::json;

constexpr char kRoot[] = "deepspeed_config";

// One Trainer argument: its value, and whether the job gave it (else the Trainer's default;
// only a given one is checked against an explicit DeepSpeed value). `computed`: derived from
// other values (shown as its formula).
struct Arg {
  json value;
  bool given = false;
  std::string name;  // "training.learning_rate"
  bool computed = false;

  std::string Source() const {
    return given || computed ? name : absl::StrCat(name, " unset: the Trainer's default");
  }
};

Arg DoubleArg(bool has, double value, double fallback, const char* name) {
  return {has ? value : fallback, has, absl::StrCat("training.", name)};
}

std::string Show(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Numbers compare as doubles: 1 and 1.0 are the same value.
bool SameValue(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!SameValue(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

bool IsAuto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Every "auto" under `v`, as paths.
void FindAutos(const json& v, const std::string& path, std::vector<std::string>* out) {
  if (IsAuto(v)) out->push_back(path);
  if (v.is_object()) {
    for (const auto& [k, child] : v.items()) FindAutos(child, absl::StrCat(path, ".", k), out);
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) FindAutos(v[i], absl::StrCat(path, "[", i, "]"), out);
  }
}

class Resolver {
 public:
  Resolver(json* ds, std::vector<std::string>* notes) : ds_(ds), notes_(notes) {}

  // HfTrainerDeepSpeedConfig.fill_match: "auto" -> the argument's value; an explicit value
  // that differs from an argument the job gave is refused. `key` is dotted ("optimizer.params.lr").
  absl::Status FillMatch(const std::string& key, const Arg& arg, bool must_match = true) {
    json* parent = Parent(key);
    const std::string leaf = key.substr(key.rfind('.') + 1);
    if (parent == nullptr || !parent->contains(leaf)) return absl::OkStatus();
    json& v = (*parent)[leaf];
    if (IsAuto(v)) {
      v = arg.value;
      notes_->push_back(absl::StrCat(kRoot, ".", key, ": \"auto\" -> ", Show(arg.value), " (",
                                     arg.Source(), ")"));
      return absl::OkStatus();
    }
    if (must_match && arg.given && !v.is_null() && !SameValue(v, arg.value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kRoot, ".", key, ": ", Show(v), " contradicts ", arg.name, " ", Show(arg.value),
          " (give the value once, or write \"auto\" in the DeepSpeed config)"));
    }
    return absl::OkStatus();
  }

 private:
  // The object holding `key`'s last component, or nullptr if a parent is absent or no object.
  json* Parent(const std::string& key) {
    json* node = ds_;
    size_t start = 0;
    for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
      const std::string part = key.substr(start, dot - start);
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
      start = dot + 1;
    }
    return node->is_object() ? node : nullptr;
  }

  json* ds_;
  std::vector<std::string>* notes_;
};

// The Trainer's arguments of `t` (TrainingArguments' defaults where unset).
struct TrainerArgs {
  Arg micro, accumulation, max_grad_norm, lr, betas, eps, weight_decay, fp16, bf16;
  int64_t warmup_steps = 0;
  bool any_given = false;
};

absl::StatusOr<TrainerArgs> ReadArgs(const loom::v1::TrainingSpec& t) {
  TrainerArgs a;
  a.micro = {t.has_per_device_train_batch_size() ? t.per_device_train_batch_size() : 8,
             t.has_per_device_train_batch_size(), "training.per_device_train_batch_size"};
  a.accumulation = {t.has_gradient_accumulation_steps() ? t.gradient_accumulation_steps() : 1,
                    t.has_gradient_accumulation_steps(), "training.gradient_accumulation_steps"};
  for (const Arg* count : {&a.micro, &a.accumulation}) {
    if (count->value.get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(count->name, ": must be >= 1, got ", Show(count->value)));
    }
  }
  a.max_grad_norm = DoubleArg(t.has_max_grad_norm(), t.max_grad_norm(), 1.0, "max_grad_norm");
  a.lr = DoubleArg(t.has_learning_rate(), t.learning_rate(), 5e-5, "learning_rate");
  a.eps = DoubleArg(t.has_adam_epsilon(), t.adam_epsilon(), 1e-8, "adam_epsilon");
  a.weight_decay = DoubleArg(t.has_weight_decay(), t.weight_decay(), 0.0, "weight_decay");
  const double b1 = t.has_adam_beta1() ? t.adam_beta1() : 0.9;
  const double b2 = t.has_adam_beta2() ? t.adam_beta2() : 0.999;
  a.betas = {json::array({b1, b2}), t.has_adam_beta1() || t.has_adam_beta2(),
             "training.adam_beta1+adam_beta2"};
  a.fp16 = {t.has_fp16() && t.fp16(), t.has_fp16(), "training.fp16"};
  a.bf16 = {t.has_bf16() && t.bf16(), t.has_bf16(), "training.bf16"};
  for (const auto& [arg, lo, hi] :
       {std::tuple<const Arg*, double, double>{&a.lr, 0, 1e9}, {&a.eps, 0, 1},
        {&a.weight_decay, 0, 1e9}, {&a.max_grad_norm, 0, 1e18}}) {
    const double v = arg->value.get<double>();
    if (!(v >= lo && v <= hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg->name, ": ", v, " is not in [", lo, ", ", hi, "]"));
    }
  }
  for (const double b : {b1, b2}) {
    if (!(b >= 0 && b < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("training.adam_beta1/adam_beta2: ", b, " is not in [0, 1)"));
    }
  }
  if (a.fp16.value.get<bool>() && a.bf16.value.get<bool>()) {
    return absl::InvalidArgumentError("training.fp16: and training.bf16 cannot both be true");
  }
  // TrainingArguments.get_warmup_steps: warmup_steps >= 1 is a count, else a fraction of the
  // steps, rounded up (transformers 5; transformers 4 called the fraction warmup_ratio).
  const int64_t steps = t.steps();
  if (t.has_warmup_steps()) {
    const double w = t.warmup_steps();
    if (!(w >= 0) || w > 1e12) {
      return absl::InvalidArgumentError(absl::StrCat("training.warmup_steps: ", w, " must be >= 0"));
    }
    a.warmup_steps = w >= 1 ? static_cast<int64_t>(w)
                            : static_cast<int64_t>(std::ceil(static_cast<double>(steps) * w));
  } else if (t.has_warmup_ratio()) {
    const double r = t.warmup_ratio();
    if (!(r >= 0 && r < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("training.warmup_ratio: ", r, " is not in [0, 1)"));
    }
    a.warmup_steps = static_cast<int64_t>(std::ceil(static_cast<double>(steps) * r));
  }
  a.any_given = a.micro.given || a.accumulation.given || a.max_grad_norm.given || a.lr.given ||
                a.betas.given || a.eps.given || a.weight_decay.given || a.fp16.given ||
                a.bf16.given || t.has_warmup_steps() || t.has_warmup_ratio() ||
                !t.lr_scheduler_type().empty();
  return a;
}

}  // namespace

absl::Status ResolveHfTrainerValues(const loom::v1::TrainingSpec& training, int64_t hidden_size,
                                    int dp_size, json* ds, std::vector<std::string>* notes,
                                    bool* trainer_mode) {
  if (!ds->is_object()) return absl::OkStatus();  // the parser refuses it naming the field
  ASSIGN_OR_RETURN(const TrainerArgs a, ReadArgs(training));
  std::vector<std::string> autos;
  FindAutos(*ds, kRoot, &autos);
  const bool has_optimizer = ds->contains("optimizer") && !(*ds)["optimizer"].is_null();
  *trainer_mode = !autos.empty() || !has_optimizer || a.any_given;

  Resolver r(ds, notes);
  const int64_t micro = a.micro.value.get<int64_t>();
  const int64_t accumulation = a.accumulation.value.get<int64_t>();
  const Arg batch{micro * accumulation * dp_size, a.micro.given || a.accumulation.given,
                  absl::StrCat("data-parallel size ", dp_size,
                               " * per_device_train_batch_size * gradient_accumulation_steps"),
                  /*computed=*/true};
  RETURN_IF_ERROR(r.FillMatch("train_micro_batch_size_per_gpu", a.micro));
  RETURN_IF_ERROR(r.FillMatch("gradient_accumulation_steps", a.accumulation));
  RETURN_IF_ERROR(r.FillMatch("train_batch_size", batch));
  RETURN_IF_ERROR(r.FillMatch("gradient_clipping", a.max_grad_norm));
  RETURN_IF_ERROR(r.FillMatch("optimizer.params.lr", a.lr));
  RETURN_IF_ERROR(r.FillMatch("optimizer.params.betas", a.betas));
  RETURN_IF_ERROR(r.FillMatch("optimizer.params.eps", a.eps));
  RETURN_IF_ERROR(r.FillMatch("optimizer.params.weight_decay", a.weight_decay));
  RETURN_IF_ERROR(r.FillMatch("scheduler.params.warmup_min_lr",
                              {0, false, "not a Trainer argument", true}, /*must_match=*/false));
  RETURN_IF_ERROR(r.FillMatch("scheduler.params.warmup_max_lr", a.lr));
  RETURN_IF_ERROR(r.FillMatch("fp16.enabled", a.fp16));
  RETURN_IF_ERROR(r.FillMatch("bf16.enabled", a.bf16));
  const Arg h2{hidden_size * hidden_size, false, "model.config.hidden_size^2", true};
  const Arg prefetch{static_cast<int64_t>(0.9 * static_cast<double>(hidden_size * hidden_size)),
                     false, "int(0.9 * model.config.hidden_size^2)", true};
  const Arg persistence{10 * hidden_size, false, "10 * model.config.hidden_size", true};
  RETURN_IF_ERROR(r.FillMatch("zero_optimization.reduce_bucket_size", h2, false));
  RETURN_IF_ERROR(r.FillMatch("zero_optimization.stage3_prefetch_bucket_size", prefetch, false));
  RETURN_IF_ERROR(
      r.FillMatch("zero_optimization.stage3_param_persistence_threshold", persistence, false));
  // The Trainer also refuses an explicit total_num_steps other than its step count; a plain
  // DeepSpeed config's decay horizon may differ from training.steps on purpose, so only "auto"
  // is filled here.
  RETURN_IF_ERROR(r.FillMatch("scheduler.params.total_num_steps",
                              {training.steps(), false, "training.steps", true}));
  const bool warmup_given = training.has_warmup_steps() || training.has_warmup_ratio();
  RETURN_IF_ERROR(r.FillMatch("scheduler.params.warmup_num_steps",
                              {std::max<int64_t>(1, a.warmup_steps), warmup_given,
                               "max(1, training.warmup_steps)", true}));

  // No batch size at all: DeepSpeed alone refuses it, but under the Trainer accelerate sets
  // train_micro_batch_size_per_gpu to per_device_train_batch_size; so does Loom.
  if (!ds->contains("train_micro_batch_size_per_gpu") && !ds->contains("train_batch_size")) {
    (*ds)["train_micro_batch_size_per_gpu"] = a.micro.value;
    notes->push_back(absl::StrCat(kRoot, ".train_micro_batch_size_per_gpu: none given -> ",
                                  Show(a.micro.value), " (", a.micro.Source(), ")"));
  }
  // DeepSpeed's pydantic sections drop "auto" (config_utils.py), so an "auto" the Trainer did
  // not fill under zero_optimization is DeepSpeed's default: axolotl's prefetch_bucket_size
  // "auto" (an alias spelling the Trainer does not fill) trains with 5e7.
  if (auto zero = ds->find("zero_optimization"); zero != ds->end() && zero->is_object()) {
    // The section's own keys and those of its blocks (offload_param, offload_optimizer, ...).
    std::vector<std::pair<json*, std::string>> sections = {
        {&*zero, absl::StrCat(kRoot, ".zero_optimization")}};
    for (auto& [key, value] : zero->items()) {
      if (value.is_object()) sections.push_back({&value, absl::StrCat(sections[0].second, ".", key)});
    }
    for (auto& [section, path] : sections) {
      std::vector<std::string> autos;
      for (const auto& [key, value] : section->items()) {
        if (IsAuto(value)) autos.push_back(key);
      }
      for (const std::string& key : autos) {
        section->erase(key);
        notes->push_back(absl::StrCat(path, ".", key, ": \"auto\" -> DeepSpeed's default (its "
                                      "config models drop \"auto\"; the Trainer fills only the "
                                      "keys above)"));
      }
    }
  }
  std::vector<std::string> left;
  FindAutos(*ds, kRoot, &left);
  if (!left.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        left.front(), ": \"auto\" is resolved only where Hugging Face's Trainer resolves it "
        "(batch sizes, gradient_clipping, optimizer and scheduler params, fp16/bf16 enabled, "
        "ZeRO bucket sizes; docs/job-spec.md); give a value",
        left.size() > 1 ? absl::StrCat(" (also: ", absl::StrJoin(left.begin() + 1, left.end(), ", "),
                                       ")")
                        : ""));
  }
  if (!has_optimizer) {
    (*ds)["optimizer"] = {{"type", "AdamW"},
                          {"params",
                           {{"lr", a.lr.value},
                            {"betas", a.betas.value},
                            {"eps", a.eps.value},
                            {"weight_decay", a.weight_decay.value}}}};
    notes->push_back(absl::StrCat(
        kRoot, ".optimizer: none given -> the Trainer's AdamW ", Show((*ds)["optimizer"]["params"]),
        " (training.learning_rate, adam_beta1/2, adam_epsilon, weight_decay)"));
    if (a.weight_decay.value.get<double>() > 0) {
      notes->push_back(absl::StrCat(
          kRoot, ".optimizer: weight_decay ", Show(a.weight_decay.value),
          " applies to every parameter (Hugging Face's Trainer exempts biases and norm weights)"));
    }
  }
  if (!training.lr_scheduler_type().empty() && ds->contains("scheduler") &&
      !(*ds)["scheduler"].is_null()) {
    notes->push_back(absl::StrCat("training.lr_scheduler_type: \"", training.lr_scheduler_type(),
                                  "\" not used: deepspeed_config.scheduler is given (as in "
                                  "Hugging Face's Trainer)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeepSpeedConfig> ParseJobDeepSpeedConfig(const loom::v1::JobSpec& spec,
                                                        int64_t hidden_size, int world_size,
                                                        json* resolved_json) {
  ASSIGN_OR_RETURN(json ds, StructToJson(spec.deepspeed_config(), kRoot));
  // Batch sizes count data-parallel ranks: world / sequence_parallel_size (validated by the
  // parser; a value it would refuse counts as 1 here).
  int dp = world_size;
  if (auto it = ds.find("sequence_parallel_size"); it != ds.end() && it->is_number_integer()) {
    const int64_t p = it->get<int64_t>();
    if (p >= 1 && world_size % p == 0) dp = world_size / static_cast<int>(p);
  }
  std::vector<std::string> notes;
  bool trainer_mode = false;
  RETURN_IF_ERROR(
      ResolveHfTrainerValues(spec.training(), hidden_size, dp, &ds, &notes, &trainer_mode));
  // DeepSpeed 0.19 clips at 1.0 when gradient_clipping is absent (GRADIENT_CLIPPING_DEFAULT;
  // older releases did not clip). A Trainer config gets DeepSpeed's current default, which is
  // also the Trainer's max_grad_norm; a plain DeepSpeed config keeps Loom's earlier reading (no
  // clipping), said in a warning, so that existing jobs keep their trajectories.
  const bool clipping_given = ds.contains("gradient_clipping");
  if (!clipping_given && trainer_mode) {
    ds["gradient_clipping"] = 1.0;
    notes.push_back(absl::StrCat(kRoot, ".gradient_clipping: none given -> 1.0 (DeepSpeed 0.19's "
                                 "default, and the Trainer's max_grad_norm)"));
  }
  ASSIGN_OR_RETURN(DeepSpeedConfig c, ParseDeepSpeedConfigValue(ds, world_size));
  if (!clipping_given && !trainer_mode) {
    c.warnings.push_back(absl::StrCat(kRoot, ".gradient_clipping: not given: no clipping "
                                      "(DeepSpeed 0.19 clips at 1.0 by default; give the key to "
                                      "choose)"));
  }
  const loom::v1::TrainingSpec& t = spec.training();
  const bool has_scheduler = ds.contains("scheduler") && !ds["scheduler"].is_null();
  if (!has_scheduler && trainer_mode) {
    const std::string type = t.lr_scheduler_type().empty() ? "linear" : t.lr_scheduler_type();
    SchedulerConfig& s = c.scheduler;
    if (type == "linear") {
      s.type = SchedulerConfig::Type::kHfLinear;
    } else if (type == "cosine") {
      s.type = SchedulerConfig::Type::kHfCosine;
    } else if (type == "constant") {
      s.type = SchedulerConfig::Type::kHfConstant;
    } else if (type == "constant_with_warmup") {
      s.type = SchedulerConfig::Type::kHfConstantWithWarmup;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "training.lr_scheduler_type: \"", type, "\" is not supported (linear, cosine, "
          "constant, constant_with_warmup)"));
    }
    ASSIGN_OR_RETURN(const TrainerArgs a, ReadArgs(t));
    s.warmup_num_steps = a.warmup_steps;
    s.total_num_steps = t.steps();
    notes.push_back(absl::StrCat(
        kRoot, ".scheduler: none given -> the Trainer's \"", type, "\" schedule over ",
        t.steps(), " steps with ", a.warmup_steps, " warm-up steps (training.lr_scheduler_type",
        t.lr_scheduler_type().empty() ? " unset: the Trainer's default" : "", ")"));
  }
  // A decay horizon other than the job's step count is allowed (DeepSpeed takes it as written)
  // but is usually a copied config whose steps were changed in one place only: the schedule
  // would stop decaying early, or never reach its floor (a newcomer's pass, issue 49).
  if (c.scheduler.total_num_steps > 0 && c.scheduler.total_num_steps != t.steps()) {
    c.warnings.push_back(absl::StrCat(
        kRoot, ".scheduler.params.total_num_steps: ", c.scheduler.total_num_steps,
        ", but training.steps is ", t.steps(), ": the learning rate schedule runs over ",
        c.scheduler.total_num_steps, " steps (\"auto\" follows training.steps)"));
  }
  c.resolved = std::move(notes);
  if (resolved_json != nullptr) *resolved_json = std::move(ds);
  return c;
}

absl::StatusOr<DeepSpeedConfig> ParseJobDeepSpeedConfig(const loom::v1::JobSpec& spec,
                                                        int64_t hidden_size, int world_size) {
  return ParseJobDeepSpeedConfig(spec, hidden_size, world_size, nullptr);
}

}  // namespace loom::spec
