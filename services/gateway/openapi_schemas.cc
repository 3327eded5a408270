#include "services/gateway/openapi_schemas.h"

#include <vector>

namespace loom::gateway {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using json = nlohmann::json;

bool IsWellKnown(const Descriptor* d) { return d->file()->package() == "google.protobuf"; }

json Scalar(const FieldDescriptor* f, std::vector<const Descriptor*>* messages);

json WellKnown(const Descriptor* d) {
  const std::string& name = d->full_name();
  if (name == "google.protobuf.Struct") return {{"type", "object"}, {"additionalProperties", true}};
  if (name == "google.protobuf.Value") return json::object();
  if (name == "google.protobuf.ListValue") return {{"type", "array"}, {"items", json::object()}};
  if (name == "google.protobuf.Timestamp") return {{"type", "string"}, {"format", "date-time"}};
  if (name == "google.protobuf.Duration") {
    return {{"type", "string"}, {"pattern", "^-?[0-9]+(\\.[0-9]+)?s$"}};
  }
  if (name == "google.protobuf.Empty") return {{"type", "object"}};
  // Wrappers (DoubleValue, Int64Value, ...): the wrapped value.
  const FieldDescriptor* value = d->FindFieldByName("value");
  std::vector<const Descriptor*> none;
  return value != nullptr ? Scalar(value, &none) : json::object();
}

json Int64(bool is_unsigned) {
  return {{"oneOf",
           {{{"type", "string"}, {"pattern", is_unsigned ? "^[0-9]+$" : "^-?[0-9]+$"}},
            {{"type", "integer"}}}},
          {"description", is_unsigned ? "uint64: a decimal string (an integer is accepted too)"
                                      : "int64: a decimal string (an integer is accepted too)"}};
}

json Scalar(const FieldDescriptor* f, std::vector<const Descriptor*>* messages) {
  switch (f->type()) {
    case FieldDescriptor::TYPE_INT32:
    case FieldDescriptor::TYPE_SINT32:
    case FieldDescriptor::TYPE_SFIXED32:
      return {{"type", "integer"}, {"format", "int32"}};
    case FieldDescriptor::TYPE_UINT32:
    case FieldDescriptor::TYPE_FIXED32:
      return {{"type", "integer"}, {"minimum", 0}, {"maximum", 4294967295LL}};
    case FieldDescriptor::TYPE_INT64:
    case FieldDescriptor::TYPE_SINT64:
    case FieldDescriptor::TYPE_SFIXED64:
      return Int64(false);
    case FieldDescriptor::TYPE_UINT64:
    case FieldDescriptor::TYPE_FIXED64:
      return Int64(true);
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_DOUBLE:
      return {{"type", "number"}};
    case FieldDescriptor::TYPE_BOOL:
      return {{"type", "boolean"}};
    case FieldDescriptor::TYPE_STRING:
      return {{"type", "string"}};
    case FieldDescriptor::TYPE_BYTES:
      return {{"type", "string"}, {"format", "byte"}};
    case FieldDescriptor::TYPE_ENUM: {
      json names = json::array();
      for (int i = 0; i < f->enum_type()->value_count(); ++i) {
        names.push_back(f->enum_type()->value(i)->name());
      }
      return {{"type", "string"}, {"enum", names}};
    }
    case FieldDescriptor::TYPE_MESSAGE:
    case FieldDescriptor::TYPE_GROUP: {
      const Descriptor* m = f->message_type();
      if (IsWellKnown(m)) return WellKnown(m);
      messages->push_back(m);
      return {{"$ref", "#/components/schemas/" + m->name()}};
    }
  }
  return json::object();
}

json MessageSchema(const Descriptor* d, std::vector<const Descriptor*>* messages) {
  json properties = json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    json schema;
    if (f->is_map()) {
      schema = {{"type", "object"},
                {"additionalProperties", Scalar(f->message_type()->map_value(), messages)}};
    } else if (f->is_repeated()) {
      schema = {{"type", "array"}, {"items", Scalar(f, messages)}};
    } else {
      schema = Scalar(f, messages);
    }
    properties[f->json_name()] = std::move(schema);
  }
  return {{"type", "object"},
          {"description", d->full_name() + " (" + d->file()->name() + ")"},
          {"properties", std::move(properties)}};
}

}  // namespace

std::map<std::string, json> MessageSchemas(const Descriptor* root) {
  std::map<std::string, json> out;
  std::vector<const Descriptor*> todo = {root};
  while (!todo.empty()) {
    const Descriptor* d = todo.back();
    todo.pop_back();
    if (out.count(d->name()) != 0) continue;
    out[d->name()] = MessageSchema(d, &todo);
  }
  return out;
}

}  // namespace loom::gateway
