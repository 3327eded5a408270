// GET /v1/jobs/{id}:explain and GET /v1/jobs/{id}:watch (server-sent events) of JobGateway.
//
// :watch runs the gRPC WatchJob stream on a reader thread that queues each event as one SSE
// frame (https://html.spec.whatwg.org/multipage/server-sent-events.html: "event:", "id:",
// "data:" lines, a blank line); httplib's content provider, on the request's thread, writes
// the queued frames and, after `sse_keepalive` without one, a ": keep-alive" comment, so that a
// client that went away fails a write and ends the response. The provider's releaser cancels
// the call and joins the reader.
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"

namespace loom::gateway {
namespace {

// One SSE frame; `data` must not contain a newline (protobuf's JSON printer writes one line).
std::string Frame(const std::string& event, int64_t id, const std::string& data) {
  return absl::StrCat("event: ", event, "\nid: ", id, "\ndata: ", data, "\n\n");
}

// The events of one :watch response, from the reader thread to the provider.
class WatchStream {
 public:
  WatchStream(std::unique_ptr<grpc::ClientContext> ctx, loom::v1::JobService::StubInterface* stub,
              const loom::v1::WatchJobRequest& request)
      : ctx_(std::move(ctx)) {
    reader_ = std::thread([this, stub, request] { Read(stub, request); });
  }
  ~WatchStream() {
    ctx_->TryCancel();
    if (reader_.joinable()) reader_.join();
  }

  // Waits up to `keepalive` for frames; returns them (the last call after the stream ended
  // returns the remaining ones with *ended set), or "" on a timeout.
  std::string Next(absl::Duration keepalive, bool* ended) {
    absl::MutexLock lock(&mu_);
    auto ready = [this] { return !frames_.empty() || ended_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), keepalive);
    std::string out;
    while (!frames_.empty()) {
      out += frames_.front();
      frames_.pop_front();
    }
    *ended = ended_;
    return out;
  }

 private:
  void Read(loom::v1::JobService::StubInterface* stub, const loom::v1::WatchJobRequest& request) {
    std::unique_ptr<grpc::ClientReaderInterface<loom::v1::JobEvent>> reader =
        stub->WatchJob(ctx_.get(), request);
    loom::v1::JobEvent event;
    int64_t id = 0;
    while (reader->Read(&event)) {
      std::string frame = Frame(event.type().empty() ? "message" : event.type(), ++id,
                                internal::MessageJson(event));
      absl::MutexLock lock(&mu_);
      frames_.push_back(std::move(frame));
    }
    const grpc::Status s = reader->Finish();
    absl::MutexLock lock(&mu_);
    // A cancelled call is the client's going away (the releaser's TryCancel): nothing to say.
    if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
      const nlohmann::json body = {{"code", static_cast<int>(s.error_code())},
                                   {"status", internal::CodeName(s.error_code())},
                                   {"message", s.error_message()}};
      frames_.push_back(Frame("error", ++id, body.dump()));
    }
    ended_ = true;
  }

  std::unique_ptr<grpc::ClientContext> ctx_;
  absl::Mutex mu_;
  std::deque<std::string> frames_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace

void JobGateway::RegisterExplainAndWatch(httplib::Server& server) {
  server.Get(internal::kExplainRoute, [this](const httplib::Request& req, httplib::Response& res) {
    loom::v1::ExplainPendingRequest request;
    request.set_job_id(req.matches[1]);
    loom::v1::ExplainPendingResponse response;
    internal::Reply(res,
                    stub_->ExplainPending(internal::MakeContext(req, options_.rpc_timeout).get(),
                                          request, &response),
                    response);
  });
  server.Get(internal::kWatchRoute, [this](const httplib::Request& req, httplib::Response& res) {
    // The status code from a GetJob first (a missing job, another tenant's, no token), so that
    // errors are plain JSON answers and the event stream's headers go out at once.
    loom::v1::GetJobRequest get;
    get.set_job_id(req.matches[1]);
    loom::v1::Job job;
    const grpc::Status s =
        stub_->GetJob(internal::MakeContext(req, options_.rpc_timeout).get(), get, &job);
    if (!s.ok()) {
      internal::WriteError(res, s.error_code(), s.error_message());
      return;
    }
    std::unique_ptr<grpc::ClientContext> ctx = internal::MakeContext(req, options_.rpc_timeout);
    ctx->set_deadline(std::chrono::system_clock::time_point::max());
    loom::v1::WatchJobRequest request;
    request.set_job_id(job.id());
    auto stream = std::make_shared<WatchStream>(std::move(ctx), stub_, request);
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    const absl::Duration keepalive = options_.sse_keepalive;
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream, keepalive](size_t, httplib::DataSink& sink) {
          bool ended = false;
          std::string out = stream->Next(keepalive, &ended);
          if (out.empty() && !ended) out = ": keep-alive\n\n";
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;  // client gone
          if (ended) sink.done();
          return true;
        },
        [stream](bool /*success*/) mutable { stream.reset(); });
  });
}

}  // namespace loom::gateway
