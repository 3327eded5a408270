// The one place where absl::Status and grpc::Status convert into each other. The numeric codes
// are identical by design (absl/status/status.h), so the conversion keeps code and message.
#ifndef LOOM_COMMON_GRPC_STATUS_H_
#define LOOM_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace loom {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_STATUS_H_
