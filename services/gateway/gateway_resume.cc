// POST /v1/jobs/{id}:resume of JobGateway onto loom-scheduler's JobService.ResumeJob (issue 49;
// services/gateway/gateway.h lists the routes).
#include <httplib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"

namespace loom::gateway {

void JobGateway::RegisterResume(httplib::Server& server) {
  const size_t max_body = options_.max_body_bytes;
  const absl::Duration timeout = options_.rpc_timeout;
  // An optional ResumeJobRequest body ({"waitForCapacity": true}); a job_id in it must be the
  // path's (400 otherwise). The body is read first, so that no answer leaves it unread.
  server.Post(internal::kResumeRoute, [this, max_body, timeout](
                                          const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    std::string body;
    if (!internal::ReadBody(req, res, reader, max_body, /*required=*/false, &body)) return;
    loom::v1::ResumeJobRequest request;
    if (!internal::ParseBody(body, &request, res)) return;
    if (!request.job_id().empty() && request.job_id() != req.matches[1]) {
      internal::WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                           absl::StrCat("job_id: the body says '", request.job_id(),
                                        "' but the path '", std::string(req.matches[1]),
                                        "' (leave it out of the body)"));
      return;
    }
    request.set_job_id(req.matches[1]);
    loom::v1::Job response;
    internal::Reply(
        res, stub_->ResumeJob(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
}

}  // namespace loom::gateway
