// The queue and node routes of JobGateway onto loom-scheduler's AdminService
// (services/gateway/gateway.h lists them).
#include <httplib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_http.h"

namespace loom::gateway {
namespace {

// A node route's optional body {"reason": "..."} (node_id, if given, must equal the path's).
// On a bad body answers 400 and returns false.
template <typename Request>
bool ParseNodeBody(const httplib::Request& req, httplib::Response& res,
                   const httplib::ContentReader& reader, size_t max_body, Request* request) {
  std::string body;
  if (!internal::ReadBody(req, res, reader, max_body, /*required=*/false, &body)) return false;
  if (!internal::ParseBody(body, request, res)) return false;
  if (!request->node_id().empty() && request->node_id() != req.matches[1]) {
    internal::WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                         absl::StrCat("node_id: the body says '", request->node_id(),
                                      "' but the path '", std::string(req.matches[1]),
                                      "' (leave it out of the body)"));
    return false;
  }
  request->set_node_id(req.matches[1]);
  return true;
}

}  // namespace

void JobGateway::RegisterAdminRoutes(httplib::Server& server) {
  loom::v1::AdminService::StubInterface* const stub = options_.admin;
  const absl::Duration timeout = options_.rpc_timeout;
  const size_t max_body = options_.max_body_bytes;
  auto configured = [stub](httplib::Response& res) {
    if (stub != nullptr) return true;
    internal::WriteError(res, grpc::StatusCode::UNIMPLEMENTED,
                         "this gateway has no AdminService stub (queues and nodes)");
    return false;
  };

  server.Get(internal::kQueuesRoute, [=](const httplib::Request& req, httplib::Response& res) {
    if (!configured(res)) return;
    loom::v1::ListQueuesResponse response;
    internal::Reply(res, stub->ListQueues(internal::MakeContext(req, timeout).get(), {}, &response),
                    response);
  });
  server.Get(internal::kNodesRoute, [=](const httplib::Request& req, httplib::Response& res) {
    if (!configured(res)) return;
    loom::v1::ListNodesResponse response;
    internal::Reply(res, stub->ListNodes(internal::MakeContext(req, timeout).get(), {}, &response),
                    response);
  });
  server.Post(internal::kCordonRoute, [=](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    loom::v1::CordonNodeRequest request;
    // The body first, so that no answer leaves it unread (internal::DeclaresBody).
    if (!ParseNodeBody(req, res, reader, max_body, &request)) return;
    if (!configured(res)) return;
    loom::v1::NodeInfo response;
    internal::Reply(
        res, stub->CordonNode(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
  server.Post(internal::kUncordonRoute, [=](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
    loom::v1::UncordonNodeRequest request;
    // The body first, so that no answer leaves it unread (internal::DeclaresBody).
    if (!ParseNodeBody(req, res, reader, max_body, &request)) return;
    if (!configured(res)) return;
    loom::v1::NodeInfo response;
    internal::Reply(
        res, stub->UncordonNode(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
  server.Post(internal::kDrainRoute, [=](const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader& reader) {
    loom::v1::DrainNodeRequest request;
    // The body first, so that no answer leaves it unread (internal::DeclaresBody).
    if (!ParseNodeBody(req, res, reader, max_body, &request)) return;
    if (!configured(res)) return;
    loom::v1::DrainNodeResponse response;
    internal::Reply(
        res, stub->DrainNode(internal::MakeContext(req, timeout).get(), request, &response),
        response);
  });
}

}  // namespace loom::gateway
