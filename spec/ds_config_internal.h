// Internal to ds_config.cc and ds_config_offload.cc: the key-policy helpers of the DeepSpeed
// config parser (ds_config.h has the policy) and the offload / aio section parsers. Not a public
// API. Errors are INVALID_ARGUMENT "<key path>: <what>", or several such problems in one status
// (common/problems.h); all functions are pure and thread-safe.
#ifndef LOOM_SPEC_DS_CONFIG_INTERNAL_H_
#define LOOM_SPEC_DS_CONFIG_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/problems.h"
#include "spec/ds_config.h"
#include "spec/json_fields.h"

namespace loom::spec::ds_config_internal {

using loom::Problems;
using nlohmann::json;
using json_fields::Join;

inline constexpr char kRoot[] = "deepspeed_config";

inline absl::Status Invalid(const std::string& path, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

inline absl::Status Unsupported(const std::string& path, const std::string& what) {
  return Invalid(path, absl::StrCat(what, " is not supported yet"));
}

// Rejects keys of `obj` outside `known` ("unknown key", with "(did you mean <key>?)" when one
// is near: json_fields::NearestKey), a literal list {"a", "b", ...} scanned in place (a set
// of strings built per call was most of a DeepSpeed config's parse, which runs for every
// submission: docs/benchmarks.md "Control plane at cluster scale").
// Every unknown key is named (common/problems.h: one problem each).
inline absl::Status CheckKeys(const json& obj, const std::string& path,
                              std::initializer_list<absl::string_view> known) {
  Problems problems;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(known.begin(), known.end(), absl::string_view(it.key())) == known.end()) {
      // DeepSpeed's own sections refuse unknown keys too (pydantic, extra="forbid").
      const std::string nearest = json_fields::NearestKey(it.key(), known);
      problems.Add(Join(path, it.key()),
                   nearest.empty() ? "unknown key"
                                   : absl::StrCat("unknown key (did you mean ", nearest, "?)"));
    }
  }
  return problems.ToStatus();
}

// Keys present in `obj` that the engine accepts without implementing them: a warning each, in
// key order.
inline void WarnIgnored(const json& obj, const std::string& path,
                        std::initializer_list<absl::string_view> keys, const std::string& why,
                        std::vector<std::string>* warnings) {
  std::vector<absl::string_view> present;
  for (absl::string_view k : keys) {
    if (obj.find(k) != obj.end()) present.push_back(k);
  }
  std::sort(present.begin(), present.end());
  for (absl::string_view k : present) {
    warnings->push_back(absl::StrCat(Join(path, std::string(k)), ": ignored (", why, ")"));
  }
}

inline absl::StatusOr<const json*> OptObject(const json& obj, const std::string& key,
                                      const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return static_cast<const json*>(nullptr);
  if (!it->is_object()) return Invalid(Join(path, key), "expected a JSON object");
  return &*it;
}

template <typename T, typename R>
absl::Status Read(R result, T* out) {
  if (!result.ok()) return result.status();
  if (result->has_value()) *out = static_cast<T>(**result);
  return absl::OkStatus();
}

inline absl::Status ReadInt(const json& o, const std::string& k, const std::string& p, int64_t* out) {
  return Read(json_fields::OptInt(o, k, p), out);
}
inline absl::Status ReadDouble(const json& o, const std::string& k, const std::string& p, double* out) {
  return Read(json_fields::OptDouble(o, k, p), out);
}
inline absl::Status ReadBool(const json& o, const std::string& k, const std::string& p, bool* out) {
  return Read(json_fields::OptBool(o, k, p), out);
}
inline absl::Status ReadString(const json& o, const std::string& k, const std::string& p,
                        std::string* out) {
  return Read(json_fields::OptString(o, k, p), out);
}

// zero_optimization.<key> (offload_param when is_param, else offload_optimizer) into `o`, with
// DeepSpeed's defaults; warnings for the keys Loom does not act on.
absl::Status ParseOffload(const json& zero, const std::string& key, const std::string& zpath,
                          OffloadConfig* o, bool is_param, std::vector<std::string>* warnings);

// zero_optimization.zenflow into zc->zenflow (after the stage, overlap_comm and offload sections
// are read, which its constraints refer to); ds_config_zenflow.cc.
absl::Status ParseZenFlow(const json& zero, const std::string& zpath, ZeroConfig* zc,
                          std::vector<std::string>* warnings);

// The top-level "aio" section into c->aio; warnings for the libaio keys.
// offload_optimizer.super_offload / ratio / cpuadam_cores_perc (ds_config_super_offload.cc).
absl::Status ParseSuperOffload(const json& off, const std::string& path, bool is_param,
                               OffloadConfig* o);
absl::Status ParseAio(const json& root, DeepSpeedConfig* c);
// tensorboard and csv_monitor (MonitorConfig); wandb and comet warned as ignored.
absl::Status ParseMonitors(const json& root, DeepSpeedConfig* c);

// sequence_parallel_size (1 <= P, P divides world_size) and seq_parallel_communication_data_type
// (fp32 default, bf16) into `c` (ds_config_sequence_parallel.cc).
absl::Status ParseSequenceParallel(const json& root, int world_size, DeepSpeedConfig* c);
// communication_data_type (fp32, bf16, fp16; default the param dtype) into
// c->communication_data_type, checked against the ZeRO stage already in `c`
// (ds_config_communication.cc).
absl::Status ParseCommunicationDataType(const json& root, DeepSpeedConfig* c);
// The top-level "activation_checkpointing" section into c->activation_checkpointing
// (ds_config_activation.cc); warnings for the keys that do not act.
absl::Status ParseActivationCheckpointing(const json& root, DeepSpeedConfig* c);

// ds_config_keys.cc: the top-level keys as DeepSpeed judges them (unknown ones warned about,
// misspellings and unimplemented features refused, all in one error); warnings appended.
absl::Status CheckRootKeys(const json& root, std::vector<std::string>* warnings);
// zero_optimization's alias spellings rewritten to the stage3_ names; INVALID_ARGUMENT when both
// spellings are given with different values.
absl::Status NormalizeZeroAliases(json* root);

}  // namespace loom::spec::ds_config_internal

#endif  // LOOM_SPEC_DS_CONFIG_INTERNAL_H_
