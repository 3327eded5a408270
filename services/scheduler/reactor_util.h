// Finishing gRPC callback-API calls from absl results, shared by the scheduler's services.
#ifndef LOOM_SERVICES_SCHEDULER_REACTOR_UTIL_H_
#define LOOM_SERVICES_SCHEDULER_REACTOR_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_status.h"

namespace loom {

// Ends a unary call with `status` (ToGrpcStatus).
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                             const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Ends a unary call with `result`: the value moved into *response, or its error.
template <typename T, typename Out>
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, absl::StatusOr<T> result,
                                 Out* response) {
  if (result.ok()) *response = std::move(*result);
  return FinishUnary(context, result.status());
}

// A server-streaming reactor that ends the call with `status` at once, writing nothing; deletes
// itself when gRPC is done with it.
template <typename T>
class FinishedWriter final : public grpc::ServerWriteReactor<T> {
 public:
  explicit FinishedWriter(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_REACTOR_UTIL_H_
