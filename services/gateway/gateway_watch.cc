// GET /v1/jobs/{id}:explain and GET /v1/jobs/{id}:watch (server-sent events) of JobGateway.
//
// :watch runs the gRPC WatchJob stream on a reader thread (internal::StreamPump,
// gateway_stream.h) that queues each event as one SSE frame
// (https://html.spec.whatwg.org/multipage/server-sent-events.html: "event:", "id:", "data:"
// lines, a blank line); httplib's content provider, on the request's thread, writes the queued
// frames and, after `sse_keepalive` without one, a ": keep-alive" comment, so that a client that
// went away fails a write and ends the response. The provider's releaser cancels the call and
// joins the reader.
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"
#include "services/gateway/gateway_stream.h"

namespace loom::gateway {
namespace {

// One SSE frame; `data` must not contain a newline (protobuf's JSON printer writes one line).
std::string Frame(const std::string& event, int64_t id, const std::string& data) {
  return absl::StrCat("event: ", event, "\nid: ", id, "\ndata: ", data, "\n\n");
}

// The WatchJob call of one :watch response, run on the pump's thread: one SSE frame per event,
// and an "event: error" frame if the call fails after the headers went out.
void WatchFrames(loom::v1::JobService::StubInterface* stub,
                 const loom::v1::WatchJobRequest& request, grpc::ClientContext* ctx,
                 const internal::StreamPump::Emit& emit) {
  std::unique_ptr<grpc::ClientReaderInterface<loom::v1::JobEvent>> reader =
      stub->WatchJob(ctx, request);
  loom::v1::JobEvent event;
  int64_t id = 0;
  while (reader->Read(&event)) {
    if (!emit(Frame(event.type().empty() ? "message" : event.type(), ++id,
                    internal::MessageJson(event)))) {
      break;  // the response ended: the call is being cancelled
    }
  }
  const grpc::Status s = reader->Finish();
  // A cancelled call is the client's going away (the releaser's TryCancel): nothing to say.
  if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
    emit(Frame("error", ++id,
               internal::SafeDump(internal::ErrorJson(s.error_code(), s.error_message()))));
  }
}

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
    loom::v1::JobService::StubInterface* const stub = stub_;
    auto stream = std::make_shared<internal::StreamPump>(
        std::move(ctx),
        [stub, request](grpc::ClientContext* call, const internal::StreamPump::Emit& emit) {
          WatchFrames(stub, request, call, emit);
        });
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    const absl::Duration keepalive = options_.sse_keepalive;
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream, keepalive](size_t, httplib::DataSink& sink) {
          // httplib calls providers outside its exception handling: end the response instead.
          try {
            bool ended = false;
            std::string out = stream->Next(keepalive, &ended);
            if (out.empty() && !ended) out = ": keep-alive\n\n";
            if (!out.empty() && !sink.write(out.data(), out.size())) return false;  // client gone
            if (ended) sink.done();
            return true;
          } catch (...) {
            return false;
          }
        },
        [stream](bool /*success*/) mutable { stream.reset(); });
  });
}

}  // namespace loom::gateway
