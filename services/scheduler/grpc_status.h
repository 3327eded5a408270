// File: services/scheduler/grpc_status.h
//
// The one translation point from absl::Status (the core's error model) to grpc::Status on the
// RPC boundary. absl::StatusCode and grpc::StatusCode share the canonical numbering, so the code
// maps 1:1 and the message is kept verbatim (it names the offending field).
#ifndef LOOM_SERVICES_SCHEDULER_GRPC_STATUS_H_
#define LOOM_SERVICES_SCHEDULER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace loom {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_GRPC_STATUS_H_
