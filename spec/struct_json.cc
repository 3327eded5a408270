#include "spec/struct_json.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::spec {
namespace {

using nlohmann::json;

// The number as protobuf's JSON printer writes a double (SimpleDtoa: "%.15g", "%.17g" when
// that does not read back as the same double) and as nlohmann reads that text back.
json Number(double v) {
  // The printer's text for a non-integral double always has a '.' or an 'e' (a digits-only text
  // that reads back as v makes v integral, and "%.17g" always reads back), and an integral
  // |v| < 1e15 prints as its digits under "%.15g": both answers are known without printing.
  if (v != std::trunc(v)) return json(v);
  if (std::fabs(v) < 1e15) {
    if (v < 0) return json(static_cast<int64_t>(v));
    return json(static_cast<uint64_t>(v));
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.15g", v);
  if (std::strtod(text, nullptr) != v) std::snprintf(text, sizeof(text), "%.17g", v);
  const char* p = text[0] == '-' ? text + 1 : text;
  for (; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') return json(v);  // '.', 'e': a double
  }
  // Integral, at most 17 digits: exact in int64 and uint64.
  if (v < 0) return json(static_cast<int64_t>(v));
  return json(static_cast<uint64_t>(v));
}

absl::StatusOr<json> ValueToJson(const google::protobuf::Value& v, const std::string& path);

absl::StatusOr<json> FieldsToJson(const google::protobuf::Struct& s, const std::string& path) {
  json out = json::object();
  for (const auto& [key, value] : s.fields()) {
    if (value.kind_case() == google::protobuf::Value::KIND_NOT_SET) continue;  // as the printer
    absl::StatusOr<json> j = ValueToJson(value, absl::StrCat(path, ".", key));
    if (!j.ok()) return j.status();
    out[key] = *std::move(j);
  }
  return out;
}

absl::StatusOr<json> ValueToJson(const google::protobuf::Value& v, const std::string& path) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNullValue:
      return json(nullptr);
    case google::protobuf::Value::kNumberValue:
      if (!std::isfinite(v.number_value())) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": cannot convert to JSON: ", v.number_value(), " has no JSON representation"));
      }
      return Number(v.number_value());
    case google::protobuf::Value::kStringValue:
      return json(v.string_value());
    case google::protobuf::Value::kBoolValue:
      return json(v.bool_value());
    case google::protobuf::Value::kStructValue:
      return FieldsToJson(v.struct_value(), path);
    case google::protobuf::Value::kListValue: {
      json out = json::array();
      for (int i = 0; i < v.list_value().values_size(); ++i) {
        const google::protobuf::Value& e = v.list_value().values(i);
        if (e.kind_case() == google::protobuf::Value::KIND_NOT_SET) continue;  // as the printer
        absl::StatusOr<json> j = ValueToJson(e, absl::StrCat(path, "[", i, "]"));
        if (!j.ok()) return j.status();
        out.push_back(*std::move(j));
      }
      return out;
    }
    case google::protobuf::Value::KIND_NOT_SET:
      break;  // not reached: both callers leave such a value out, as the printer does
  }
  return json(nullptr);
}

}  // namespace

absl::StatusOr<json> StructToJson(const google::protobuf::Struct& s, absl::string_view path) {
  return FieldsToJson(s, std::string(path));
}

}  // namespace loom::spec
