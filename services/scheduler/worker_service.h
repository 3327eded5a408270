// File: services/scheduler/worker_service.h
//
// loom.v1.WorkerService over the scheduling core: worker registration and heartbeats (whose
// replies carry rank assignments and stops). Callback API, unary methods.
#ifndef LOOM_SERVICES_SCHEDULER_WORKER_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_WORKER_SERVICE_H_

#include "proto/worker_service.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace loom {

// Thread-safe (the scheduler is). `scheduler` must outlive the service.
class WorkerServiceImpl final : public loom::v1::WorkerService::CallbackService {
 public:
  explicit WorkerServiceImpl(Scheduler* scheduler) : scheduler_(scheduler) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const loom::v1::RegisterWorkerRequest* request,
                                           loom::v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const loom::v1::HeartbeatRequest* request,
                                      loom::v1::HeartbeatResponse* response) override;

 private:
  Scheduler* const scheduler_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_WORKER_SERVICE_H_
