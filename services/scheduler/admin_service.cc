#include "services/scheduler/admin_service.h"

#include <utility>

#include "common/grpc_status.h"

namespace loom {
namespace {

template <typename T, typename Out>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, absl::StatusOr<T> result,
                                Out* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = std::move(*result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* AdminServiceImpl::ListNodes(grpc::CallbackServerContext* context,
                                                      const loom::v1::ListNodesRequest*,
                                                      loom::v1::ListNodesResponse* response) {
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
  return Reply(context, scheduler_->CordonNode(request->node_id(), request->reason()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::UncordonNode(
    grpc::CallbackServerContext* context, const loom::v1::UncordonNodeRequest* request,
    loom::v1::NodeInfo* response) {
  return Reply(context, scheduler_->UncordonNode(request->node_id()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::DrainNode(grpc::CallbackServerContext* context,
                                                      const loom::v1::DrainNodeRequest* request,
                                                      loom::v1::DrainNodeResponse* response) {
  return Reply(context, scheduler_->DrainNode(request->node_id(), request->reason()), response);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListQueues(grpc::CallbackServerContext* context,
                                                       const loom::v1::ListQueuesRequest*,
                                                       loom::v1::ListQueuesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::vector<loom::v1::QueueInfo>> queues = scheduler_->ListQueues();
  if (queues.ok()) {
    for (loom::v1::QueueInfo& q : *queues) *response->add_queues() = std::move(q);
  }
  reactor->Finish(ToGrpcStatus(queues.status()));
  return reactor;
}

}  // namespace loom
