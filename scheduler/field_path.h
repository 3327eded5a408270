// Field paths in admission errors ("deepspeed_config.zero_optimization.stage: ..."): shared by
// the spec validators (job_spec_validation*.cc) so that every error names its field the same way.
// Header only; thread-safe.
#ifndef LOOM_SCHEDULER_FIELD_PATH_H_
#define LOOM_SCHEDULER_FIELD_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loom {

// INVALID_ARGUMENT "<path>: <what>".
inline absl::Status InvalidField(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// "prefix.field", or "field" at the top level.
inline std::string JoinFieldPath(const std::string& prefix, absl::string_view field) {
  return prefix.empty() ? std::string(field) : absl::StrCat(prefix, ".", field);
}

}  // namespace loom

#endif  // LOOM_SCHEDULER_FIELD_PATH_H_
