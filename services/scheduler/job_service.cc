#include "services/scheduler/job_service.h"

#include "common/grpc_status.h"

namespace loom {

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::SubmitJobRequest* request,
                                                    loom::v1::SubmitJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  bool deduplicated = false;
  absl::StatusOr<loom::v1::Job> job =
      scheduler_->SubmitJob(request->spec(), request->request_id(), &deduplicated);
  if (job.ok()) {
    *response->mutable_job() = std::move(*job);
    response->set_deduplicated(deduplicated);
  }
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const loom::v1::GetJobRequest* request,
                                                 loom::v1::Job* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<loom::v1::Job> job = scheduler_->GetJob(request->job_id());
  if (job.ok()) *response = std::move(*job);
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const loom::v1::ListJobsRequest* request,
                                                   loom::v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<loom::v1::ListJobsResponse> page = scheduler_->ListJobsPage(*request);
  if (page.ok()) *response = std::move(*page);
  reactor->Finish(ToGrpcStatus(page.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ExplainPending(
    grpc::CallbackServerContext* context, const loom::v1::ExplainPendingRequest* request,
    loom::v1::ExplainPendingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<loom::v1::ExplainPendingResponse> out =
      scheduler_->ExplainPending(request->job_id());
  if (out.ok()) *response = std::move(*out);
  reactor->Finish(ToGrpcStatus(out.status()));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::CancelJobRequest* request,
                                                    loom::v1::Job* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<loom::v1::Job> job = scheduler_->CancelJob(request->job_id());
  if (job.ok()) *response = std::move(*job);
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

}  // namespace loom
