#include "services/cli/job_spec_yaml.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "spec/yaml_scalar.h"

namespace loom::cli {
namespace {

using nlohmann::json;

// Spec files and the JSON files they name are small; a bigger one is a mistake (or /dev/zero).
constexpr int64_t kMaxSpecFileBytes = 64 << 20;

// "line L, column C" (1-based) of byte `offset` of `s`.
std::string LineAndColumn(const std::string& s, size_t offset) {
  int line = 1, col = 1;
  for (size_t i = 0; i < offset && i < s.size(); ++i) {
    if (s[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return absl::StrCat("line ", line, ", column ", col);
}

// What a document may expand to. yaml-cpp keeps an alias as a second reference to its anchor's
// node, so nested aliases ("billion laughs": ten references to a list of ten references to ...)
// cost nothing to load but grow exponentially when converted; the conversion stops at these.
// A real job spec has about a hundred nodes and a few KiB of scalars.
constexpr int64_t kMaxYamlNodes = 100'000;
constexpr int64_t kMaxYamlScalarBytes = 4 << 20;

// Counts aliases (`*name`) while yaml-cpp parses, so an over-budget error can say where the
// expansion comes from.
class AliasCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    if (aliases_++ == 0) first_ = mark;
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  int64_t aliases() const { return aliases_; }
  const YAML::Mark& first() const { return first_; }

 private:
  int64_t aliases_ = 0;
  YAML::Mark first_;
};

struct ExpansionBudget {
  int64_t nodes = 0;
  int64_t scalar_bytes = 0;
  bool exceeded() const { return nodes > kMaxYamlNodes || scalar_bytes > kMaxYamlScalarBytes; }
};

absl::StatusOr<json> YamlToJson(const YAML::Node& node, const std::string& path,
                                ExpansionBudget& budget) {
  ++budget.nodes;
  if (node.IsScalar()) budget.scalar_bytes += static_cast<int64_t>(node.Scalar().size());
  if (budget.exceeded()) {
    return absl::ResourceExhaustedError(path);  // rewritten by JobSpecFromYaml
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return json(nullptr);
    case YAML::NodeType::Scalar:
      return spec::YamlScalarToJson(node);
    case YAML::NodeType::Sequence: {
      json arr = json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        ASSIGN_OR_RETURN(json v, YamlToJson(node[i], absl::StrCat(path, "[", i, "]"), budget));
        arr.push_back(std::move(v));
      }
      return arr;
    }
    case YAML::NodeType::Map: {
      json obj = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": keys must be scalars"));
        }
        std::string key = kv.first.Scalar();
        std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
        if (obj.contains(key)) {
          return absl::InvalidArgumentError(absl::StrCat(child, ": duplicate key"));
        }
        ASSIGN_OR_RETURN(obj[key], YamlToJson(kv.second, child, budget));
      }
      return obj;
    }
  }
  return json(nullptr);
}

// Replaces a string value at obj[key] by the JSON object in that file.
absl::Status InlineJsonFile(json& obj, const std::string& key, const std::string& field,
                            const SpecFiles& files) {
  if (!obj.contains(key) || !obj[key].is_string()) return absl::OkStatus();
  std::string file = obj[key].get<std::string>();
  std::string path = file;
  absl::StatusOr<std::string> text;
  if (files.uploaded != nullptr) {
    auto it = files.uploaded->find(file);
    if (it == files.uploaded->end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": '", file.substr(0, 256), "' names a file that was not sent with the request "
          "(inline its JSON object, or send multipart/form-data with a part whose filename is '",
          file.substr(0, 256), "')"));
    }
    text = it->second;
  } else {
    path = (!file.empty() && file[0] == '/') ? file : absl::StrCat(files.base_dir, "/", file);
    text = ReadRegularFile(path, kMaxSpecFileBytes);
  }
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot read '", path, "': ", text.status().message()));
  }
  json parsed = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is not a JSON object"));
  }
  obj[key] = std::move(parsed);
  return absl::OkStatus();
}

// A string where a proto field wants a number or a boolean. protobuf's JSON parser accepts
// "100" for numeric fields (the proto3 JSON form of int64), so a quoted number in YAML would be
// coerced silently; "" if `value` is not such a string.
std::string QuotedScalarError(const json& value, const google::protobuf::FieldDescriptor* f,
                              const std::string& path) {
  using FD = google::protobuf::FieldDescriptor;
  if (!value.is_string() || f->is_repeated()) return "";
  const std::string text = value.get<std::string>().substr(0, 40);
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
    case FD::CPPTYPE_INT64:
    case FD::CPPTYPE_UINT32:
    case FD::CPPTYPE_UINT64:
    case FD::CPPTYPE_DOUBLE:
    case FD::CPPTYPE_FLOAT:
      return absl::StrCat(path, ": expected a number, got the string \"", text,
                          "\" (write it without quotes)");
    case FD::CPPTYPE_BOOL:
      return absl::StrCat(path, ": expected true or false, got the string \"", text, "\"");
    default:
      return "";
  }
}

