#include "services/scheduler/admin_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "services/scheduler/auth_service.h"
#include "services/scheduler/reactor_util.h"

namespace loom {

absl::Status AdminServiceImpl::Authorize(const grpc::CallbackServerContext& context,
                                         bool admin) const {
  absl::StatusOr<Caller> caller = CallerFromMetadata(context, auth_);
  if (!caller.ok()) return caller.status();
  if (admin && !caller->admin()) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant ", caller->tenant, ": node administration needs an admin token"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListNodes(grpc::CallbackServerContext* context,
                                                      const loom::v1::ListNodesRequest*,
                                                      loom::v1::ListNodesResponse* response) {
  if (absl::Status s = Authorize(*context, true); !s.ok()) return FinishUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::vector<loom::v1::NodeInfo>> nodes = scheduler_->ListNodes();
  if (nodes.ok()) {
    for (loom::v1::NodeInfo& n : *nodes) *response->add_nodes() = std::move(n);
  }
  reactor->Finish(ToGrpcStatus(nodes.status()));
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::CordonNode(grpc::CallbackServerContext* context,
                                                       const loom::v1::CordonNodeRequest* request,
                                                       loom::v1::NodeInfo* response) {
  if (absl::Status s = Authorize(*context, true); !s.ok()) return FinishUnary(context, s);
  return Answer(context, scheduler_->CordonNode(request->node_id(), request->reason()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::UncordonNode(
    grpc::CallbackServerContext* context, const loom::v1::UncordonNodeRequest* request,
    loom::v1::NodeInfo* response) {
  if (absl::Status s = Authorize(*context, true); !s.ok()) return FinishUnary(context, s);
  return Answer(context, scheduler_->UncordonNode(request->node_id()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::DrainNode(grpc::CallbackServerContext* context,
                                                      const loom::v1::DrainNodeRequest* request,
                                                      loom::v1::DrainNodeResponse* response) {
  if (absl::Status s = Authorize(*context, true); !s.ok()) return FinishUnary(context, s);
  return Answer(context, scheduler_->DrainNode(request->node_id(), request->reason()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListQueues(grpc::CallbackServerContext* context,
                                                       const loom::v1::ListQueuesRequest*,
                                                       loom::v1::ListQueuesResponse* response) {
  if (absl::Status s = Authorize(*context, false); !s.ok()) return FinishUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::vector<loom::v1::QueueInfo>> queues = scheduler_->ListQueues();
  if (queues.ok()) {
    for (loom::v1::QueueInfo& q : *queues) *response->add_queues() = std::move(q);
  }
  reactor->Finish(ToGrpcStatus(queues.status()));
  return reactor;
}

}  // namespace loom
