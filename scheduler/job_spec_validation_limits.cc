#include "scheduler/job_spec_validation_limits.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/problems.h"
#include "common/status_macros.h"
#include "scheduler/field_path.h"
#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"

namespace loom {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;


// A short, escaped excerpt of a user's string for an error message.
std::string Excerpt(absl::string_view s) {
  constexpr size_t kMax = 40;
  std::string out = absl::CHexEscape(s.substr(0, kMax));
  if (s.size() > kMax) absl::StrAppend(&out, "...");
  return out;
}

// Offset of the first control character (C0, DEL, C1) in valid UTF-8 `s`, or npos.
size_t FirstControlCharacter(absl::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) return i;
    if (c == 0xC2 && i + 1 < s.size()) {
      const unsigned char n = static_cast<unsigned char>(s[i + 1]);
      if (n >= 0x80 && n <= 0x9F) return i;  // U+0080..U+009F (C1, e.g. CSI)
    }
  }
  return absl::string_view::npos;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty()) return absl::OkStatus();
  auto describe = [&](absl::string_view what) {
    return InvalidField("name", absl::StrCat(what, " (got \"", Excerpt(name), "\", ", name.size(),
                                        " bytes); a job name is at most ", kMaxJobNameBytes,
                                        " lowercase letters, digits and '-', starting and "
                                        "ending with a letter or digit"));
  };
  if (name.size() > kMaxJobNameBytes) {
    return describe(absl::StrCat("longer than ", kMaxJobNameBytes, " bytes"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') {
      return describe(absl::StrCat("byte ", i, " is not a lowercase letter, digit or '-'"));
    }
  }
  if (name.front() == '-' || name.back() == '-') {
    return describe("starts or ends with '-'");
  }
  return absl::OkStatus();
}

absl::Status CheckText(const std::string& path, const std::string& value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return InvalidField(path, absl::StrCat(value.size(), " bytes, more than the ", max_bytes,
                                      " allowed (starts with \"", Excerpt(value), "\")"));
  }
  if (size_t bad = FirstInvalidUtf8(value); bad != std::string::npos) {
    return InvalidField(path, absl::StrCat("not UTF-8 (byte ", bad, ")"));
  }
  if (size_t bad = FirstControlCharacter(value); bad != std::string::npos) {
    return InvalidField(path, absl::StrCat("control character at byte ", bad, " (\"", Excerpt(value),
                                      "\"); terminal escapes and line breaks are not allowed"));
  }
  return absl::OkStatus();
}

// Every string field outside the JSON configs (google.protobuf.Struct), recursively.
absl::Status CheckStrings(const Message& msg, const std::string& path) {
  const Reflection* refl = msg.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(msg, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string child = JoinFieldPath(path, f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      const size_t limit =
          (child == "model.init_from" || child == "dataset.path") ? kMaxSpecPathBytes
                                                                    : kMaxSpecTextBytes;
      if (f->is_repeated()) {
        for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
          RETURN_IF_ERROR(CheckText(absl::StrCat(child, "[", i, "]"),
                                    refl->GetRepeatedString(msg, f, i), limit));
        }
      } else {
        RETURN_IF_ERROR(CheckText(child, refl->GetString(msg, f), limit));
      }
      continue;
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->message_type() == google::protobuf::Struct::descriptor()) continue;
    if (f->is_repeated()) {
      // A map's entries are named by the map field (resources.node_selector.key).
      for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
        const Message& m = refl->GetRepeatedMessage(msg, f, i);
        RETURN_IF_ERROR(f->is_map() ? CheckStrings(m, child)
                                    : CheckStrings(m, absl::StrCat(child, "[", i, "]")));
      }
    } else {
      RETURN_IF_ERROR(CheckStrings(refl->GetMessage(msg, f), child));
    }
  }
  return absl::OkStatus();
}

