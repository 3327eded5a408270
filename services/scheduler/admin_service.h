// File: services/scheduler/admin_service.h
//
// loom.v1.AdminService over the scheduling core (proto/admin_service.proto): node listing,
// cordon/uncordon/drain, queue listing. Callback API, unary methods. Authorization (who may
// call it) is the server's business (services/scheduler interceptors), not this adapter's.
#ifndef LOOM_SERVICES_SCHEDULER_ADMIN_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_ADMIN_SERVICE_H_

#include "proto/admin_service.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace loom {

// Thread-safe (the scheduler is). `scheduler` must outlive the service.
class AdminServiceImpl final : public loom::v1::AdminService::CallbackService {
 public:
  explicit AdminServiceImpl(Scheduler* scheduler) : scheduler_(scheduler) {}

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const loom::v1::ListNodesRequest* request,
                                      loom::v1::ListNodesResponse* response) override;
  grpc::ServerUnaryReactor* CordonNode(grpc::CallbackServerContext* context,
                                       const loom::v1::CordonNodeRequest* request,
                                       loom::v1::NodeInfo* response) override;
  grpc::ServerUnaryReactor* UncordonNode(grpc::CallbackServerContext* context,
                                         const loom::v1::UncordonNodeRequest* request,
                                         loom::v1::NodeInfo* response) override;
  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* context,
                                      const loom::v1::DrainNodeRequest* request,
                                      loom::v1::DrainNodeResponse* response) override;
  grpc::ServerUnaryReactor* ListQueues(grpc::CallbackServerContext* context,
                                       const loom::v1::ListQueuesRequest* request,
                                       loom::v1::ListQueuesResponse* response) override;

 private:
  Scheduler* const scheduler_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_ADMIN_SERVICE_H_