// Names the first key of `obj` that `desc` lacks, or the first quoted number, with its dotted
// path. Struct-typed fields (free-form JSON) are not descended into.
std::string FirstSchemaError(const json& obj, const google::protobuf::Descriptor* desc,
                             const std::string& path) {
  if (!obj.is_object()) return "";
  std::map<const google::protobuf::FieldDescriptor*, std::string> seen;  // field -> its spelling
  for (const auto& [key, value] : obj.items()) {
    const google::protobuf::FieldDescriptor* f = desc->FindFieldByName(key);
    for (int i = 0; f == nullptr && i < desc->field_count(); ++i) {
      if (desc->field(i)->json_name() == key) f = desc->field(i);  // lowerCamelCase spelling
    }
    std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
    if (f == nullptr) {
      return absl::StrCat(child, ": unknown field in ", desc->name());
    }
    // Both spellings of one field (num_ranks and numRanks): protobuf's parser would keep one
    // silently, like a duplicate key, which is refused.
    if (auto [it, inserted] = seen.emplace(f, key); !inserted) {
      return absl::StrCat(child, ": duplicate of ",
                          path.empty() ? it->second : absl::StrCat(path, ".", it->second));
    }
    if (std::string quoted = QuotedScalarError(value, f, child); !quoted.empty()) return quoted;
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE &&
        f->message_type()->full_name() != "google.protobuf.Struct" && !f->is_repeated()) {
      std::string inner = FirstSchemaError(value, f->message_type(), child);
      if (!inner.empty()) return inner;
    }
  }
  return "";
}

}  // namespace

absl::Status ApplyDocumentConveniences(json& j, const SpecFiles& files) {
  if (!j.is_object()) return absl::OkStatus();  // the proto parser names the problem
  RETURN_IF_ERROR(InlineJsonFile(j, "deepspeed_config", "deepspeed_config", files));
  if (j.contains("model") && j["model"].is_object()) {
    RETURN_IF_ERROR(InlineJsonFile(j["model"], "config", "model.config", files));
  }
  // Accelerator kinds may be written short ("cpu", "h200") as in the worker's --accelerator flag.
  if (j.contains("resources") && j["resources"].is_object() &&
      j["resources"].contains("accelerator") && j["resources"]["accelerator"].is_string()) {
    const std::string written = j["resources"]["accelerator"].get<std::string>();
    std::string kind = absl::AsciiStrToUpper(written);
    if (kind.rfind("ACCELERATOR_KIND_", 0) != 0) kind = absl::StrCat("ACCELERATOR_KIND_", kind);
    loom::v1::AcceleratorKind parsed;
    if (!loom::v1::AcceleratorKind_Parse(kind, &parsed) ||
        parsed == loom::v1::ACCELERATOR_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("resources.accelerator: unknown kind '",
                                                     written.substr(0, 64),
                                                     "' (want cpu, h100, h200 or gh200)"));
    }
    j["resources"]["accelerator"] = kind;
  }
  return absl::OkStatus();
}

absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text,
                                                  const std::string& base_dir,
                                                  const std::string& file_name) {
  SpecFiles files;
  files.base_dir = base_dir;
  return JobSpecFromYaml(yaml_text, files, file_name);
}

absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text,
                                                  const SpecFiles& files,
                                                  const std::string& file_name) {
  if (size_t bad = FirstInvalidUtf8(yaml_text); bad != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": not UTF-8 text (invalid byte at ",
                                                   LineAndColumn(yaml_text, bad), ")"));
  }
  YAML::Node root;
  AliasCounter aliases;
  try {
    std::istringstream in(yaml_text);
    YAML::Parser parser(in);
    int documents = 0;
    while (parser.HandleNextDocument(aliases)) ++documents;
    if (documents > 1) {
      // kubectl would apply each; YAML::Load reads only the first, and the rest were dropped
      // without a word.
      return absl::InvalidArgumentError(absl::StrCat(
          file_name, ": a job spec file holds one YAML document, found ", documents,
          " (submit each spec from its own file)"));
    }
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": invalid YAML: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": a job spec must be a mapping"));
  }
  ExpansionBudget budget;
  auto converted = YamlToJson(root, "", budget);
  if (converted.status().code() == absl::StatusCode::kResourceExhausted) {
    std::string why = absl::StrCat("the document expands to more than ", kMaxYamlNodes,
                                   " nodes or ", kMaxYamlScalarBytes,
                                   " bytes of scalars (stopped at ",
                                   converted.status().message(), ")");
    if (aliases.aliases() > 0) {
      absl::StrAppend(&why, "; it has ", aliases.aliases(),
                      " aliases (*name), the first at line ", aliases.first().line + 1,
                      ": nested aliases multiply; write the values out");
    }
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", why));
  }
  if (!converted.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": ", converted.status().message()));
  }
  json j = std::move(*converted);
  auto with_file = [&](absl::Status s) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", s.message()));
  };
  if (absl::Status s = ApplyDocumentConveniences(j, files); !s.ok()) return with_file(s);
  std::string unknown = FirstSchemaError(j, loom::v1::JobSpec::descriptor(), "");
  if (!unknown.empty()) return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", unknown));

  loom::v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  std::string json_text;
  try {
    json_text = j.dump();
  } catch (const json::exception& e) {  // e.g. invalid UTF-8 inside an inlined JSON file
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", e.what()));
  }
  auto st = google::protobuf::util::JsonStringToMessage(json_text, &spec, opts);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", st.message().as_string()));
  }
  return spec;
}

absl::StatusOr<loom::v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxSpecFileBytes);
  if (!text.ok()) {
    // Whatever is wrong with the file (missing, a directory, too big), the argument is bad.
    return absl::InvalidArgumentError(absl::StrCat("job spec ", text.status().message()));
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  return JobSpecFromYaml(*text, dir, path);
}

}  // namespace loom::cli
