#include "spec/json_fields.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom::spec::json_fields {

using nlohmann::json;

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

namespace {
absl::Status TypeError(const std::string& path, const std::string& key, const char* expected,
                       const json& v) {
  return absl::InvalidArgumentError(
      absl::StrCat(Join(path, key), ": expected ", expected, ", got ", v.dump()));
}
}  // namespace

absl::StatusOr<std::optional<int64_t>> OptInt(const json& obj, const std::string& key,
                                              const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  const json& v = *it;
  if (v.is_number_integer()) return std::optional<int64_t>(v.get<int64_t>());
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
      return std::optional<int64_t>(static_cast<int64_t>(d));
    }
    return TypeError(path, key, "an integer", v);
  }
  if (v.is_string()) {
    int64_t out = 0;
    if (absl::SimpleAtoi(v.get<std::string>(), &out)) return std::optional<int64_t>(out);
  }
  return TypeError(path, key, "an integer", v);
}

absl::StatusOr<std::optional<double>> OptDouble(const json& obj, const std::string& key,
                                                const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>();
  const json& v = *it;
  // absl::SimpleAtod accepts "nan" and "inf". A NaN passes every range check written as
  // `v < lo || v > hi`, an inf passes every `v < lo` (an lr of "inf" trained to NaN and exited
  // 0), and neither is a meaningful setting of any key: both are refused here, for every key
  // (numbers too, for a json built in code; the parser itself refuses 1e999).
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::isfinite(d)) return std::optional<double>(d);
    return absl::InvalidArgumentError(  // v.dump() would print an inf as null
        absl::StrCat(Join(path, key), ": expected a finite number, got ", d));
  } else if (v.is_string()) {
    double out = 0;
    if (absl::SimpleAtod(v.get<std::string>(), &out) && std::isfinite(out)) {
      return std::optional<double>(out);
    }
  }
  return TypeError(path, key, "a finite number", v);
}

absl::StatusOr<std::optional<bool>> OptBool(const json& obj, const std::string& key,
                                            const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<bool>();
  if (it->is_boolean()) return std::optional<bool>(it->get<bool>());
  return TypeError(path, key, "a boolean", *it);
}

absl::StatusOr<std::optional<std::string>> OptString(const json& obj, const std::string& key,
                                                     const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  return TypeError(path, key, "a string", *it);
}

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace loom::spec::json_fields
