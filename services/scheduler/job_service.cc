#include "services/scheduler/job_service.h"

#include <deque>
#include <memory>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "scheduler/job_state.h"

namespace loom {
namespace {

// WatchJob: writes the subscription's events one at a time; finishes after a terminal one.
class WatchJobReactor final : public grpc::ServerWriteReactor<loom::v1::JobEvent> {
 public:
  WatchJobReactor(Scheduler* scheduler, const std::string& job_id) : scheduler_(scheduler) {
    absl::StatusOr<std::shared_ptr<JobSubscription>> sub =
        scheduler_->WatchJob(job_id, [this] { Pump(); });
    if (!sub.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(ToGrpcStatus(sub.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      sub_ = *sub;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    grpc::Status status = grpc::Status::OK;  // after the terminal event
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok || cancelled_) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        finish = finished_ = true;
      } else if (wrote_terminal_) {
        finish = finished_ = true;
      }
    }
    if (finish) {
      Finish(status);
      return;
    }
    Pump();
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!writing_ && !finished_) finish = finished_ = true;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    std::shared_ptr<JobSubscription> sub;
    {
      absl::MutexLock lock(&mu_);
      sub = sub_;
    }
    if (sub != nullptr) scheduler_->Unwatch(sub);  // no wake callback runs after this
    delete this;
  }

 private:
  // Starts the next write if none is in flight and an event is queued. Called from the
  // dispatcher thread (wakes) and from OnWriteDone.
  void Pump() {
    {
      absl::MutexLock lock(&mu_);
      if (sub_ == nullptr || writing_ || finished_ || cancelled_) return;
      if (!sub_->Pop(&event_)) return;
      writing_ = true;
      wrote_terminal_ = IsTerminal(event_.job().phase());
    }
    StartWrite(&event_);
  }

  Scheduler* const scheduler_;
  absl::Mutex mu_;
  std::shared_ptr<JobSubscription> sub_ ABSL_GUARDED_BY(mu_);
  loom::v1::JobEvent event_;  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool wrote_terminal_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// StreamLogs: the retained lines (tail, rank filter), then with follow new ones until the job
// has ended.
class StreamLogsReactor final : public grpc::ServerWriteReactor<loom::v1::LogLine> {
 public:
  static constexpr size_t kBatch = 256;  // lines taken from the buffer at a time

  StreamLogsReactor(Scheduler* scheduler, const loom::v1::StreamLogsRequest& request)
      : scheduler_(scheduler),
        job_id_(request.job_id()),
        ranks_(request.ranks().begin(), request.ranks().end()),
        tail_lines_(request.tail_lines()),
        follow_(request.follow()) {
    absl::StatusOr<loom::v1::Job> job = scheduler_->GetJob(job_id_);
    grpc::Status error;
    if (!job.ok()) {
      error = ToGrpcStatus(job.status());
    } else if (tail_lines_ < 0) {
      error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "tail_lines: must be >= 0 (0 = all retained lines)");
    }
    if (!error.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(error);
      return;
    }
    if (follow_) {
      waker_ = std::make_shared<Waker>([this] { Pump(); });
      scheduler_->logs().Follow(job_id_, waker_);
      // Ended before we followed: MarkEnded will not come again.
      if (IsTerminal(job->phase())) {
        absl::MutexLock lock(&mu_);
        ended_before_follow_ = true;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok || cancelled_) finish = finished_ = true;
    }
    if (finish) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    Pump();
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!writing_ && !finished_) finish = finished_ = true;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    if (waker_ != nullptr) {
      scheduler_->logs().Unfollow(job_id_, waker_);
      waker_->Close();  // waits for a running wake; none afterwards
    }
    delete this;
  }

 private:
  void Pump() {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (!started_ || writing_ || finished_ || cancelled_) return;
      if (batch_.empty()) {
        // Ended is read before the lines, so that lines appended before the end are not missed.
        const bool ended = !follow_ || ended_before_follow_ || scheduler_->logs().Ended(job_id_);
        std::vector<loom::v1::LogLine> lines =
            scheduler_->logs().Read(job_id_, ranks_, first_read_ ? tail_lines_ : 0, kBatch,
                                    &cursor_);
        first_read_ = false;
        for (auto& l : lines) batch_.push_back(std::move(l));
        if (batch_.empty()) {
          if (!ended) return;  // wait for a wake
          finish = finished_ = true;
        }
      }
      if (!finish) {
        line_ = std::move(batch_.front());
        batch_.pop_front();
        writing_ = true;
      }
    }
    if (finish) {
      Finish(grpc::Status::OK);
    } else {
      StartWrite(&line_);
    }
  }

  Scheduler* const scheduler_;
  const std::string job_id_;
  const std::set<int32_t> ranks_;
  const int32_t tail_lines_;
  const bool follow_;
  std::shared_ptr<Waker> waker_;  // set in the constructor (follow only)
  absl::Mutex mu_;
  LogCursor cursor_ ABSL_GUARDED_BY(mu_);
  std::deque<loom::v1::LogLine> batch_ ABSL_GUARDED_BY(mu_);
  loom::v1::LogLine line_;  // the write in flight
  bool first_read_ ABSL_GUARDED_BY(mu_) = true;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_before_follow_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

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

namespace loom {

grpc::ServerUnaryReactor* JobServiceImpl::KillJob(grpc::CallbackServerContext* context,
                                                  const loom::v1::KillJobRequest* request,
                                                  loom::v1::Job* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<loom::v1::Job> job = scheduler_->KillJob(request->job_id());
  if (job.ok()) *response = std::move(*job);
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerWriteReactor<loom::v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* /*context*/, const loom::v1::WatchJobRequest* request) {
  return new WatchJobReactor(scheduler_, request->job_id());
}

grpc::ServerWriteReactor<loom::v1::LogLine>* JobServiceImpl::StreamLogs(
    grpc::CallbackServerContext* /*context*/, const loom::v1::StreamLogsRequest* request) {
  return new StreamLogsReactor(scheduler_, *request);
}

}  // namespace loom
