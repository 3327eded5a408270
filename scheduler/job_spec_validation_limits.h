// File: scheduler/job_spec_validation_limits.h
//
// Size, character and type limits of a JobSpec, checked at admission before anything else
// (ValidateJobSpec calls ValidateJobSpecLimits first). They keep every stored job small enough
// that a page of ListJobs stays well under gRPC's 4 MB message limit (docs/job-spec.md "Limits"),
// and keep terminal escapes and control characters out of what other users' tools print.
#ifndef LOOM_SCHEDULER_JOB_SPEC_VALIDATION_LIMITS_H_
#define LOOM_SCHEDULER_JOB_SPEC_VALIDATION_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/common.pb.h"

namespace loom {

// JobSpec.name: a Kubernetes object name (RFC 1123 label): at most 63 bytes of lowercase ASCII
// letters, digits and '-', starting and ending with a letter or digit. "" is allowed (unnamed).
inline constexpr size_t kMaxJobNameBytes = 63;
// model.init_from and dataset.path: PATH_MAX.
inline constexpr size_t kMaxSpecPathBytes = 4096;
// Every other string field of the spec outside the two JSON configs (dataset.name, queue,
// tokenizer, best_metric, ...).
inline constexpr size_t kMaxSpecTextBytes = 256;
// The whole spec, serialized (protobuf wire format; model.config and deepspeed_config included).
// A real config.json plus ds_config.json is 1-3 KiB.
inline constexpr size_t kMaxJobSpecBytes = 64 * 1024;

// model.config and deepspeed_config: how deeply objects and arrays may nest (the config object
// itself is level 1). Real configs nest 2-4 levels (HF config.json: rope_scaling,
// quantization_config; ds_config.json: zero_optimization.offload_optimizer, the deepest ones 4).
// Far deeper is a mistake or an attack, and harms others: protobuf's JSON printer refuses a
// message more than 64 levels deep ("Message too deep"), and every JSON level of a
// google.protobuf.Struct is 2 message levels (Struct, Value), under a ListJobsResponse's 4
// (response, job, spec, model): 16 keeps a whole ListJobs page 4 + 2 x 16 = 36 deep, well inside
// both that and the wire parser's limit of 100 (issue 42 defect 2: a 30-level model.config broke
// GET /v1/jobs for every tenant).
inline constexpr int kMaxConfigDepth = 16;

// FirstInvalidUtf8 (the UTF-8 check of every string here) is loom::FirstInvalidUtf8 in
// common/utf8.h.

// Checks, in this order, every problem in one answer (common/problems.h) except that nothing
// after the size and depth checks runs when one of those fails:
//   * name: the RFC 1123 label rule above ("name: ...");
//   * every string field of the spec outside model.config / deepspeed_config: at most
//     kMaxSpecPathBytes (paths) or kMaxSpecTextBytes (others) bytes, and no control characters
//     (U+0000-U+001F, U+007F-U+009F) ("<field path>: ...");
//   * every enum field (resources.accelerator, ...) a value its enum defines ("<field path>: 77
//     is not a known loom.v1.AcceleratorKind");
//   * model.config / deepspeed_config nested at most kMaxConfigDepth levels ("model.config.a.b...:
//     nested deeper than 16 levels");
//   * the serialized spec at most kMaxJobSpecBytes ("spec: ... (largest field: <field>)");
//   * model.config: a field the engine reads as a number (hidden_size, rope_theta, ...) or a
//     boolean (tie_word_embeddings) given as a string ("model.config.hidden_size: expected a
//     number, got the string \"64\""); deepspeed_config: any string value that reads as a number
//     ("deepspeed_config.<key path>: ...").
// Errors: INVALID_ARGUMENT whose message starts with the field path. Thread-safe; no I/O.
absl::Status ValidateJobSpecLimits(const loom::v1::JobSpec& spec);

// INVALID_ARGUMENT naming the first enum field of `msg` (recursively; google.protobuf.Struct
// excepted) whose value is not one its enum defines: proto3 keeps unknown numbers, so a
// request's `phase: 77` would otherwise be taken as a filter nothing matches. `path` prefixes
// the field names ("" for a top-level request). Thread-safe; no I/O.
absl::Status CheckKnownEnumValues(const google::protobuf::Message& msg, const std::string& path);

}  // namespace loom

#endif  // LOOM_SCHEDULER_JOB_SPEC_VALIDATION_LIMITS_H_
