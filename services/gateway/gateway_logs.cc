// GET /v1/jobs/{id}/logs of JobGateway (services/gateway/gateway.h): the retained lines as one
// JSON document, or with follow=true a chunked NDJSON stream until the job ends.
//
// A followed stream runs its StreamLogs call on a reader thread (internal::StreamPump,
// gateway_stream.h) and its content provider waits for lines at most `follow_probe` at a time,
// probing the connection in between (internal::FollowLogsProvider says why a probe and not a
// keep-alive line): a client that left a quiet job's stream frees its gateway thread within
// about `follow_probe`, instead of holding it until the job prints or ends.
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"
#include "services/gateway/gateway_stream.h"

namespace loom::gateway {
namespace {

using internal::WriteError;

// follow=true|false|1|0, rank=N (repeatable, or comma-separated), tail_lines=N (or tail=N). On a
// bad value answers 400 and returns false.
bool ParseLogsQuery(const httplib::Request& req, loom::v1::StreamLogsRequest* out,
                    httplib::Response& res) {
  for (const auto& [key, value] : req.params) {
    if (key == "follow") {
      if (value == "true" || value == "1") {
        out->set_follow(true);
      } else if (value == "false" || value == "0" || value.empty()) {
        out->set_follow(false);
      } else {
        WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("follow: want true or false, got '", value, "'"));
        return false;
      }
    } else if (key == "rank" || key == "ranks") {
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int32_t rank = 0;
        if (!absl::SimpleAtoi(part, &rank) || rank < 0) {
          WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat(key, ": '", part, "' is not a rank"));
          return false;
        }
        out->add_ranks(rank);
      }
    } else if (key == "tail_lines" || key == "tail" || key == "tailLines") {
      int32_t tail = 0;
      if (!absl::SimpleAtoi(value, &tail) || tail < 0) {
        WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat(key, ": want a count >= 0, got '", value, "'"));
        return false;
      }
      out->set_tail_lines(tail);
    } else {
      WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("unknown query parameter '", key,
                              "' (want follow, rank, tail_lines)"));
      return false;
    }
  }
  return true;
}

// The StreamLogs call of one followed response, run on the pump's thread: one LogLine per line,
// and a last {"error": {...}} line if the call fails after the headers went out.
void FollowLines(loom::v1::JobService::StubInterface* stub,
                 const loom::v1::StreamLogsRequest& request, grpc::ClientContext* ctx,
                 const internal::StreamPump::Emit& emit) {
  std::unique_ptr<grpc::ClientReaderInterface<loom::v1::LogLine>> reader =
      stub->StreamLogs(ctx, request);
  loom::v1::LogLine line;
  while (reader->Read(&line)) {
    if (!emit(internal::MessageJson(line) + "\n")) break;  // the response ended: cancelled
  }
  const grpc::Status s = reader->Finish();
  // A cancelled call is the client's going away (the releaser's TryCancel): nothing to say.
  if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
    const nlohmann::json err = {{"error", internal::ErrorJson(s.error_code(), s.error_message())}};
    emit(internal::SafeDump(err) + "\n");
  }
}

}  // namespace

void JobGateway::RegisterLogs(httplib::Server& server) {
  server.Get(internal::kLogsRoute, [this](const httplib::Request& req, httplib::Response& res) {
    loom::v1::StreamLogsRequest request;
    request.set_job_id(req.matches[1]);
    if (!ParseLogsQuery(req, &request, res)) return;
    if (!request.follow()) {
      // The retained lines at once, as {"lines": [LogLine, ...]}, under the deadline.
      auto ctx = internal::MakeContext(req, options_.rpc_timeout);
      auto reader = stub_->StreamLogs(ctx.get(), request);
      // Each line is protobuf's JSON already: joined, not parsed and dumped again.
      std::vector<std::string> lines;
      loom::v1::LogLine line;
      while (reader->Read(&line)) lines.push_back(internal::MessageJson(line));
      grpc::Status s = reader->Finish();
      if (!s.ok()) {
        WriteError(res, s.error_code(), s.error_message());
        return;
      }
      res.status = 200;
      res.set_content(absl::StrCat("{\"lines\":[", absl::StrJoin(lines, ","), "]}"),
                      internal::kJson);
      return;
    }
    // follow: chunked NDJSON, one LogLine per line, until the job ends. The status code comes
    // from a GetJob first (missing job, another tenant's, no token), so that the headers go out
    // at once instead of after the first line; then no deadline.
    {
      loom::v1::GetJobRequest get;
      get.set_job_id(request.job_id());
      loom::v1::Job job;
      grpc::Status s =
          stub_->GetJob(internal::MakeContext(req, options_.rpc_timeout).get(), get, &job);
      if (!s.ok()) {
        WriteError(res, s.error_code(), s.error_message());
        return;
      }
    }
    std::unique_ptr<grpc::ClientContext> ctx = internal::MakeContext(req, options_.rpc_timeout);
    ctx->set_deadline(std::chrono::system_clock::time_point::max());
    loom::v1::JobService::StubInterface* const stub = stub_;
    auto pump = std::make_shared<internal::StreamPump>(
        std::move(ctx),
        [stub, request](grpc::ClientContext* call, const internal::StreamPump::Emit& emit) {
          FollowLines(stub, request, call, emit);
        });
    res.status = 200;
    // The releaser runs when the response ends (the job ended, the client left, a write
    // failed): destroying the pump cancels the call and joins its thread.
    res.set_chunked_content_provider("application/x-ndjson",
                                     internal::FollowLogsProvider(pump, options_.follow_probe),
                                     [pump](bool /*success*/) mutable { pump.reset(); });
  });
}

}  // namespace loom::gateway
