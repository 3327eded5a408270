// File: services/scheduler/auth_service.h
//
// Authentication and tenant isolation in front of the scheduler's gRPC services (decorators, so
// that JobServiceImpl/WorkerServiceImpl stay tenant-agnostic):
//
// AuthJobService wraps a JobService implementation. Every RPC first authenticates the caller
// from the `authorization: Bearer <token>` metadata (common/auth.h) -> UNAUTHENTICATED if missing
// or unknown. Then:
//   SubmitJob       the job is owned by the caller's tenant (Scheduler::SubmitJob(..., tenant))
//   ListJobs        a user sees its own tenant only (ListJobsRequest.tenant is overridden); an
//                   admin sees every tenant, or the one named in ListJobsRequest.tenant
//   Get/Cancel/Kill/Explain/Watch/StreamLogs
//                   a job of another tenant answers NOT_FOUND with the same message as a job that
//                   does not exist (existence is not revealed); admins reach every job
//   Watch/StreamLogs
//                   count against the caller's tenant's stream cap (stream_limits.h)
// Without an authenticator (no --auth_tokens_file) every caller is tenant "default" with admin
// rights, which is Loom's behaviour before authentication existed.
//
// AuthWorkerService wraps WorkerService: with a worker token set, every RPC must carry it
// (UNAUTHENTICATED otherwise); tenant tokens are not accepted there, nor the worker token on
// JobService.
//
// Thread-safe. The wrapped services, scheduler and authenticator must outlive the decorators.
#ifndef LOOM_SERVICES_SCHEDULER_AUTH_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_AUTH_SERVICE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/grpc_credentials.h"
#include "proto/job_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "scheduler/scheduler.h"
#include "services/scheduler/job_service.h"

namespace loom {


class AuthJobService final : public JobServiceBase {
 public:
  AuthJobService(JobServiceImpl* inner, Scheduler* scheduler,
                 const TokenAuthenticator* auth)
      : inner_(inner), scheduler_(scheduler), auth_(auth) {}

  // Raw, as JobServiceImpl's (services/scheduler/job_service.h).
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const loom::v1::GetJobRequest* request,
                                   loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const loom::v1::ListJobsRequest* request,
                                     loom::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const loom::v1::CancelJobRequest* request,
                                      loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* KillJob(grpc::CallbackServerContext* context,
                                    const loom::v1::KillJobRequest* request,
                                    loom::v1::Job* response) override;
  // ResumeJob (issue 49): authorized as CancelJob (another tenant's job is NOT_FOUND).
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* context,
                                      const loom::v1::ResumeJobRequest* request,
                                      loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* ExplainPending(grpc::CallbackServerContext* context,
                                           const loom::v1::ExplainPendingRequest* request,
                                           loom::v1::ExplainPendingResponse* response) override;
  grpc::ServerUnaryReactor* GetJobMetrics(grpc::CallbackServerContext* context,
                                          const loom::v1::GetJobMetricsRequest* request,
                                          loom::v1::GetJobMetricsResponse* response) override;
  grpc::ServerWriteReactor<loom::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<loom::v1::LogLine>* StreamLogs(
      grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) override;

 private:
  // OK if the caller may act on `job_id`; NOT_FOUND (as for a missing job) or UNAUTHENTICATED.
  // `caller_out` (may be null) gets the authenticated caller.
  absl::Status Authorize(const grpc::CallbackServerContext& context, const std::string& job_id,
                         Caller* caller_out = nullptr) const;

  JobServiceImpl* const inner_;
  Scheduler* const scheduler_;
  const TokenAuthenticator* const auth_;
};

class AuthWorkerService final : public loom::v1::WorkerService::CallbackService {
 public:
  // `worker_token` empty = no check.
  AuthWorkerService(loom::v1::WorkerService::CallbackService* inner, std::string worker_token)
      : inner_(inner) {
    if (!worker_token.empty()) worker_auth_ = TokenAuthenticator::ForToken(worker_token, Caller{});
  }

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const loom::v1::RegisterWorkerRequest* request,
                                           loom::v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const loom::v1::HeartbeatRequest* request,
                                      loom::v1::HeartbeatResponse* response) override;

 private:
  absl::Status Check(const grpc::CallbackServerContext& context) const;

  loom::v1::WorkerService::CallbackService* const inner_;
  std::optional<TokenAuthenticator> worker_auth_;  // unset: no check
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_AUTH_SERVICE_H_
