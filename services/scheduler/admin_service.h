// File: services/scheduler/admin_service.h
//
// loom.v1.AdminService over the scheduling core (proto/admin_service.proto): node listing,
// cordon/uncordon/drain, queue listing. Callback API, unary methods. With an authenticator
// (--auth_tokens_file) every call needs a bearer token (UNAUTHENTICATED otherwise); node calls
// need an admin token (PERMISSION_DENIED otherwise); ListQueues is open to every tenant.
#ifndef LOOM_SERVICES_SCHEDULER_ADMIN_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_ADMIN_SERVICE_H_

#include "common/auth.h"
#include "proto/admin_service.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace loom {

// Thread-safe (the scheduler is). `scheduler` must outlive the service.
class AdminServiceImpl final : public loom::v1::AdminService::CallbackService {
 public:
  // `auth` null = authentication off (every caller is an admin).
  explicit AdminServiceImpl(Scheduler* scheduler, const TokenAuthenticator* auth = nullptr)
      : scheduler_(scheduler), auth_(auth) {}

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
  // OK for an authenticated caller (and an admin when `admin`).
  absl::Status Authorize(const grpc::CallbackServerContext& context, bool admin) const;

  Scheduler* const scheduler_;
  const TokenAuthenticator* const auth_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_ADMIN_SERVICE_H_
