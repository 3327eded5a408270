// File: services/scheduler/job_service.h
//
// loom.v1.JobService over the scheduling core: each RPC calls one Scheduler method and converts
// its status with ToGrpcStatus. Callback API, unary methods finish on DefaultReactor().
#ifndef LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_

#include "proto/job_service.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace loom {

// Thread-safe (the scheduler is). `scheduler` must outlive the service.
class JobServiceImpl final : public loom::v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(Scheduler* scheduler) : scheduler_(scheduler) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const loom::v1::SubmitJobRequest* request,
                                      loom::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const loom::v1::GetJobRequest* request,
                                   loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const loom::v1::ListJobsRequest* request,
                                     loom::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* ExplainPending(grpc::CallbackServerContext* context,
                                           const loom::v1::ExplainPendingRequest* request,
                                           loom::v1::ExplainPendingResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const loom::v1::CancelJobRequest* request,
                                      loom::v1::Job* response) override;

 private:
  Scheduler* const scheduler_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_
