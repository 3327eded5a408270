// Names of loom.v1.AcceleratorKind as users write them: flags, YAML, metric labels, CLI output.
#ifndef LOOM_COMMON_ACCELERATOR_KIND_H_
#define LOOM_COMMON_ACCELERATOR_KIND_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace loom {

// "cpu", "h100", "h200", "gh200": the lower-case enum name without "ACCELERATOR_KIND_". A value
// this build does not know (from a newer peer) is its number, e.g. "7".
std::string AcceleratorKindName(loom::v1::AcceleratorKind kind);
// Inverse of AcceleratorKindName (case-insensitive) for the known kinds; INVALID_ARGUMENT
// naming `name` and the choices for anything else (including "unspecified").
absl::StatusOr<loom::v1::AcceleratorKind> ParseAcceleratorKind(const std::string& name);

}  // namespace loom

#endif  // LOOM_COMMON_ACCELERATOR_KIND_H_
