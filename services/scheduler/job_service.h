// File: services/scheduler/job_service.h
//
// loom.v1.JobService over the scheduling core: each RPC calls one Scheduler method and converts
// its status with ToGrpcStatus. Callback API, unary methods finish on DefaultReactor().
//
// The two server-streaming RPCs are ServerWriteReactors, so a watcher holds no thread while it
// waits: the scheduler's WakeDispatcher thread wakes a reactor when its job changed or new log
// lines arrived, and the reactor writes one message at a time (the next write starts from
// OnWriteDone). A slow client only delays its own stream: job events coalesce in its bounded
// subscription queue, and log lines wait in the scheduler's bounded log buffer (a follower that
// falls behind by more than the buffer holds misses the dropped lines).
//   * WatchJob: "Snapshot" first, then "PhaseChanged" / "Progress"; the stream finishes OK after
//     the event of a terminal phase; NOT_FOUND for an unknown job; CANCELLED if the client
//     cancels.
//   * StreamLogs: the retained lines (tail_lines of them if > 0) filtered by ranks, then with
//     follow=true new lines until the job has ended (the stream then finishes OK); without
//     follow it finishes after the retained lines. NOT_FOUND for an unknown job.
//
// SubmitJob is a raw method: the service parses the request itself, with a recursion limit of
// kSubmitRecursionLimit messages instead of protobuf's 100, so that a spec whose model.config or
// deepspeed_config nests deeper than about 33 JSON levels (three messages per Struct level)
// reaches validation and is refused naming the field (INVALID_ARGUMENT, "model.config: nested
// deeper than 16 levels"); gRPC 1.51's callback server answers a request it cannot parse with
// UNIMPLEMENTED and no message. A request deeper still is INVALID_ARGUMENT saying so.
#ifndef LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job_service.grpc.pb.h"
#include "scheduler/scheduler.h"
#include "services/scheduler/stream_limits.h"

namespace loom {

// Nested messages a SubmitJobRequest may have (JobSpec, its Structs: three per JSON level).
inline constexpr int kSubmitRecursionLimit = 400;

// A SubmitJobRequest from its wire bytes, read with kSubmitRecursionLimit. INVALID_ARGUMENT
// "SubmitJobRequest: ..." if the bytes are not one (or nest deeper than the limit).
absl::StatusOr<loom::v1::SubmitJobRequest> ParseSubmitJobRequest(const grpc::ByteBuffer& bytes);

// The JobService base with SubmitJob taken raw (see the file comment).
using JobServiceBase =
    loom::v1::JobService::WithRawCallbackMethod_SubmitJob<loom::v1::JobService::CallbackService>;

// Thread-safe (the scheduler is). `scheduler` must outlive the service.
class JobServiceImpl final : public JobServiceBase {
 public:
  // `streams` (may be null: no caps) must outlive the service and its streams; every
  // WatchJob/StreamLogs stream holds one of its slots until gRPC is done with it.
  explicit JobServiceImpl(Scheduler* scheduler, StreamLimiter* streams = nullptr)
      : scheduler_(scheduler), streams_(streams) {}

  // Submits as tenant "default" (no authentication); see SubmitJobAs.
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  // SubmitJob on behalf of `tenant` (the authenticated caller's, from AuthJobService):
  // `request` and `response` are a SubmitJobRequest and a SubmitJobResponse on the wire.
  grpc::ServerUnaryReactor* SubmitJobAs(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response, const std::string& tenant);
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const loom::v1::GetJobRequest* request,
                                   loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const loom::v1::ListJobsRequest* request,
                                     loom::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* ExplainPending(grpc::CallbackServerContext* context,
                                           const loom::v1::ExplainPendingRequest* request,
                                           loom::v1::ExplainPendingResponse* response) override;
  grpc::ServerUnaryReactor* GetJobMetrics(grpc::CallbackServerContext* context,
                                          const loom::v1::GetJobMetricsRequest* request,
                                          loom::v1::GetJobMetricsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const loom::v1::CancelJobRequest* request,
                                      loom::v1::Job* response) override;
  grpc::ServerUnaryReactor* KillJob(grpc::CallbackServerContext* context,
                                    const loom::v1::KillJobRequest* request,
                                    loom::v1::Job* response) override;
  // ResumeJob (issue 49): Scheduler::ResumeJob's answer, errors as it documents them.
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* context,
                                      const loom::v1::ResumeJobRequest* request,
                                      loom::v1::Job* response) override;
  // As tenant "default"; see WatchJobAs / StreamLogsAs.
  grpc::ServerWriteReactor<loom::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<loom::v1::LogLine>* StreamLogs(
      grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) override;
  // The streams on behalf of `tenant` (AuthJobService's caller): RESOURCE_EXHAUSTED at once when
  // the tenant or the server is at its stream cap (stream_limits.h).
  grpc::ServerWriteReactor<loom::v1::JobEvent>* WatchJobAs(
      grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request,
      const std::string& tenant);
  grpc::ServerWriteReactor<loom::v1::LogLine>* StreamLogsAs(
      grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request,
      const std::string& tenant);

 private:
  // A slot for one more stream of `tenant` (an empty one without a limiter).
  absl::StatusOr<StreamSlot> AcquireStream(const std::string& tenant);

  Scheduler* const scheduler_;
  StreamLimiter* const streams_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_
