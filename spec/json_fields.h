// Typed reads of JSON fields with error messages that name the field's path. Internal helper of
// the engine's config parsers (torch-free). Integer fields accept JSON integers, integral floats
// (google.protobuf.Struct stores every number as a double) and decimal strings (proto3's JSON
// mapping writes int64 as strings).
#ifndef LOOM_SPEC_JSON_FIELDS_H_
#define LOOM_SPEC_JSON_FIELDS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace loom::spec::json_fields {

// Reads `obj[key]` as an integer. Absent or null -> nullopt. Wrong type -> INVALID_ARGUMENT
// "<path>.<key>: expected an integer, got ...".
absl::StatusOr<std::optional<int64_t>> OptInt(const nlohmann::json& obj, const std::string& key,
                                              const std::string& path);
// Finite number (or numeric string): NaN and infinity in any spelling ("nan", "inf",
// "-Infinity") are refused, INVALID_ARGUMENT "<path>.<key>: expected a finite number, got ...".
absl::StatusOr<std::optional<double>> OptDouble(const nlohmann::json& obj, const std::string& key,
                                                const std::string& path);
absl::StatusOr<std::optional<bool>> OptBool(const nlohmann::json& obj, const std::string& key,
                                            const std::string& path);
absl::StatusOr<std::optional<std::string>> OptString(const nlohmann::json& obj,
                                                     const std::string& key,
                                                     const std::string& path);

// "<path>.<key>" (or just key when path is empty).
std::string Join(const std::string& path, const std::string& key);

}  // namespace loom::spec::json_fields

#endif  // LOOM_SPEC_JSON_FIELDS_H_