// The first value of a JSON config (model.config, deepspeed_config; `path` names `v`) whose
// objects and arrays nest deeper than kMaxConfigDepth; `depth` is v's own level (a struct or
// list at level d holds values at level d + 1).
absl::Status CheckConfigDepth(const google::protobuf::Value& v, const std::string& path,
                              int depth) {
  const bool nested = v.kind_case() == google::protobuf::Value::kStructValue ||
                      v.kind_case() == google::protobuf::Value::kListValue;
  if (!nested) return absl::OkStatus();
  if (depth > kMaxConfigDepth) {
    return InvalidField(path, absl::StrCat("nested deeper than ", kMaxConfigDepth,
                                           " levels of objects and arrays (the limit of "
                                           "model.config and deepspeed_config)"));
  }
  if (v.kind_case() == google::protobuf::Value::kStructValue) {
    for (const auto& [key, child] : v.struct_value().fields()) {
      RETURN_IF_ERROR(CheckConfigDepth(child, JoinFieldPath(path, key), depth + 1));
    }
  } else {
    for (int i = 0; i < v.list_value().values_size(); ++i) {
      RETURN_IF_ERROR(
          CheckConfigDepth(v.list_value().values(i), absl::StrCat(path, "[", i, "]"), depth + 1));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckConfigDepth(const google::protobuf::Struct& config, const std::string& path) {
  for (const auto& [key, child] : config.fields()) {
    RETURN_IF_ERROR(CheckConfigDepth(child, JoinFieldPath(path, key), /*depth=*/2));
  }
  return absl::OkStatus();
}

// The top-level field of `spec` with the most serialized bytes, for the whole-spec error.
std::pair<std::string, size_t> LargestField(const loom::v1::JobSpec& spec) {
  const Reflection* refl = spec.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(spec, &fields);
  std::pair<std::string, size_t> best{"", 0};
  for (const FieldDescriptor* f : fields) {
    size_t bytes = 0;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      bytes = refl->GetMessage(spec, f).ByteSizeLong();
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !f->is_repeated()) {
      bytes = refl->GetString(spec, f).size();
    }
    if (bytes > best.second) best = {f->name(), bytes};
  }
  return best;
}

bool LooksNumeric(const std::string& s) {
  double d;
  return !s.empty() && absl::SimpleAtod(s, &d) && s.find_first_of("0123456789") != std::string::npos;
}

absl::Status StringForNumber(const std::string& path, const std::string& value) {
  return InvalidField(path, absl::StrCat("expected a number, got the string \"", Excerpt(value),
                                    "\" (write it without quotes)"));
}

// deepspeed_config: every key DeepSpeed knows that takes a string takes a word or a path
// ("AdamW", "cpu", "/nvme"), so a string that reads as a number is a quoted number.
absl::Status CheckNoQuotedNumbers(const google::protobuf::Value& v, const std::string& path) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kStringValue:
      if (LooksNumeric(v.string_value())) return StringForNumber(path, v.string_value());
      return absl::OkStatus();
    case google::protobuf::Value::kStructValue:
      for (const auto& [key, child] : v.struct_value().fields()) {
        RETURN_IF_ERROR(CheckNoQuotedNumbers(child, JoinFieldPath(path, key)));
      }
      return absl::OkStatus();
    case google::protobuf::Value::kListValue:
      for (int i = 0; i < v.list_value().values_size(); ++i) {
        RETURN_IF_ERROR(
            CheckNoQuotedNumbers(v.list_value().values(i), absl::StrCat(path, "[", i, "]")));
      }
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

// model.config keys the engine reads as numbers (spec/model_config.cc) and as booleans.
constexpr const char* kModelNumberKeys[] = {
    "vocab_size",          "hidden_size",      "intermediate_size",
    "num_hidden_layers",   "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "initializer_range",   "bos_token_id",     "eos_token_id",
    "head_dim"};
constexpr const char* kModelBoolKeys[] = {"tie_word_embeddings", "attention_bias", "mlp_bias"};

absl::Status CheckModelConfigTypes(const google::protobuf::Struct& config) {
  Problems problems;  // each key given as a string
  for (const char* key : kModelNumberKeys) {
    auto it = config.fields().find(key);
    if (it != config.fields().end() &&
        it->second.kind_case() == google::protobuf::Value::kStringValue) {
      problems.Merge(
          StringForNumber(absl::StrCat("model.config.", key), it->second.string_value()));
    }
  }
  for (const char* key : kModelBoolKeys) {
    auto it = config.fields().find(key);
    if (it != config.fields().end() &&
        it->second.kind_case() == google::protobuf::Value::kStringValue) {
      problems.Add(absl::StrCat("model.config.", key),
                   absl::StrCat("expected true or false, got the string \"",
                                Excerpt(it->second.string_value()), "\""));
    }
  }
  return problems.ToStatus();
}

}  // namespace

absl::Status CheckKnownEnumValues(const Message& msg, const std::string& path) {
  const Reflection* refl = msg.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(msg, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string child = JoinFieldPath(path, f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
      const int n = f->is_repeated() ? refl->FieldSize(msg, f) : 1;
      for (int i = 0; i < n; ++i) {
        const int value = f->is_repeated() ? refl->GetRepeatedEnumValue(msg, f, i)
                                           : refl->GetEnumValue(msg, f);
        if (f->enum_type()->FindValueByNumber(value) == nullptr) {
          return InvalidField(f->is_repeated() ? absl::StrCat(child, "[", i, "]") : child,
                              absl::StrCat(value, " is not a known ",
                                           f->enum_type()->full_name()));
        }
      }
      continue;
    }
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->message_type() == google::protobuf::Struct::descriptor()) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < refl->FieldSize(msg, f); ++i) {
        const Message& m = refl->GetRepeatedMessage(msg, f, i);
        RETURN_IF_ERROR(CheckKnownEnumValues(
            m, f->is_map() ? child : absl::StrCat(child, "[", i, "]")));
      }
    } else {
      RETURN_IF_ERROR(CheckKnownEnumValues(refl->GetMessage(msg, f), child));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpecLimits(const loom::v1::JobSpec& spec) {
  // Every problem in one answer (common/problems.h). Past a config nested too deeply or a spec
  // too large nothing more is read: the type checks below walk the configs.
  Problems problems;
  problems.Merge(CheckName(spec.name()));
  problems.Merge(CheckStrings(spec, ""));
  problems.Merge(CheckKnownEnumValues(spec, ""));
  bool readable = problems.Merge(CheckConfigDepth(spec.model().config(), "model.config"));
  readable = problems.Merge(CheckConfigDepth(spec.deepspeed_config(), "deepspeed_config")) &&
             readable;
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxJobSpecBytes) {
    const auto [field, field_bytes] = LargestField(spec);
    // Named unless it follows from a problem already named in its largest field (a 3 MB name).
    bool follows = false;
    for (const Problem& p : problems.problems()) {
      follows = follows || p.path == field || absl::StartsWith(p.path, absl::StrCat(field, "."));
    }
    if (!follows) {
      problems.Add("spec", absl::StrCat(bytes, " bytes serialized, more than the ",
                                        kMaxJobSpecBytes, " allowed (largest field: ", field,
                                        ", ", field_bytes, " bytes)"));
    }
    readable = false;
  }
  if (!readable) return problems.ToStatus();
  problems.Merge(CheckModelConfigTypes(spec.model().config()));
  for (const auto& [key, value] : spec.deepspeed_config().fields()) {
    problems.Merge(CheckNoQuotedNumbers(value, absl::StrCat("deepspeed_config.", key)));
  }
  return problems.ToStatus();
}

}  // namespace loom
