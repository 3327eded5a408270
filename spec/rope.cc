#include "spec/rope.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spec/json_fields.h"

namespace loom::spec {

using nlohmann::json;

namespace {

constexpr char kPath[] = "model.config";
constexpr double kPi = 3.14159265358979323846;

// In RopeType order.
constexpr const char* kRopeTypeNames[] = {"default", "linear", "dynamic",
                                          "yarn",    "longrope", "llama3"};

// The keys each type reads beside rope_type/type, rope_theta and partial_rotary_factor
// (transformers' _validate_<type>_rope_parameters: required and optional keys).
std::vector<std::string> KeysOf(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return {};
    case RopeType::kLinear:
    case RopeType::kDynamic:
      return {"factor"};
    case RopeType::kYarn:
      return {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "truncate"};
    case RopeType::kLongrope:
      return {"short_factor", "long_factor", "original_max_position_embeddings", "factor",
              "attention_factor"};
    case RopeType::kLlama3:
      return {"factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings"};
  }
  return {};
}

std::string Shown(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

absl::Status Bad(const std::string& path, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

// A positive finite number, or nullopt when absent/null.
absl::StatusOr<std::optional<double>> OptPositive(const json& block, const std::string& key,
                                                  const std::string& path) {
  ASSIGN_OR_RETURN(std::optional<double> v, json_fields::OptDouble(block, key, path));
  if (v.has_value() && !(*v > 0)) {
    return Bad(json_fields::Join(path, key), absl::StrCat(*v, " must be positive"));
  }
  return v;
}

absl::StatusOr<std::vector<double>> FactorList(const json& block, const std::string& key,
                                               const std::string& path, int64_t want) {
  const std::string field = json_fields::Join(path, key);
  auto it = block.find(key);
  if (it == block.end() || it->is_null()) return Bad(field, "required for rope_type \"longrope\"");
  if (!it->is_array()) {
    return Bad(field, absl::StrCat("expected a list of numbers, got ", Shown(*it)));
  }
  if (static_cast<int64_t>(it->size()) != want) {
    return Bad(field, absl::StrCat("has ", it->size(), " entries, expected head_dim / 2 = ", want));
  }
  std::vector<double> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) {
      return Bad(absl::StrCat(field, "[", i, "]"),
                 absl::StrCat(Shown(v), " is not a positive number"));
    }
    out.push_back(v.get<double>());
  }
  return out;
}

// Reads one block (rope_scaling or rope_parameters, merged) into *s.
absl::Status ParseBlock(const json& block, const std::string& path, int64_t head_dim,
                        RopeScaling* s, std::vector<std::string>* warnings) {
  // rope_type, or the older "type" (transformers: rope_type defaults to type).
  std::optional<std::string> type_name;
  for (const char* key : {"type", "rope_type"}) {
    auto it = block.find(key);
    if (it == block.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return Bad(json_fields::Join(path, key), absl::StrCat("expected a string, got ", Shown(*it)));
    }
    if (type_name.has_value() && *type_name != it->get<std::string>()) {
      return Bad(json_fields::Join(path, key),
                 absl::StrCat(Shown(*it), " differs from type \"", *type_name, "\""));
    }
    type_name = it->get<std::string>();
  }
  if (type_name.has_value()) {
    bool found = false;
    for (size_t i = 0; i < std::size(kRopeTypeNames); ++i) {
      if (*type_name == kRopeTypeNames[i]) {
        s->rope_type = static_cast<RopeType>(i);
        found = true;
      }
    }
    if (!found) {
      return Bad(json_fields::Join(path, block.contains("rope_type") ? "rope_type" : "type"),
                 absl::StrCat(Shown(json(*type_name)), " is not supported (supported: ",
                              absl::StrJoin(kRopeTypeNames, ", "), ")"));
    }
  }
  const std::string type_shown = absl::StrCat("\"", RopeTypeName(s->rope_type), "\"");
  const std::vector<std::string> keys = KeysOf(s->rope_type);
  for (const auto& [key, value] : block.items()) {
    if (key == "type" || key == "rope_type" || key == "rope_theta") continue;
    if (key == "partial_rotary_factor") {
      ASSIGN_OR_RETURN(std::optional<double> p, json_fields::OptDouble(block, key, path));
      if (p.has_value() && *p != 1.0) {
        return Bad(json_fields::Join(path, key),
                   absl::StrCat(*p, " is not supported (partial rotary embeddings are not "
                                "implemented; only 1.0)"));
      }
      continue;
    }
    if (value.is_object()) {  // per layer type (Gemma 3): {"full_attention": {...}, ...}
      return Bad(path, absl::StrCat("per-layer-type RoPE (\"", key, "\") is not supported"));
    }
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::string shown = Shown(json(key));  // escaped, in quotes
      warnings->push_back(absl::StrCat(path, ".", shown.substr(1, shown.size() - 2),
                                       ": not read for rope_type ", type_shown, ", ignored"));
    }
  }
  auto required = [&](const char* key) -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(std::optional<double> v, OptPositive(block, key, path));
    if (!v.has_value()) {
      return Bad(json_fields::Join(path, key), absl::StrCat("required for rope_type ", type_shown));
    }
    return *v;
  };
  auto read_orig = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::optional<int64_t> o,
                     json_fields::OptInt(block, "original_max_position_embeddings", path));
    if (o.has_value() && *o <= 0) {
      return Bad(json_fields::Join(path, "original_max_position_embeddings"),
                 absl::StrCat(*o, " must be positive"));
    }
    s->original_max_position_embeddings = o;
    return absl::OkStatus();
  };
  switch (s->rope_type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
    case RopeType::kDynamic: {
      ASSIGN_OR_RETURN(s->factor, required("factor"));
      if (s->rope_type == RopeType::kDynamic && head_dim <= 2) {
        return Bad(json_fields::Join(path, "rope_type"),
                   "\"dynamic\" needs head_dim > 2 (its base exponent is d / (d - 2))");
      }
      break;
    }
    case RopeType::kYarn: {
      if (!block.contains("factor")) {
        return Bad(json_fields::Join(path, "factor"), absl::StrCat("required for rope_type ",
                                                                  type_shown));
      }
      ASSIGN_OR_RETURN(s->factor, OptPositive(block, "factor", path));  // null: mpe / original
      RETURN_IF_ERROR(read_orig());
      ASSIGN_OR_RETURN(s->attention_factor, OptPositive(block, "attention_factor", path));
      ASSIGN_OR_RETURN(s->beta_fast, json_fields::OptDouble(block, "beta_fast", path));
      ASSIGN_OR_RETURN(s->beta_slow, json_fields::OptDouble(block, "beta_slow", path));
      ASSIGN_OR_RETURN(s->mscale, json_fields::OptDouble(block, "mscale", path));
      ASSIGN_OR_RETURN(s->mscale_all_dim, json_fields::OptDouble(block, "mscale_all_dim", path));
      ASSIGN_OR_RETURN(s->truncate, json_fields::OptBool(block, "truncate", path));
      break;
    }
    case RopeType::kLongrope: {
      ASSIGN_OR_RETURN(s->short_factor, FactorList(block, "short_factor", path, head_dim / 2));
      ASSIGN_OR_RETURN(s->long_factor, FactorList(block, "long_factor", path, head_dim / 2));
      RETURN_IF_ERROR(read_orig());
      ASSIGN_OR_RETURN(s->factor, OptPositive(block, "factor", path));
      ASSIGN_OR_RETURN(s->attention_factor, OptPositive(block, "attention_factor", path));
      break;
    }
    case RopeType::kLlama3: {
      ASSIGN_OR_RETURN(s->factor, required("factor"));
      ASSIGN_OR_RETURN(s->low_freq_factor, required("low_freq_factor"));
      ASSIGN_OR_RETURN(s->high_freq_factor, required("high_freq_factor"));
      if (!(*s->high_freq_factor > *s->low_freq_factor)) {
        return Bad(json_fields::Join(path, "high_freq_factor"),
                   absl::StrCat(*s->high_freq_factor, " must be greater than low_freq_factor ",
                                *s->low_freq_factor));
      }
      RETURN_IF_ERROR(read_orig());
      break;
    }
  }
  return absl::OkStatus();
}

