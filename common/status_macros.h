// Status propagation macros. Debian's Abseil (20220623) predates ABSL_RETURN_IF_ERROR and
// ABSL_ASSIGN_OR_RETURN, so Loom defines them once here, named so a later switch is mechanical.
#ifndef LOOM_COMMON_STATUS_MACROS_H_
#define LOOM_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status loom_status_ = (expr);             \
    if (!loom_status_.ok()) return loom_status_;      \
  } while (0)

#define LOOM_STATUS_CONCAT_INNER_(a, b) a##b
#define LOOM_STATUS_CONCAT_(a, b) LOOM_STATUS_CONCAT_INNER_(a, b)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error returns its
// status, else assigns the value to `lhs` (which may be a declaration such as `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // LOOM_COMMON_STATUS_MACROS_H_
