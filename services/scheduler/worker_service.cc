#include "services/scheduler/worker_service.h"

#include "common/grpc_status.h"
#include "services/scheduler/reactor_util.h"

namespace loom {

grpc::ServerUnaryReactor* WorkerServiceImpl::RegisterWorker(
    grpc::CallbackServerContext* context, const loom::v1::RegisterWorkerRequest* request,
    loom::v1::RegisterWorkerResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<absl::Duration> interval =
      scheduler_->RegisterWorker(request->node_id(), request->inventory(), request->instance_id());
  if (interval.ok()) response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(*interval));
  reactor->Finish(ToGrpcStatus(interval.status()));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                       const loom::v1::HeartbeatRequest* request,
                                                       loom::v1::HeartbeatResponse* response) {
  return Answer(context, scheduler_->Heartbeat(*request), response);
}

}  // namespace loom