// transformers' yarn_get_mscale: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1).
double YarnMscale(double scale, double mscale = 1.0) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

const char* RopeTypeName(RopeType type) { return kRopeTypeNames[static_cast<int>(type)]; }

absl::Status ParseRopeConfig(const json& config, int64_t head_dim, int64_t max_position_embeddings,
                             double* rope_theta, RopeScaling* scaling,
                             std::vector<std::string>* warnings) {
  *scaling = RopeScaling();
  ASSIGN_OR_RETURN(std::optional<double> top_theta,
                   json_fields::OptDouble(config, "rope_theta", kPath));
  const json* blocks[2] = {nullptr, nullptr};  // rope_scaling, rope_parameters
  const char* names[2] = {"rope_scaling", "rope_parameters"};
  for (int i = 0; i < 2; ++i) {
    auto it = config.find(names[i]);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) {
      return Bad(json_fields::Join(kPath, names[i]),
                 absl::StrCat("expected an object or null, got ", Shown(*it)));
    }
    blocks[i] = &*it;
  }
  // Both layouts at once (a transformers-5 rope_parameters beside a hand-added rope_scaling):
  // transformers lets rope_scaling win; Loom takes them only when they agree.
  json block = json::object();
  std::string path = absl::StrCat(kPath, ".rope_parameters");
  if (blocks[1] != nullptr) block = *blocks[1];
  if (blocks[0] != nullptr) {
    path = absl::StrCat(kPath, ".rope_scaling");
    for (const auto& [key, value] : blocks[0]->items()) {
      std::string other = key == "type" && block.contains("rope_type") ? "rope_type" : key;
      if (blocks[1] != nullptr && block.contains(other) && block[other] != value) {
        return Bad(absl::StrCat(path, ".", key),
                   absl::StrCat(Shown(value), " differs from rope_parameters.", other, " ",
                                Shown(block[other]), ": give the RoPE parameters once"));
      }
      block[key] = value;
    }
  }
  std::optional<double> block_theta;
  if (!block.empty()) {
    ASSIGN_OR_RETURN(block_theta, json_fields::OptDouble(block, "rope_theta", path));
  }
  if (block_theta.has_value() && top_theta.has_value() && *block_theta != *top_theta) {
    return Bad(absl::StrCat(path, ".rope_theta"),
               absl::StrCat(*block_theta, " differs from rope_theta ", *top_theta,
                            ": give the RoPE base once"));
  }
  *rope_theta = block_theta.value_or(top_theta.value_or(10000.0));
  if (!(*rope_theta > 0)) {
    return Bad(block_theta.has_value() ? absl::StrCat(path, ".rope_theta")
                                       : absl::StrCat(kPath, ".rope_theta"),
               "must be positive");
  }
  RETURN_IF_ERROR(ParseBlock(block, path, head_dim, scaling, warnings));
  // Phi-3 keeps the pre-training length at the top level; transformers gives it priority.
  ASSIGN_OR_RETURN(std::optional<int64_t> top_orig,
                   json_fields::OptInt(config, "original_max_position_embeddings", kPath));
  if (top_orig.has_value()) {
    if (*top_orig <= 0) {
      return Bad(absl::StrCat(kPath, ".original_max_position_embeddings"),
                 absl::StrCat(*top_orig, " must be positive"));
    }
    const bool reads = scaling->rope_type == RopeType::kYarn ||
                       scaling->rope_type == RopeType::kLongrope ||
                       scaling->rope_type == RopeType::kLlama3;
    if (reads && scaling->original_max_position_embeddings.has_value() &&
        *scaling->original_max_position_embeddings != *top_orig) {
      return Bad(absl::StrCat(kPath, ".original_max_position_embeddings"),
                 absl::StrCat(*top_orig, " differs from ", path,
                              ".original_max_position_embeddings ",
                              *scaling->original_max_position_embeddings));
    }
    if (reads) scaling->original_max_position_embeddings = top_orig;
  }
  (void)max_position_embeddings;
  return absl::OkStatus();
}

