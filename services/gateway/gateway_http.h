// Shared pieces of loom-gateway's route handlers (services/gateway/gateway.h): the error body,
// protobuf's JSON mapping both ways, bounded body reading, the RPC context carrying the caller's
// Authorization header, and the table of route templates (for 405 `Allow` and the metrics'
// `route` label). Internal to services/gateway; thread-safe (no state).
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_HTTP_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_HTTP_H_

#include <google/protobuf/message.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>
#include <httplib.h>

#include <array>
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/gateway/gateway_server.h"

namespace loom::gateway::internal {

inline constexpr char kJson[] = "application/json";

// Canonical upper-case name of a gRPC code ("NOT_FOUND").
std::string CodeName(grpc::StatusCode code);

// UTF-8 checks of request bytes use loom::FirstInvalidUtf8 / DecodeUtf8 (common/utf8.h).
// `text` made safe to quote in a message: its UTF-8 kept, each byte that is not UTF-8 written as
// \xFF, and cut after `max_bytes` of input with "...". Request bytes (a path, a header, a query
// parameter) go through this before they are quoted in an error, so that the error is readable
// and JSON can carry it.
std::string Printable(absl::string_view text, size_t max_bytes = 200);
// {"code": <gRPC code number>, "status": "NOT_FOUND", "message": ...}: every error the gateway
// writes, as a body, an NDJSON {"error": ...} line or an SSE error frame.
nlohmann::json ErrorJson(grpc::StatusCode code, const std::string& message);
// j.dump() that never throws on text that is not UTF-8 (nlohmann's default does, type_error
// 316): such bytes become U+FFFD. Every dump of text that may hold request bytes uses this.
std::string SafeDump(const nlohmann::json& j);

// {"code": <gRPC code number>, "status": "NOT_FOUND", "message": ...} with an explicit HTTP
// status (for errors of HTTP itself: 405, 411, 413, ...). Never throws on a message that is not
// UTF-8 (SafeDump).
void WriteHttpError(httplib::Response& res, int http_status, grpc::StatusCode code,
                    const std::string& message);
// The same error, after which httplib closes the connection: for a request whose framing cannot
// be trusted (RFC 9112 section 6.3), whose unread bytes must not be parsed as a next request.
// httplib 0.11 keeps a connection open whatever the response's `Connection` header says; it
// closes it when a content provider fails, so the body goes out through a provider that writes
// it whole and then reports failure.
void WriteHttpErrorAndClose(httplib::Response& res, int http_status, grpc::StatusCode code,
                            const std::string& message);
// Whether the request carries a body (Content-Length > 0, or chunked). A request the pre-routing
// handler answers has not had its body read, and httplib 0.11 then parses that body as the
// connection's next request: such answers go out with WriteHttpErrorAndClose (schemathesis found
// a plain GET /v1/nodes answered "400 malformed HTTP request" after a POST with a body refused
// with 403 on the same connection). Handlers with a content reader read the body (ReadBody)
// before anything else, so that they never depend on what httplib does with an unread one.
bool DeclaresBody(const httplib::Request& req);
// The gRPC code of GatewayServer's answer to a broken limit: DEADLINE_EXCEEDED for a deadline
// (408), INVALID_ARGUMENT for a size (431, 414).
grpc::StatusCode LimitCode(const HeaderLimitError& limit);
// True once WriteHttpError / WriteHttpErrorAndClose or a handler wrote a response body, so that
// the error handler leaves it alone.
bool HasBody(const httplib::Response& res);
// The same body with the HTTP status of HttpStatusFromGrpc(code).
void WriteError(httplib::Response& res, grpc::StatusCode code, const std::string& message);

// One message in protobuf's canonical JSON mapping (one line; default-valued fields printed).
std::string MessageJson(const google::protobuf::Message& m);
// 200 with MessageJson(m) (500 INTERNAL if it cannot be encoded).
void WriteMessage(httplib::Response& res, const google::protobuf::Message& m);
// `resp` if `s` is OK, else the error of `s`; when its status details hold a google.rpc.BadRequest
// (a refused submission's problems, common/problems.h), the body also has "details": [{"field":
// <path>, "description": <what>}, ...], one per problem.
void Reply(httplib::Response& res, const grpc::Status& s, const google::protobuf::Message& resp);

// Parses `json` ("" = {}) into `m`; unknown fields are an error. On failure answers 400
// INVALID_ARGUMENT naming the message type and returns false; a body that is not UTF-8 (JSON
// text must be, RFC 8259 section 8.1) is refused first, naming the offset of the bad byte,
// because protobuf's parse error would quote the bytes back. `what` names the source in the
// messages ("request body", or "query string" for a message built from the query parameters).
bool ParseBody(const std::string& json, google::protobuf::Message* m, httplib::Response& res,
               absl::string_view what = "request body");

// Reads a request body through `reader` into *body, at most `max` bytes. A request with neither
// Content-Length nor chunked encoding has no body (curl -XPOST without -d sends none): fine
// unless `required` (411). On failure answers (411, 413 or 400) and returns false; a 413 or 400
// after part of the body was read also closes the connection (the rest is unread). Handlers
// call it before anything that may answer early.
bool ReadBody(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& reader, size_t max, bool required, std::string* body);
std::string TooLarge(int64_t declared, size_t max);

// A client context with a deadline of `timeout` from now and the request's Authorization header
// as the `authorization` metadata (a value gRPC metadata cannot carry is dropped, so the call
// goes unauthenticated instead of aborting the process).
std::unique_ptr<grpc::ClientContext> MakeContext(const httplib::Request& req,
                                                 absl::Duration timeout);

// The routes' path patterns (httplib regexes; req.matches[1] is the job or node id, [2] the step).
#define LOOM_GW_ID "([A-Za-z0-9_.-]+)"
inline constexpr char kJobsRoute[] = "/v1/jobs";
inline constexpr char kJobRoute[] = "/v1/jobs/" LOOM_GW_ID;
inline constexpr char kCancelRoute[] = "/v1/jobs/" LOOM_GW_ID ":cancel";
inline constexpr char kKillRoute[] = "/v1/jobs/" LOOM_GW_ID ":kill";
inline constexpr char kResumeRoute[] = "/v1/jobs/" LOOM_GW_ID ":resume";
inline constexpr char kLogsRoute[] = "/v1/jobs/" LOOM_GW_ID "/logs";
inline constexpr char kMetricsRoute[] = "/v1/jobs/" LOOM_GW_ID "/metrics";
inline constexpr char kExplainRoute[] = "/v1/jobs/" LOOM_GW_ID ":explain";
inline constexpr char kWatchRoute[] = "/v1/jobs/" LOOM_GW_ID ":watch";
inline constexpr char kCheckpointsRoute[] = "/v1/jobs/" LOOM_GW_ID "/checkpoints";
inline constexpr char kRetentionRoute[] = "/v1/jobs/" LOOM_GW_ID "/checkpoints:applyRetention";
inline constexpr char kCheckpointRoute[] = "/v1/jobs/" LOOM_GW_ID "/checkpoints/([^/:]+)";
inline constexpr char kConsolidateRoute[] =
    "/v1/jobs/" LOOM_GW_ID "/checkpoints/([^/:]+):consolidate";
inline constexpr char kVerifyRoute[] = "/v1/jobs/" LOOM_GW_ID "/checkpoints/([^/:]+):verify";
inline constexpr char kQueuesRoute[] = "/v1/queues";
inline constexpr char kNodesRoute[] = "/v1/nodes";
inline constexpr char kCordonRoute[] = "/v1/nodes/" LOOM_GW_ID ":cordon";
inline constexpr char kUncordonRoute[] = "/v1/nodes/" LOOM_GW_ID ":uncordon";
inline constexpr char kDrainRoute[] = "/v1/nodes/" LOOM_GW_ID ":drain";
#undef LOOM_GW_ID

// Who may call a route when the gateway checks tokens itself (GatewayOptions::auth).
enum class Access {
  kOpen,   // no token needed (/healthz, /v1/openapi.json)
  kUser,   // any known token (the scheduler scopes it to its tenant)
  kAdmin,  // an admin token (403 for a user token), as the gRPC service behind it demands
};

// A route as registered: its template ("/v1/jobs/{id}"), the methods it takes and its access.
struct RouteInfo {
  const char* route;
  const char* methods;
  Access access;
};

// The route serving `path`, or null for a path no route serves.
const RouteInfo* FindRoute(const std::string& path);
// Every route, in matching order (`methods` as "GET, POST").
std::vector<RouteInfo> AllRoutes();

// The (route, method, code) series of loom_gateway_requests_total created at 0 when the gateway
// starts, so that increase() counts a series' first request (issue 53): each route with each
// method it serves and every status the gateway answers (200 and the gRPC mapping's, the token
// check's and the request limits': 400 401 403 404 405 408 409 411 413 414 416 429 431 500 501
// 503 504); each route with the other common HTTP methods (GET, POST, PUT, DELETE, PATCH, HEAD,
// OPTIONS) and 405; "unmatched" with every common method and 404, and with GET and POST and the
// request-limit codes. ~700 series; what is left to be born at its first request: a method
// outside the common set, or a request-limit answer to an unserved method.
std::vector<std::array<std::string, 3>> PrecreatedRequestSeries();

}  // namespace loom::gateway::internal

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_HTTP_H_
