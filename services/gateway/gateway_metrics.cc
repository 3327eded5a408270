// GET /v1/jobs/{id}/metrics of JobGateway: the job's metric history (JobService.GetJobMetrics),
// one page, with pageSize and pageToken as query parameters.
#include <httplib.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"

namespace loom::gateway {

void JobGateway::RegisterMetrics(httplib::Server& server) {
  server.Get(internal::kMetricsRoute, [this](const httplib::Request& req, httplib::Response& res) {
    loom::v1::GetJobMetricsRequest request;
    request.set_job_id(req.matches[1]);
    for (const auto& [key, value] : req.params) {
      if (key == "pageSize" || key == "page_size") {
        int32_t size = 0;
        if (!absl::SimpleAtoi(value, &size)) {
          internal::WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                               absl::StrCat(key, ": want a count, got '", value, "'"));
          return;
        }
        request.set_page_size(size);
      } else if (key == "pageToken" || key == "page_token") {
        request.set_page_token(value);
      } else {
        internal::WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("unknown query parameter '", key,
                                          "' (want pageSize, pageToken)"));
        return;
      }
    }
    loom::v1::GetJobMetricsResponse response;
    internal::Reply(res,
                    stub_->GetJobMetrics(internal::MakeContext(req, options_.rpc_timeout).get(),
                                         request, &response),
                    response);
  });
}

}  // namespace loom::gateway