json RopeScalingToJson(const RopeScaling& s) {
  if (s.rope_type == RopeType::kDefault) return nullptr;
  json j;
  j["rope_type"] = RopeTypeName(s.rope_type);
  auto put = [&j](const char* key, const auto& v) {
    if (v.has_value()) j[key] = *v;
  };
  if (s.rope_type == RopeType::kYarn && !s.factor.has_value()) {
    j["factor"] = nullptr;  // yarn requires the key; null means mpe / original
  }
  put("factor", s.factor);
  put("original_max_position_embeddings", s.original_max_position_embeddings);
  put("attention_factor", s.attention_factor);
  put("beta_fast", s.beta_fast);
  put("beta_slow", s.beta_slow);
  put("mscale", s.mscale);
  put("mscale_all_dim", s.mscale_all_dim);
  put("truncate", s.truncate);
  put("low_freq_factor", s.low_freq_factor);
  put("high_freq_factor", s.high_freq_factor);
  if (s.rope_type == RopeType::kLongrope) {
    j["short_factor"] = s.short_factor;
    j["long_factor"] = s.long_factor;
  }
  return j;
}

RopeFrequencies ComputeRopeFrequencies(double theta, const RopeScaling& s, int64_t head_dim,
                                       int64_t max_position_embeddings, int64_t seq_len) {
  const int64_t dim = head_dim, half = head_dim / 2;
  const double mpe = static_cast<double>(max_position_embeddings);
  const double orig =
      static_cast<double>(s.original_max_position_embeddings.value_or(max_position_embeddings));
  double base = theta;
  if (s.rope_type == RopeType::kDynamic) {
    // _compute_dynamic_ntk_parameters with seq_len = max(seq_len, max_position_embeddings).
    const double factor = *s.factor;
    const double len = std::max<double>(static_cast<double>(seq_len), mpe);
    base = base * std::pow(factor * len / mpe - (factor - 1),
                           static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  // pos_freqs[i] = base^(2i / d); the default inverse frequency is 1 / pos_freqs.
  std::vector<double> pos_freqs(half);
  for (int64_t i = 0; i < half; ++i) {
    pos_freqs[i] = std::pow(base, static_cast<double>(2 * i) / static_cast<double>(dim));
  }
  RopeFrequencies out;
  out.inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i) out.inv_freq[i] = 1.0 / pos_freqs[i];
  switch (s.rope_type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:
      break;
    case RopeType::kLinear:  // _compute_linear_scaling_rope_parameters
      for (double& f : out.inv_freq) f /= *s.factor;
      break;
    case RopeType::kYarn: {  // _compute_yarn_parameters
      const double factor = s.factor.value_or(mpe / orig);
      if (s.attention_factor.has_value()) {
        out.attention_scaling = *s.attention_factor;
      } else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0) {
        out.attention_scaling =
            YarnMscale(factor, *s.mscale) / YarnMscale(factor, *s.mscale_all_dim);
      } else {
        out.attention_scaling = YarnMscale(factor);
      }
      const double beta_fast = s.beta_fast.value_or(0) != 0 ? *s.beta_fast : 32.0;
      const double beta_slow = s.beta_slow.value_or(0) != 0 ? *s.beta_slow : 1.0;
      auto correction_dim = [&](double rotations) {  // find_correction_dim
        return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * kPi))) /
               (2 * std::log(base));
      };
      double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
      if (s.truncate.value_or(true)) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // linear_ramp_factor's guard against a singularity
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;
        const double interpolation_freq = 1.0 / (factor * pos_freqs[i]);
        out.inv_freq[i] = interpolation_freq * (1 - extrapolation) +
                          (1.0 / pos_freqs[i]) * extrapolation;
      }
      break;
    }
    case RopeType::kLongrope: {  // _compute_longrope_parameters + longrope_frequency_update
      const double factor = s.factor.value_or(mpe / orig);
      if (s.attention_factor.has_value()) {
        out.attention_scaling = *s.attention_factor;
      } else {
        out.attention_scaling =
            factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(orig));
      }
      const std::vector<double>& ext =
          static_cast<double>(seq_len) > orig ? s.long_factor : s.short_factor;
      for (int64_t i = 0; i < half; ++i) out.inv_freq[i] = 1.0 / (ext[i] * pos_freqs[i]);
      break;
    }
    case RopeType::kLlama3: {  // _compute_llama3_parameters
      const double factor = *s.factor, low = *s.low_freq_factor, high = *s.high_freq_factor;
      const double low_freq_wavelen = orig / low, high_freq_wavelen = orig / high;
      for (double& f : out.inv_freq) {
        const double wavelen = 2 * kPi / f;
        if (wavelen > low_freq_wavelen) {
          f = f / factor;
        } else if (!(wavelen < high_freq_wavelen)) {  // medium: smooth between the two
          const double smooth = (orig / wavelen - low) / (high - low);
          f = (1 - smooth) * f / factor + smooth * f;
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace loom::spec
