// The checkpoint routes of JobGateway onto loom-checkpoint's CheckpointService
// (services/gateway/gateway.h lists them).
#include <httplib.h>

#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"

namespace loom::gateway {
namespace {

using internal::WriteError;

// The {step} path segment: a decimal integer >= 0; else answers 400 and returns false.
bool ParseStep(const std::string& text, int64_t* step, httplib::Response& res) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(text, step)) {
    WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat("step: '", internal::Printable(text, 32),
                            "' is not a checkpoint step (a decimal integer >= 0)"));
    return false;
  }
  return true;
}

// A body's job_id / step, when given, must equal the path's; else answers 400 and returns false.
bool SamePathFields(const std::string& path_job, const std::string& body_job, int64_t path_step,
                    int64_t body_step, httplib::Response& res) {
  if (!body_job.empty() && body_job != path_job) {
    WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat("job_id: the body says '", body_job, "' but the path '", path_job,
                            "' (leave it out of the body)"));
    return false;
  }
  if (body_step != 0 && body_step != path_step) {
    WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat("step: the body says ", body_step, " but the path ", path_step,
                            " (leave it out of the body)"));
    return false;
  }
  return true;
}

}  // namespace

void JobGateway::RegisterCheckpointRoutes(httplib::Server& server) {
  loom::v1::CheckpointService::StubInterface* const stub = options_.checkpoints;
  const absl::Duration timeout = options_.rpc_timeout;
  const size_t max_body = options_.max_body_bytes;
  // 501 when the gateway was started without a checkpoint service.
  auto configured = [stub](httplib::Response& res) {
    if (stub != nullptr) return true;
    WriteError(res, grpc::StatusCode::UNIMPLEMENTED,
               "this gateway has no checkpoint service (start it with --checkpoint=HOST:PORT)");
    return false;
  };

  server.Get(internal::kCheckpointsRoute, [=](const httplib::Request& req, httplib::Response& res) {
    if (!configured(res)) return;
    loom::v1::ListCheckpointsRequest request;
    request.set_job_id(req.matches[1]);
    loom::v1::ListCheckpointsResponse response;
    internal::Reply(res, stub->ListCheckpoints(internal::MakeContext(req, timeout).get(), request,
                                               &response),
                    response);
  });
  server.Get(internal::kCheckpointRoute, [=](const httplib::Request& req, httplib::Response& res) {
    if (!configured(res)) return;
    loom::v1::GetCheckpointRequest request;
    request.set_job_id(req.matches[1]);
    int64_t step = 0;
    if (!ParseStep(req.matches[2], &step, res)) return;
    request.set_step(step);
    loom::v1::CheckpointInfo response;
    internal::Reply(
        res, stub->GetCheckpoint(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
  server.Delete(internal::kCheckpointRoute, [=](const httplib::Request& req,
                                                httplib::Response& res) {
    if (!configured(res)) return;
    loom::v1::DeleteCheckpointRequest request;
    request.set_job_id(req.matches[1]);
    int64_t step = 0;
    if (!ParseStep(req.matches[2], &step, res)) return;
    request.set_step(step);
    for (const auto& [key, value] : req.params) {
      if (key != "protected_steps" && key != "protectedSteps") {
        WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("unknown query parameter '", key, "' (want protected_steps)"));
        return;
      }
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int64_t s = 0;
        if (!absl::SimpleAtoi(part, &s) || s < 0) {
          WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("protected_steps: '", part, "' is not a step"));
          return;
        }
        request.add_protected_steps(s);
      }
    }
    loom::v1::DeleteCheckpointResponse response;
    internal::Reply(
        res, stub->DeleteCheckpoint(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
  server.Post(internal::kConsolidateRoute, [=](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& reader) {
    // The body first, so that no answer leaves it unread on the connection (see
    // internal::DeclaresBody; httplib 0.11 discards what a content-reader handler left, but
    // nothing here relies on that).
    std::string body;
    if (!internal::ReadBody(req, res, reader, max_body, /*required=*/false, &body)) return;
    if (!configured(res)) return;
    int64_t step = 0;
    if (!ParseStep(req.matches[2], &step, res)) return;
    loom::v1::ConsolidateCheckpointRequest request;
    if (!internal::ParseBody(body, &request, res)) return;
    if (!SamePathFields(req.matches[1], request.job_id(), step, request.step(), res)) return;
    request.set_job_id(req.matches[1]);
    request.set_step(step);
    loom::v1::ConsolidateCheckpointResponse response;
    internal::Reply(res,
                    stub->ConsolidateCheckpoint(internal::MakeContext(req, timeout).get(), request,
                                                &response),
                    response);
  });
  server.Post(internal::kVerifyRoute, [=](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    std::string ignored;  // read first, as above
    if (!internal::ReadBody(req, res, reader, max_body, /*required=*/false, &ignored)) return;
    if (!configured(res)) return;
    int64_t step = 0;
    if (!ParseStep(req.matches[2], &step, res)) return;
    loom::v1::VerifyCheckpointRequest request;
    request.set_job_id(req.matches[1]);
    request.set_step(step);
    loom::v1::VerifyCheckpointResponse response;
    internal::Reply(
        res, stub->VerifyCheckpoint(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
  server.Post(internal::kRetentionRoute, [=](const httplib::Request& req, httplib::Response& res,
                                             const httplib::ContentReader& reader) {
    std::string body;  // read first, as above
    if (!internal::ReadBody(req, res, reader, max_body, /*required=*/true, &body)) return;
    if (!configured(res)) return;
    loom::v1::ApplyRetentionRequest request;
    if (!internal::ParseBody(body, &request, res)) return;
    if (!SamePathFields(req.matches[1], request.job_id(), 0, 0, res)) return;
    request.set_job_id(req.matches[1]);
    loom::v1::ApplyRetentionResponse response;
    internal::Reply(
        res, stub->ApplyRetention(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
}

}  // namespace loom::gateway
