// Typed reads of JSON fields with error messages that name the field's path. Internal helper of
// the engine's config parsers (torch-free). Integer fields accept JSON integers, integral floats
// (google.protobuf.Struct stores every number as a double) and decimal strings (proto3's JSON
// mapping writes int64 as strings).
#ifndef LOOM_SPEC_JSON_FIELDS_H_
#define LOOM_SPEC_JSON_FIELDS_H_

#include <algorithm>
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

// Levenshtein distance between `a` and `b` (insertions, deletions, substitutions; bytes).
// Hand-written: neither absl nor the standard library offers one, and 20 lines beat a new
// dependency for key names of ~30 bytes.
int EditDistance(const std::string& a, const std::string& b);

// The candidate nearest to `key` within edit distance max(2, key.size() / 4) (the first of
// equals), or "" if none is that near: the "did you mean" of a misspelt key.
template <typename Range>
std::string NearestKey(const std::string& key, const Range& candidates) {
  std::string nearest;
  int best = std::max<int>(2, static_cast<int>(key.size()) / 4) + 1;
  for (const auto& candidate : candidates) {
    const std::string c(candidate);
    const int d = EditDistance(key, c);
    if (d < best && d > 0) {
      best = d;
      nearest = c;
    }
  }
  return nearest;
}

}  // namespace loom::spec::json_fields

#endif  // LOOM_SPEC_JSON_FIELDS_H_
