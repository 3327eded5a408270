#include "services/scheduler/job_service.h"

#include <deque>
#include <memory>
#include <set>
#include <string>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "services/scheduler/reactor_util.h"
#include "scheduler/job_state.h"

namespace loom {
namespace {

// The state every server-streaming reactor here shares: one write in flight at a time, a finish
// that happens exactly once, and a client cancel that finishes at once when no write is in flight
// (otherwise OnWriteDone finishes).
template <typename Message>
class StreamReactor : public grpc::ServerWriteReactor<Message> {
 public:
  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!writing_ && !finished_) finish = finished_ = true;
    }
    if (finish) this->Finish(grpc::Status::CANCELLED);
  }

 protected:
  // Finishes before anything was written (a bad request).
  void FinishEarly(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    this->Finish(status);
  }

  // For OnWriteDone: the write ended. If the client went away, marks the stream finished and
  // returns true; the caller then calls FinishClientGone().
  bool WriteEndedClientGone(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = false;
    if (ok && !cancelled_) return false;
    finished_ = true;
    return true;
  }
  void FinishClientGone() {
    this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
  }

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// Finishes a unary call with `result` (moved into `response` when OK).
// WatchJob: writes the subscription's events one at a time; finishes after a terminal one.
class WatchJobReactor final : public StreamReactor<loom::v1::JobEvent> {
 public:
  WatchJobReactor(Scheduler* scheduler, const std::string& job_id, StreamSlot slot)
      : scheduler_(scheduler), slot_(std::move(slot)) {
    absl::StatusOr<std::shared_ptr<JobSubscription>> sub =
        scheduler_->WatchJob(job_id, [this] { Pump(); });
    if (!sub.ok()) {
      FinishEarly(ToGrpcStatus(sub.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      sub_ = *sub;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    bool gone = false;
    bool done = false;  // the terminal event was written
    {
      absl::MutexLock lock(&mu_);
      gone = WriteEndedClientGone(ok);
      if (!gone && wrote_terminal_) done = finished_ = true;
    }
    if (gone) {
      FinishClientGone();
    } else if (done) {
      Finish(grpc::Status::OK);
    } else {
      Pump();
    }
  }

  void OnDone() override {
    std::shared_ptr<JobSubscription> sub;
    {
      absl::MutexLock lock(&mu_);
      sub = sub_;
    }
    if (sub != nullptr) scheduler_->Unwatch(sub);  // no wake callback runs after this
    delete this;  // gives the stream slot back
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
      // (A replayed "History" event of an ended job is followed by its snapshot.)
      wrote_terminal_ = IsTerminal(event_.job().phase()) && event_.type() != "History";
    }
    StartWrite(&event_);
  }

  Scheduler* const scheduler_;
  StreamSlot slot_;  // this stream's place under the stream caps
  std::shared_ptr<JobSubscription> sub_ ABSL_GUARDED_BY(mu_);
  loom::v1::JobEvent event_;  // the write in flight
  bool wrote_terminal_ ABSL_GUARDED_BY(mu_) = false;
};

// StreamLogs: the retained lines (tail, rank filter), then with follow new ones until the job
// has ended.
class StreamLogsReactor final : public StreamReactor<loom::v1::LogLine> {
 public:
  static constexpr size_t kBatch = 256;  // lines taken from the buffer at a time

  StreamLogsReactor(Scheduler* scheduler, const loom::v1::StreamLogsRequest& request,
                    StreamSlot slot)
      : scheduler_(scheduler),
        slot_(std::move(slot)),
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
    } else {
      // A rank the job does not have would stream nothing, and a follower would wait in
      // silence until the job ends.
      const int32_t world = job->spec().resources().num_ranks();
      for (int32_t r : ranks_) {
        if (r < 0 || r >= world) {
          error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               absl::StrCat("ranks: rank ", r, " is not in [0, ", world,
                                            ") (the job's num_ranks is ", world, ")"));
          break;
        }
      }
    }
    if (!error.ok()) {
      FinishEarly(error);
      return;
    }
    if (follow_) {
      waker_ = std::make_shared<Waker>([this] { Pump(); });
      scheduler_->logs().Follow(job_id_, waker_);
      // Ended before we followed (looked up again now that we follow: a job ending between
      // the first lookup and Follow would otherwise never finish the stream): MarkEnded will
      // not come again.
      job = scheduler_->GetJob(job_id_);
      if (!job.ok() || IsTerminal(job->phase())) {
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
    bool gone = false;
    {
      absl::MutexLock lock(&mu_);
      gone = WriteEndedClientGone(ok);
    }
    if (gone) {
      FinishClientGone();
      return;
    }
    Pump();
  }

  void OnDone() override {
    if (waker_ != nullptr) {
      scheduler_->logs().Unfollow(job_id_, waker_);
      waker_->Close();  // waits for a running wake; none afterwards
    }
    delete this;  // gives the stream slot back
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
  StreamSlot slot_;  // this stream's place under the stream caps
  const std::string job_id_;
  const std::set<int32_t> ranks_;
  const int32_t tail_lines_;
  const bool follow_;
  std::shared_ptr<Waker> waker_;  // set in the constructor (follow only)
  LogCursor cursor_ ABSL_GUARDED_BY(mu_);
  std::deque<loom::v1::LogLine> batch_ ABSL_GUARDED_BY(mu_);
  loom::v1::LogLine line_;  // the write in flight
  bool first_read_ ABSL_GUARDED_BY(mu_) = true;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_before_follow_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

namespace {

// `message`'s wire bytes as the raw SubmitJob answers them.
grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

absl::StatusOr<loom::v1::SubmitJobRequest> ParseSubmitJobRequest(const grpc::ByteBuffer& bytes) {
  grpc::ByteBuffer copy = bytes;  // ProtoBufferReader takes a mutable buffer; slices are shared
  grpc::ProtoBufferReader reader(&copy);
  google::protobuf::io::CodedInputStream input(&reader);
  input.SetRecursionLimit(kSubmitRecursionLimit);
  loom::v1::SubmitJobRequest request;
  if (!request.MergeFromCodedStream(&input) || !input.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SubmitJobRequest: cannot be parsed (malformed, or nested deeper than ",
        kSubmitRecursionLimit, " messages; model.config and deepspeed_config may nest at most ",
        "16 levels)"));
  }
  return request;
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return SubmitJobAs(context, request, response, "default");
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJobAs(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response,
                                                      const std::string& tenant) {
  absl::StatusOr<loom::v1::SubmitJobRequest> parsed = ParseSubmitJobRequest(*request);
  if (!parsed.ok()) return FinishUnary(context, parsed.status());
  if (parsed->validate_only()) {  // a dry run: nothing is stored, answered at once
    absl::StatusOr<loom::v1::SubmitJobResponse> answer =
        scheduler_->DryRunSubmission(parsed->spec(), tenant, parsed->wait_for_capacity());
    if (answer.ok()) {
      *response = ToByteBuffer(*answer);
    }
    return FinishUnary(context, answer.status());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Kept until the answer: the scheduler may read the spec until it calls back.
  auto submit = std::make_shared<loom::v1::SubmitJobRequest>(*std::move(parsed));
  // Answered from the job repository's commit thread once the job's batch is durable: this
  // callback thread (gRPC has only a few) does not wait for the fsync, so every in-flight
  // submission can join the next group commit (docs/benchmarks.md "Submissions against Slurm").
  scheduler_->SubmitJobAsync(
      submit->spec(), submit->request_id(), tenant,
      [reactor, response, submit](absl::StatusOr<loom::v1::Job> job, bool deduplicated) {
        if (job.ok()) {
          loom::v1::SubmitJobResponse answer;
          *answer.mutable_job() = std::move(*job);
          answer.set_deduplicated(deduplicated);
          *response = ToByteBuffer(answer);
        }
        reactor->Finish(ToGrpcStatus(job.status()));
      },
      submit->wait_for_capacity());
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const loom::v1::GetJobRequest* request,
                                                 loom::v1::Job* response) {
  return Answer(context, scheduler_->GetJob(request->job_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const loom::v1::ListJobsRequest* request,
                                                   loom::v1::ListJobsResponse* response) {
  return Answer(context, scheduler_->ListJobsPage(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ExplainPending(
    grpc::CallbackServerContext* context, const loom::v1::ExplainPendingRequest* request,
    loom::v1::ExplainPendingResponse* response) {
  return Answer(context, scheduler_->ExplainPending(request->job_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobMetrics(
    grpc::CallbackServerContext* context, const loom::v1::GetJobMetricsRequest* request,
    loom::v1::GetJobMetricsResponse* response) {
  return Answer(context, scheduler_->GetJobMetrics(*request), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::CancelJobRequest* request,
                                                    loom::v1::Job* response) {
  return Answer(context, scheduler_->CancelJob(request->job_id()), response);
}

}  // namespace loom

namespace loom {

grpc::ServerUnaryReactor* JobServiceImpl::KillJob(grpc::CallbackServerContext* context,
                                                  const loom::v1::KillJobRequest* request,
                                                  loom::v1::Job* response) {
  return Answer(context, scheduler_->KillJob(request->job_id()), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ResumeJob(grpc::CallbackServerContext* context,
                                                    const loom::v1::ResumeJobRequest* request,
                                                    loom::v1::Job* response) {
  return Answer(context,
                scheduler_->ResumeJob(request->job_id(), request->wait_for_capacity()), response);
}

absl::StatusOr<StreamSlot> JobServiceImpl::AcquireStream(const std::string& tenant) {
  if (streams_ == nullptr) return StreamSlot();
  return streams_->Acquire(tenant);
}

grpc::ServerWriteReactor<loom::v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const loom::v1::WatchJobRequest* request) {
  return WatchJobAs(context, request, "default");
}

grpc::ServerWriteReactor<loom::v1::LogLine>* JobServiceImpl::StreamLogs(
    grpc::CallbackServerContext* context, const loom::v1::StreamLogsRequest* request) {
  return StreamLogsAs(context, request, "default");
}

grpc::ServerWriteReactor<loom::v1::JobEvent>* JobServiceImpl::WatchJobAs(
    grpc::CallbackServerContext* /*context*/, const loom::v1::WatchJobRequest* request,
    const std::string& tenant) {
  absl::StatusOr<StreamSlot> slot = AcquireStream(tenant);
  if (!slot.ok()) return new FinishedWriter<loom::v1::JobEvent>(slot.status());
  return new WatchJobReactor(scheduler_, request->job_id(), *std::move(slot));
}

grpc::ServerWriteReactor<loom::v1::LogLine>* JobServiceImpl::StreamLogsAs(
    grpc::CallbackServerContext* /*context*/, const loom::v1::StreamLogsRequest* request,
    const std::string& tenant) {
  absl::StatusOr<StreamSlot> slot = AcquireStream(tenant);
  if (!slot.ok()) return new FinishedWriter<loom::v1::LogLine>(slot.status());
  return new StreamLogsReactor(scheduler_, *request, *std::move(slot));
}

}  // namespace loom
