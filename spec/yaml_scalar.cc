#include "spec/yaml_scalar.h"

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"

namespace loom::spec {

nlohmann::json YamlScalarToJson(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted
  if (s == "null" || s == "~" || s.empty()) return nullptr;
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  int64_t i;
  if (absl::SimpleAtoi(s, &i)) return i;
  double d;
  if (absl::SimpleAtod(s, &d) && s.find_first_of("0123456789") != std::string::npos) return d;
  return s;
}

}  // namespace loom::spec
