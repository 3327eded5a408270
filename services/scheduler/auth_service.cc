#include "services/scheduler/auth_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "services/scheduler/reactor_util.h"

namespace loom {

absl::Status AuthJobService::Authorize(const grpc::CallbackServerContext& context,
                                       const std::string& job_id, Caller* caller_out) const {
  absl::StatusOr<Caller> caller = CallerFromMetadata(context, auth_);
  if (!caller.ok()) return caller.status();
  if (caller_out != nullptr) *caller_out = *caller;
  if (caller->admin()) return absl::OkStatus();
  absl::StatusOr<std::string> owner = scheduler_->JobTenant(job_id);
  if (!owner.ok()) return absl::OkStatus();  // let the service answer its own error
  // Another tenant's job gets the scheduler's answer for an unknown id: existence is not revealed.
  if (*owner != caller->tenant) return Scheduler::JobNotFound(job_id);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AuthJobService::SubmitJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  absl::StatusOr<Caller> caller = CallerFromMetadata(*context, auth_);
  if (!caller.ok()) return FinishUnary(context, caller.status());
  return inner_->SubmitJobAs(context, request, response, caller->tenant);
}

grpc::ServerUnaryReactor* AuthJobService::ListJobs(grpc::CallbackServerContext* context,
                                                   const loom::v1::ListJobsRequest* request,
                                                   loom::v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = CallerFromMetadata(*context, auth_);
  if (!caller.ok()) return FinishUnary(context, caller.status());
  if (caller->admin()) return inner_->ListJobs(context, request, response);
  loom::v1::ListJobsRequest scoped = *request;
  scoped.set_tenant(caller->tenant);  // a user sees only its own tenant's jobs
  // JobServiceImpl::ListJobs answers before it returns, so `scoped` may live on this stack.
  return inner_->ListJobs(context, &scoped, response);
}

grpc::ServerUnaryReactor* AuthJobService::GetJob(grpc::CallbackServerContext* context,
                                                 const loom::v1::GetJobRequest* request,
                                                 loom::v1::Job* response) {
  absl::Status s = Authorize(*context, request->job_id());
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->GetJob(context, request, response);
}

grpc::ServerUnaryReactor* AuthJobService::CancelJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::CancelJobRequest* request,
                                                    loom::v1::Job* response) {
  absl::Status s = Authorize(*context, request->job_id());
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->CancelJob(context, request, response);
}

grpc::ServerUnaryReactor* AuthJobService::KillJob(grpc::CallbackServerContext* context,
                                                  const loom::v1::KillJobRequest* request,
                                                  loom::v1::Job* response) {
  absl::Status s = Authorize(*context, request->job_id());
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->KillJob(context, request, response);
}

grpc::ServerUnaryReactor* AuthJobService::ResumeJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::ResumeJobRequest* request,
                                                    loom::v1::Job* response) {
  absl::Status s = Authorize(*context, request->job_id());  // as CancelJob
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->ResumeJob(context, request, response);
}

grpc::ServerUnaryReactor* AuthJobService::ExplainPending(
    grpc::CallbackServerContext* context, const loom::v1::ExplainPendingRequest* request,
    loom::v1::ExplainPendingResponse* response) {
  absl::Status s = Authorize(*context, request->job_id());
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->ExplainPending(context, request, response);
}

grpc::ServerUnaryReactor* AuthJobService::GetJobMetrics(
    grpc::CallbackServerContext* context, const loom::v1::GetJobMetricsRequest* request,
    loom::v1::GetJobMetricsResponse* response) {
  absl::Status s = Authorize(*context, request->job_id());  // as GetJob
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->GetJobMetrics(context, request, response);
}

grpc::ServerWriteReactor<loom::v1::JobEvent>* AuthJobService::WatchJob(
    grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) {
  Caller caller;
  absl::Status s = Authorize(*context, request->job_id(), &caller);
  if (!s.ok()) return new FinishedWriter<loom::v1::JobEvent>(s);
  return inner_->WatchJobAs(context, request, caller.tenant);  // counted under its stream cap
}

grpc::ServerWriteReactor<loom::v1::LogLine>* AuthJobService::StreamLogs(
    grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) {
  Caller caller;
  absl::Status s = Authorize(*context, request->job_id(), &caller);
  if (!s.ok()) return new FinishedWriter<loom::v1::LogLine>(s);
  return inner_->StreamLogsAs(context, request, caller.tenant);  // counted under its stream cap
}

absl::Status AuthWorkerService::Check(const grpc::CallbackServerContext& context) const {
  if (!worker_auth_.has_value()) return absl::OkStatus();
  return CallerFromMetadata(context, &*worker_auth_).status();
}

grpc::ServerUnaryReactor* AuthWorkerService::RegisterWorker(
    grpc::CallbackServerContext* context, const loom::v1::RegisterWorkerRequest* request,
    loom::v1::RegisterWorkerResponse* response) {
  absl::Status s = Check(*context);
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->RegisterWorker(context, request, response);
}

grpc::ServerUnaryReactor* AuthWorkerService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const loom::v1::HeartbeatRequest* request,
                                                       loom::v1::HeartbeatResponse* response) {
  absl::Status s = Check(*context);
  if (!s.ok()) return FinishUnary(context, s);
  return inner_->Heartbeat(context, request, response);
}

}  // namespace loom
