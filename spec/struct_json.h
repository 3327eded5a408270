// File: spec/struct_json.h
//
// A google.protobuf.Struct (a job spec's model.config and deepspeed_config) as the nlohmann::json
// value that json::parse(MessageToJsonString(struct)) gives, without printing and re-parsing the
// text. Submission validation did exactly that print-and-parse for both configs of every job,
// and it was a third of the scheduler's CPU per durable submission (docs/benchmarks.md, "Control
// plane at cluster scale"). Hand-written because neither library converts one in-memory value
// to the other; struct_json_test checks it against that print-and-parse on every kind of value.
//
// Numbers: a Struct holds every number as a double. Protobuf's JSON printer writes it with
// "%.15g" (or "%.17g" when that does not round-trip), which nlohmann reads as an integer when
// the text has no '.', exponent or "inf"/"nan": so an integral double of at most 17 significant
// digits printed without an exponent becomes an unsigned (>= 0) or signed (< 0) integer, and
// every other finite number stays a double of the same value. NaN and infinities have no JSON
// form: INVALID_ARGUMENT naming `path` (the printer's error, too). A Value with no kind set is
// left out (of its object or its list), as the printer leaves it out.
//
// Pure and thread-safe.
#ifndef LOOM_SPEC_STRUCT_JSON_H_
#define LOOM_SPEC_STRUCT_JSON_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"

namespace loom::spec {

absl::StatusOr<nlohmann::json> StructToJson(const google::protobuf::Struct& s,
                                            absl::string_view path);

}  // namespace loom::spec

#endif  // LOOM_SPEC_STRUCT_JSON_H_
