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
#ifndef LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_

#include "proto/job_service.grpc.pb.h"
#include "scheduler/scheduler.h"

namespace loom {

// Thread-safe (the scheduler is). `scheduler` must outlive the service.
class JobServiceImpl final : public loom::v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(Scheduler* scheduler) : scheduler_(scheduler) {}

  // Submits as tenant "default" (no authentication); see SubmitJobAs.
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const loom::v1::SubmitJobRequest* request,
                                      loom::v1::SubmitJobResponse* response) override;
  // SubmitJob on behalf of `tenant` (the authenticated caller's, from AuthJobService).
  grpc::ServerUnaryReactor* SubmitJobAs(grpc::CallbackServerContext* context,
                                        const loom::v1::SubmitJobRequest* request,
                                        loom::v1::SubmitJobResponse* response,
                                        const std::string& tenant);
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
  grpc::ServerUnaryReactor* KillJob(grpc::CallbackServerContext* context,
                                    const loom::v1::KillJobRequest* request,
                                    loom::v1::Job* response) override;
  grpc::ServerWriteReactor<loom::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<loom::v1::LogLine>* StreamLogs(
      grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) override;

 private:
  Scheduler* const scheduler_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_JOB_SERVICE_H_
