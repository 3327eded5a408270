// The OpenAPI 3.0 schemas of a protobuf message and the messages it holds, as protobuf's JSON
// mapping (proto3) reads and writes them, generated from the compiled descriptors, so that the
// REST API's JobSpec is typed (issue 49: it was an untyped object) and cannot drift from
// proto/common.proto: services/gateway:openapi_schemas_test compares openapi.json with this, and
// `bazel run //services/gateway:openapi_schemas -- --write` rewrites openapi.json's copies.
//
// Mapping (https://protobuf.dev/programming-guides/json/): properties by lowerCamelCase JSON name
// (the parser also takes the proto names; unknown fields are refused by the gateway, which a
// schema here does not restate); int32 -> integer/int32; uint32 -> integer in [0, 2^32);
// int64/uint64 -> a decimal string as printed, or an integer as also accepted; float/double ->
// number; bool; string; bytes -> string/byte; enum -> its value names; repeated -> array; map ->
// object of values; google.protobuf.Struct -> any object, Value -> anything, Timestamp ->
// date-time string, Duration -> "1.5s"; any other message -> a $ref to its own schema, named by
// its message name.
//
// Thread-safety: pure functions.
#ifndef LOOM_SERVICES_GATEWAY_OPENAPI_SCHEMAS_H_
#define LOOM_SERVICES_GATEWAY_OPENAPI_SCHEMAS_H_

#include <google/protobuf/descriptor.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::gateway {

// Schema name -> schema, for `root` and every message type reachable from its fields (well-known
// types excepted). Each message schema is {"type": "object", "description": "<full name>
// (<proto file>)", "properties": {...}}.
std::map<std::string, nlohmann::json> MessageSchemas(const google::protobuf::Descriptor* root);

}  // namespace loom::gateway

#endif  // LOOM_SERVICES_GATEWAY_OPENAPI_SCHEMAS_H_
