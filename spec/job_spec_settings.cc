#include "spec/job_spec_settings.h"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "spec/yaml_scalar.h"

namespace loom::spec {
namespace {

using nlohmann::json;

// Settings are one flow-style value each: no anchors or aliases to budget for (compare
// services/cli/job_spec_yaml.cc, which reads whole documents).
absl::StatusOr<json> ValueOf(const YAML::Node& node, const std::string& setting) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return json(nullptr);
    case YAML::NodeType::Scalar:
      return YamlScalarToJson(node);
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const YAML::Node& item : node) {
        absl::StatusOr<json> v = ValueOf(item, setting);
        if (!v.ok()) return v.status();
        out.push_back(*std::move(v));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return absl::InvalidArgumentError(
              absl::StrCat("setting '", setting, "': keys must be scalars"));
        }
        absl::StatusOr<json> v = ValueOf(kv.second, setting);
        if (!v.ok()) return v.status();
        out[kv.first.Scalar()] = *std::move(v);
      }
      return out;
    }
  }
  return json(nullptr);
}

absl::Status Apply(const std::string& setting, json& doc) {
  const size_t colon = setting.find(": ");
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting '", setting, "': expected 'PATH: VALUE'"));
  }
  YAML::Node node;
  try {
    node = YAML::Load(setting.substr(colon + 2));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("setting '", setting, "': the value is not YAML: ", e.msg));
  }
  absl::StatusOr<json> value = ValueOf(node, setting);
  if (!value.ok()) return value.status();
  const std::vector<std::string> keys = absl::StrSplit(setting.substr(0, colon), '.');
  json* at = &doc;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    json& next = (*at)[keys[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("setting '", setting, "': '", keys[i],
                                                     "' is not an object in the spec"));
    }
    at = &next;
  }
  (*at)[keys.back()] = *std::move(value);
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyJobSpecSettings(const std::vector<std::string>& settings,
                                  loom::v1::JobSpec* spec) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  std::string text;
  if (auto s = google::protobuf::util::MessageToJsonString(*spec, &text, print); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", s.ToString()));
  }
  json doc = json::parse(text);
  for (const std::string& setting : settings) {
    if (absl::Status s = Apply(setting, doc); !s.ok()) return s;
  }
  loom::v1::JobSpec out;
  if (auto s = google::protobuf::util::JsonStringToMessage(
          doc.dump(-1, ' ', false, json::error_handler_t::replace), &out);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("settings [", absl::StrJoin(settings, "; "),
                                                   "]: ", s.ToString()));
  }
  *spec = std::move(out);
  return absl::OkStatus();
}

}  // namespace loom::spec
