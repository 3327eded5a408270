#include "services/gateway/gateway.h"

#include <google/protobuf/util/json_util.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <thread>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/grpc_credentials.h"
#include "common/utf8.h"
#include "services/gateway/gateway_http.h"
#include "services/gateway/gateway_submit.h"
#include "services/gateway/gateway_server.h"

namespace loom::gateway {
namespace {

using internal::Access;
using internal::CodeName;
using internal::kJson;
using internal::ReadBody;
using internal::TooLarge;
using internal::WriteError;
using internal::WriteHttpError;

// "GET, POST" for a path some route serves, "" for one no route serves.
std::string AllowedMethods(const std::string& path) {
  const internal::RouteInfo* route = internal::FindRoute(path);
  return route == nullptr ? "" : route->methods;
}

// The request's Content-Length headers, when they do not say one length in decimal digits: a
// message naming the problem; "" when there is none or one valid length (repeated identical
// values are allowed, as RFC 9112 section 6.3 permits). httplib reads a body by the first header
// and by strtoull ("2x" is 2): a proxy in front that framed the request by another value would
// see a different next request than the gateway does (request smuggling), so such a request is
// refused and its connection closed.
std::string AmbiguousLength(const httplib::Request& req) {
  const size_t count = req.get_header_value_count("Content-Length");
  std::string first;
  for (size_t i = 0; i < count; ++i) {
    const std::string value = req.get_header_value("Content-Length", i);
    // At most 18 digits: a length that fits in int64_t whatever the digits.
    if (value.empty() || value.size() > 18 ||
        value.find_first_not_of("0123456789") != std::string::npos) {
      return absl::StrCat("Content-Length '", internal::Printable(value, 32),
                          "' is not a decimal byte count");
    }
    if (i == 0) {
      first = value;
    } else if (value != first) {
      return absl::StrCat("the request has ", count, " Content-Length headers with different "
                          "values ('", first, "' and '", value, "')");
    }
  }
  return "";
}

// The first query parameter whose name or value is not UTF-8 once percent-decoded: a message
// naming it; "" if all are. The routes quote parameters in their errors and the ListJobs route
// turns them into JSON, which must be UTF-8.
std::string NonUtf8Parameter(const httplib::Request& req) {
  for (const auto& [key, value] : req.params) {
    if (loom::FirstInvalidUtf8(key) != absl::string_view::npos) {
      return absl::StrCat("query parameter name '", internal::Printable(key, 64),
                          "' is not valid UTF-8");
    }
    if (const size_t bad = loom::FirstInvalidUtf8(value); bad != absl::string_view::npos) {
      return absl::StrCat("query parameter '", key, "': its value '",
                          internal::Printable(value, 64), "' is not valid UTF-8 (byte ", bad,
                          ")");
    }
  }
  return "";
}

// Header fields a request may carry at most once: a message naming the first that repeats, ""
// if none does. Authorization: the gateway checked the first value and forwarded it, while a
// proxy or log in front may have taken another as the caller (the credentials are ambiguous).
// Host: RFC 9112 section 3.2 demands a 400 for more than one.
std::string RepeatedSingletonHeader(const httplib::Request& req) {
  for (const char* name : {"Authorization", "Host"}) {
    if (const size_t count = req.get_header_value_count(name); count > 1) {
      return absl::StrCat("the request has ", count, " ", name, " headers; send one");
    }
  }
  return "";
}

// An answer refusing a request from its headers alone, before its body is read.
struct Refusal {
  int http_status = 0;
  grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
  std::string message;
};

// The request's Transfer-Encoding, when httplib would frame its body differently from an HTTP/1.1
// proxy in front: a refusal, as nginx answers it (ngx_http_process_request_header); nothing when
// the request has none or exactly one "chunked". httplib reads a body as chunked only when the
// first Transfer-Encoding header is exactly "chunked", and otherwise by Content-Length, or, without
// one, until the client closes (a POST to a route without a body reader: read whole into memory).
std::optional<Refusal> TransferEncodingProblem(const httplib::Request& req) {
  const size_t count = req.get_header_value_count("Transfer-Encoding");
  if (count == 0) return std::nullopt;
  const std::string value = req.get_header_value("Transfer-Encoding");
  if (req.version == "HTTP/1.0") {
    return Refusal{400, grpc::StatusCode::INVALID_ARGUMENT,
                   "an HTTP/1.0 request cannot carry a Transfer-Encoding header"};
  }
  if (count > 1) {
    return Refusal{400, grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("the request has ", count, " Transfer-Encoding headers; send one")};
  }
  if (!absl::EqualsIgnoreCase(value, "chunked")) {
    // RFC 9112 section 6.1: a transfer coding the server does not understand is 501.
    return Refusal{501, grpc::StatusCode::UNIMPLEMENTED,
                   absl::StrCat("Transfer-Encoding '", internal::Printable(value, 64),
                                "' is not supported (only 'chunked')")};
  }
  if (req.has_header("Content-Length")) {
    // RFC 9112 section 6.3: the two disagree on the framing (request smuggling); close after.
    return Refusal{400, grpc::StatusCode::INVALID_ARGUMENT,
                   "the request has both Transfer-Encoding and Content-Length headers"};
  }
  return std::nullopt;
}

// Whether `route` serves `method` (HEAD as GET, as httplib dispatches it).
bool Serves(const internal::RouteInfo& route, const std::string& method) {
  const std::string wanted = method == "HEAD" ? "GET" : method;
  for (absl::string_view m : absl::StrSplit(route.methods, ", ")) {
    if (m == wanted) return true;
  }
  return false;
}

// Whether the handler for `method` on `route` reads a request body: the POST routes do, each
// through internal::ReadBody (at most max_body_bytes, counted while reading, chunked or not).
// httplib reads the body of any other POST, PUT, PATCH or DELETE itself, before its handler or its
// 404, whole into memory when it is chunked or has no length (payload_max_length counts only a
// Content-Length); and it leaves the body of a GET unread, to be parsed as the next request.
bool ReadsBody(const internal::RouteInfo* route, const std::string& method) {
  return route != nullptr && method == "POST" && Serves(*route, method);
}

// Whether httplib would read a body for `method` (its detail::expect_content).
bool LibraryReadsBody(const std::string& method) {
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "PRI" ||
         method == "DELETE";
}

// DeclaredLength: the declared Content-Length, or -1 when there is none or it is not a number.
int64_t DeclaredLength(const httplib::Request& req) {
  int64_t length = -1;
  if (!req.has_header("Content-Length") ||
      !absl::SimpleAtoi(req.get_header_value("Content-Length"), &length)) {
    return -1;
  }
  return length;
}

// The request's body judged from its headers alone, before any of it is read and before the
// token check: 413 for a declared Content-Length over `max_body`, and for any body (a
// Content-Length over 0, or chunked) sent to a route and method that take none, whose limit is
// thus 0 bytes. nginx answers the same 413 for a body over a location's client_max_body_size
// (from a declared length before reading, while reading a chunked one); RFC 9110 section 9.3.1
// allows refusing content on a GET and closing the connection, as a request smuggling risk.
// Routes and methods that are not served at all get their 404 or 405 instead (WriteNoRoute).
std::optional<Refusal> BodySizeProblem(const httplib::Request& req, size_t max_body) {
  const int64_t declared = DeclaredLength(req);
  if (declared >= 0 && static_cast<uint64_t>(declared) > max_body) {
    return Refusal{413, grpc::StatusCode::INVALID_ARGUMENT, TooLarge(declared, max_body)};
  }
  if (!internal::DeclaresBody(req)) return std::nullopt;
  const internal::RouteInfo* route = internal::FindRoute(req.path);
  if (route == nullptr || !Serves(*route, req.method) || ReadsBody(route, req.method)) {
    return std::nullopt;
  }
  return Refusal{413, grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat(req.method, " ", route->route, " takes no request body (this one ",
                              declared > 0 ? absl::StrCat("declares ", declared, " bytes")
                                           : std::string("is chunked"),
                              ")")};
}

// The 404 (no route serves the path) or 405 with `Allow` (the path is served under other
// methods) for `req`; with `close`, the connection is closed after the answer.
void WriteNoRoute(const httplib::Request& req, httplib::Response& res, bool close) {
  const std::string allow = AllowedMethods(req.path);
  auto write = [&](int status, grpc::StatusCode code, const std::string& message) {
    if (close) {
      internal::WriteHttpErrorAndClose(res, status, code, message);
    } else {
      WriteHttpError(res, status, code, message);
    }
  };
  if (allow.empty()) {
    write(404, grpc::StatusCode::NOT_FOUND,
          absl::StrCat("no route for ", internal::Printable(req.method), " ",
                       internal::Printable(req.path)));
    return;
  }
  res.set_header("Allow", allow);
  write(405, grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("method ", internal::Printable(req.method), " is not allowed on ",
                     internal::Printable(req.path), " (allowed: ", allow, ")"));
}

// The answer when building an error answer failed (out of memory, ...): fixed text.
void WriteFallbackError(httplib::Response& res) noexcept {
  try {
    res.status = 500;
    res.set_content(R"({"code":13,"status":"INTERNAL","message":"gateway error"})", kJson);
  } catch (...) {
  }
}

// When the request being answered on this thread reached routing (httplib runs a request's
// pre-routing handler, handler, content provider and logger on one thread); unset for requests
// httplib refused before routing (a malformed request line, ...).
thread_local bool request_started = false;
thread_local absl::Time request_start;

// The answer to an error cpp-httplib raised itself (no handler wrote a body): the status it chose
// (or 405 for a path served under other methods), a gRPC code and a message saying what was wrong.
void WriteLibraryError(const httplib::Request& req, httplib::Response& res) {
  switch (res.status) {
    case 404:
      WriteNoRoute(req, res, /*close=*/false);
      return;
    case 400:
      WriteHttpError(res, 400, grpc::StatusCode::INVALID_ARGUMENT,
                     "malformed HTTP request: its request line, headers or body could not be "
                     "parsed");
      return;
    case 413:
      WriteHttpError(res, 413, grpc::StatusCode::INVALID_ARGUMENT, "request body too large");
      return;
    case 414:
      WriteHttpError(res, 414, grpc::StatusCode::INVALID_ARGUMENT, "request URI too long");
      return;
    case 416:
      WriteHttpError(res, 416, grpc::StatusCode::OUT_OF_RANGE,
                     absl::StrCat("Range '", internal::Printable(req.get_header_value("Range")),
                                  "' cannot be satisfied"));
      return;
    default: {
      // A handler's exception is a 500 with its what() in EXCEPTION_WHAT.
      const std::string what = res.get_header_value("EXCEPTION_WHAT");
      res.headers.erase("EXCEPTION_WHAT");
      const bool server = res.status >= 500;
      WriteHttpError(res, res.status,
                     server ? grpc::StatusCode::INTERNAL : grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat(server ? "gateway error" : "bad request", " (HTTP ", res.status,
                                  ")", what.empty() ? "" : ": ", internal::Printable(what)));
    }
  }
}

}  // namespace

int HttpStatusFromGrpc(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return 200;
    // Not google.api's 499 ("client closed request"): this gateway's HTTP client did not cancel
    // anything; a CANCELLED from the scheduler is a call it dropped while restarting, so it is
    // answered as retryable (break-it pass, 2026-12-05: clients do not retry a 4xx).
    case grpc::StatusCode::CANCELLED: return 503;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    default: return 500;
  }
}

int DefaultHttpThreads() {
  const unsigned hardware = std::thread::hardware_concurrency();
  return std::max(8, 2 * static_cast<int>(hardware));
}

void SetHttpThreads(httplib::Server& server, int threads) {
  const size_t n = static_cast<size_t>(std::max(1, threads));
  server.new_task_queue = [n] { return new httplib::ThreadPool(n); };
}

JobGateway::JobGateway(loom::v1::JobService::StubInterface* stub, GatewayOptions options)
    : stub_(stub), options_(std::move(options)) {}

void JobGateway::Register(httplib::Server& server) {
  // The RPC's context: deadline, and the caller's Authorization header as gRPC metadata.
  auto context = [this](const httplib::Request& req) {
    return internal::MakeContext(req, options_.rpc_timeout);
  };
  // Before any body is read: a body httplib would frame otherwise than a proxy (400, 501), a
  // declared Content-Length over the limit and any body on a route that takes none (413) are
  // refused (the body is not read, and the connection is closed after the answer), and with
  // `auth` a /v1/ request (but the OpenAPI document) without a known token is 401, and one to an
  // admin route (nodes, checkpoints) with a user token 403, as the gRPC services do. A request
  // that no route serves is answered 404 or 405 here too when httplib would read its body
  // first. So the only bodies ever read are those of the POST routes, by internal::ReadBody,
  // after the token check and at most max_body_bytes whether chunked or not: no client, with a
  // token or without, makes the gateway hold more than that per request.
  const size_t max_body = options_.max_body_bytes;
  server.set_pre_routing_handler([this, max_body](const httplib::Request& req,
                                                  httplib::Response& res) {
    request_started = true;
    request_start = absl::Now();
    // Whatever is answered here is answered before the body is read: with a body, the
    // connection is closed after the answer (internal::DeclaresBody says why).
    const bool unread_body = internal::DeclaresBody(req);
    auto refuse = [&](grpc::StatusCode code, const std::string& message) {
      const int status = HttpStatusFromGrpc(code);
      if (unread_body) {
        internal::WriteHttpErrorAndClose(res, status, code, message);
      } else {
        WriteHttpError(res, status, code, message);
      }
    };
    // Framing first: nothing else about a request can be trusted if its length is ambiguous.
    if (const std::string ambiguous = AmbiguousLength(req); !ambiguous.empty()) {
      internal::WriteHttpErrorAndClose(res, 400, grpc::StatusCode::INVALID_ARGUMENT, ambiguous);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (std::optional<Refusal> te = TransferEncodingProblem(req); te.has_value()) {
      internal::WriteHttpErrorAndClose(res, te->http_status, te->code, te->message);
      return httplib::Server::HandlerResponse::Handled;
    }
    // Then credentials that say two things (before the token check reads the first).
    if (const std::string repeated = RepeatedSingletonHeader(req); !repeated.empty()) {
      refuse(grpc::StatusCode::INVALID_ARGUMENT, repeated);
      return httplib::Server::HandlerResponse::Handled;
    }
    // Closed after the answer: a client that sends the body anyway must not have it parsed as
    // its next request (a `Connection: close` header alone does not close it in httplib 0.11).
    if (std::optional<Refusal> size = BodySizeProblem(req, max_body); size.has_value()) {
      internal::WriteHttpErrorAndClose(res, size->http_status, size->code, size->message);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (const std::string bad = NonUtf8Parameter(req); !bad.empty()) {
      refuse(grpc::StatusCode::INVALID_ARGUMENT, bad);
      return httplib::Server::HandlerResponse::Handled;
    }
    const internal::RouteInfo* route = internal::FindRoute(req.path);
    const bool open = route != nullptr ? route->access == Access::kOpen
                                       : !absl::StartsWith(req.path, "/v1/");
    if (options_.auth != nullptr && !open) {
      absl::StatusOr<Caller> caller =
          options_.auth->Authenticate(req.get_header_value("Authorization"));
      if (!caller.ok()) {
        refuse(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.status().message()));
        res.set_header("WWW-Authenticate", "Bearer");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (route != nullptr && route->access == Access::kAdmin && !caller->admin()) {
        refuse(grpc::StatusCode::PERMISSION_DENIED,
               absl::StrCat(route->route, " needs an admin token (tenant '", caller->tenant,
                            "' has the user role)"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // No route serves it: httplib would read a POST, PUT, PATCH or DELETE body whole (chunked,
    // or without a length until the client closes) before answering 404, and leave another
    // method's body to be parsed as the next request.
    if ((route == nullptr || !Serves(*route, req.method)) &&
        (unread_body || LibraryReadsBody(req.method))) {
      WriteNoRoute(req, res, /*close=*/unread_body);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // A client that asks before sending its body (curl does above 1 MiB) is refused before it
  // sends it when the pre-routing handler would refuse the body (framing, size, a route that
  // takes none); this handler runs before pre-routing. httplib calls it outside its exception
  // handling: nothing may escape.
  server.set_expect_100_continue_handler([max_body](const httplib::Request& req,
                                                    httplib::Response& res) {
    try {
      if (const std::string ambiguous = AmbiguousLength(req); !ambiguous.empty()) {
        internal::WriteHttpErrorAndClose(res, 400, grpc::StatusCode::INVALID_ARGUMENT,
                                         ambiguous);
        return 400;
      }
      std::optional<Refusal> refusal = TransferEncodingProblem(req);
      if (!refusal.has_value()) refusal = BodySizeProblem(req, max_body);
      if (refusal.has_value()) {
        internal::WriteHttpErrorAndClose(res, refusal->http_status, refusal->code,
                                         refusal->message);
        return refusal->http_status;
      }
      return 100;
    } catch (...) {
      WriteFallbackError(res);
      return 500;
    }
  });
  // Answers with `resp` or the RPC's error.
  auto reply = [](httplib::Response& res, const grpc::Status& s,
                  const google::protobuf::Message& resp) { internal::Reply(res, s, resp); };

  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server.Get("/v1/openapi.json", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(options_.openapi_json, kJson);
  });
  server.Get(internal::kJobsRoute, [this, context, reply](const httplib::Request& req,
                                                httplib::Response& res) {
    // Query parameters are request fields (proto or lowerCamelCase names); the JSON parser
    // converts "JOB_PHASE_RUNNING" etc. page_size / pageSize must be a decimal integer: the JSON
    // mapping would also take "1e2" or " 7", and its error would speak of a request body.
    nlohmann::json fields = nlohmann::json::object();
    for (const auto& [key, value] : req.params) {
      if (key == "page_size" || key == "pageSize") {
        int32_t size = 0;
        if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
            !absl::SimpleAtoi(value, &size)) {
          WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("page_size: '", value.substr(0, 32),
                                  "' is not a non-negative integer"));
          return;
        }
        fields[key] = size;
        continue;
      }
      if (key == "phase") {
        // One set of phase names (issue 49): loomctl's (RUNNING, running) as well as the enum's
        // (JOB_PHASE_RUNNING) that the JSON answers carry.
        const std::string upper = absl::AsciiStrToUpper(value);
        loom::v1::JobPhase parsed;
        fields[key] = !absl::StartsWith(upper, "JOB_PHASE_") &&
                              loom::v1::JobPhase_Parse(absl::StrCat("JOB_PHASE_", upper), &parsed)
                          ? absl::StrCat("JOB_PHASE_", upper)
                          : value;
        continue;
      }
      fields[key] = value;  // UTF-8: the pre-routing handler refused other bytes
    }
    loom::v1::ListJobsRequest request;
    // The query string as a ListJobsRequest: errors say "query string", not "request body".
    if (!internal::ParseBody(internal::SafeDump(fields), &request, res, "query string")) {
      return;
    }
    loom::v1::ListJobsResponse response;
    reply(res, stub_->ListJobs(context(req).get(), request, &response), response);
  });
  // POST routes read their bodies themselves (httplib's content readers): bounded by
  // max_body_bytes also when chunked, and a body-less POST (no Content-Length) is not waited for.
  server.Post(internal::kJobsRoute, [this, context, reply, max_body](const httplib::Request& req,
                                                           httplib::Response& res,
                                                           const httplib::ContentReader& reader) {
    // JSON, or multipart/form-data with loomctl's files as they are (gateway_submit.h).
    loom::v1::SubmitJobRequest request;
    if (!internal::ReadSubmitJobRequest(req, res, reader, max_body, &request)) return;
    loom::v1::SubmitJobResponse response;
    reply(res, stub_->SubmitJob(context(req).get(), request, &response), response);
  });
  // Cancel and kill take no body; one that is sent anyway is read (bounded) and ignored.
  server.Post(internal::kCancelRoute, [this, context, reply, max_body](const httplib::Request& req,
                                                             httplib::Response& res,
                                                             const httplib::ContentReader& reader) {
    std::string ignored;
    if (!ReadBody(req, res, reader, max_body, /*required=*/false, &ignored)) return;
    loom::v1::CancelJobRequest request;
    request.set_job_id(req.matches[1]);
    loom::v1::Job response;
    reply(res, stub_->CancelJob(context(req).get(), request, &response), response);
  });
  server.Post(internal::kKillRoute, [this, context, reply, max_body](const httplib::Request& req,
                                                           httplib::Response& res,
                                                           const httplib::ContentReader& reader) {
    std::string ignored;
    if (!ReadBody(req, res, reader, max_body, /*required=*/false, &ignored)) return;
    loom::v1::KillJobRequest request;
    request.set_job_id(req.matches[1]);
    loom::v1::Job response;
    reply(res, stub_->KillJob(context(req).get(), request, &response), response);
  });
  RegisterResume(server);  // gateway_resume.cc
  RegisterLogs(server);
  RegisterMetrics(server);
  server.Get(internal::kJobRoute,
             [this, context, reply](const httplib::Request& req, httplib::Response& res) {
               loom::v1::GetJobRequest request;
               request.set_job_id(req.matches[1]);
               loom::v1::Job response;
               reply(res, stub_->GetJob(context(req).get(), request, &response), response);
             });
  RegisterExplainAndWatch(server);
  RegisterCheckpointRoutes(server);
  RegisterAdminRoutes(server);
  if (options_.registry != nullptr) {
    // By route template (never the raw path: ids would make a series per job), method and status.
    auto* requests = &prometheus::BuildCounter()
                          .Name("loom_gateway_requests_total")
                          .Help("HTTP requests answered by the gateway, by route template "
                                "(\"unmatched\" for paths no route serves), method and status.")
                          .Register(*options_.registry);
    auto* seconds = &prometheus::BuildHistogram()
                         .Name("loom_gateway_request_duration_seconds")
                         .Help("Time from routing a request to the end of its response (of the "
                               "whole stream for :watch and followed logs), by route and "
                               "method.")
                         .Register(*options_.registry);
    // 32 s just above the gateway's 30 s call deadline: a timed-out call (30.01 s, 504) lands in
    // (30, 32], where a (30, 60] bucket put p99 at 59.7 s (an operator pass, issue 53).
    static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 32,
        60, 300};
    // Every series a request can land in exists from the start, at 0: rate() and increase() see
    // a series' first sample as its start, so a series born at its first request never counted
    // that request (the dashboards' truth test found /v1/jobs 200 reading 1 after 2 requests).
    // Each route with each method it serves and every code the gateway answers (the gRPC
    // mapping's, the token check's and the request limits'), the methods it does not serve with
    // 405, and unmatched paths with their codes: ~600 series. (An operator pass found 405 and 504
    // born at their first request, uncounted: issue 53.) Only a method outside HTTP's common set
    // is born at its first request. The histogram has no code label: the latency panels sum over
    // codes, and 20 buckets per code would multiply its series.
    for (const auto& [route, method, code] : internal::PrecreatedRequestSeries()) {
      requests->Add({{"route", route}, {"method", method}, {"code", code}});
    }
    for (const internal::RouteInfo& r : internal::AllRoutes()) {
      for (absl::string_view m : absl::StrSplit(r.methods, ", ")) {
        seconds->Add({{"route", r.route}, {"method", std::string(m)}}, *kBuckets);
      }
    }
    for (const char* m : {"GET", "POST"}) {
      seconds->Add({{"route", "unmatched"}, {"method", m}}, *kBuckets);
    }
    server.set_logger([requests, seconds](const httplib::Request& req,
                                          const httplib::Response& res) {
      // httplib calls the logger outside its exception handling: a metric is not worth the
      // process.
      try {
        const internal::RouteInfo* route = internal::FindRoute(req.path);
        const std::map<std::string, std::string> labels = {
            {"route", route != nullptr ? route->route : "unmatched"},
            {"method", req.method},
            {"code", std::to_string(res.status)}};
        requests->Add(labels).Increment();
        if (request_started) {
          seconds->Add({{"route", labels.at("route")}, {"method", req.method}}, *kBuckets)
              .Observe(absl::ToDoubleSeconds(absl::Now() - request_start));
        }
      } catch (...) {
      }
      request_started = false;
    });
  }
  // httplib calls the error handler outside its exception handling (an exception here ended the
  // process: breakit_s41 H1), so it catches everything; the messages quote request bytes only
  // through internal::Printable.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (internal::HasBody(res)) return;  // a handler already wrote its error
    try {
      // A header section over GatewayServer's limits, or past its deadline (408), reached
      // httplib as a truncated request (its 400): the limit is the answer, and the connection
      // closes after it.
      if (const internal::HeaderLimitError* limit = internal::CurrentHeaderLimitError();
          limit != nullptr) {
        internal::WriteHttpErrorAndClose(res, limit->http_status, internal::LimitCode(*limit),
                                         limit->message);
        return;
      }
      WriteLibraryError(req, res);
    } catch (...) {
      WriteFallbackError(res);
    }
  });
  // An exception from a handler or the pre-routing handler: 500 INTERNAL with its what(). httplib
  // calls this inside a catch block, where a second exception would end the process.
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          // A handler may have set a stream before it threw: the error replaces it.
          res.content_provider_ = nullptr;
          res.content_provider_resource_releaser_ = nullptr;
          res.content_length_ = 0;
          res.is_chunked_content_provider_ = false;
          res.headers.clear();
          WriteHttpError(res, 500, grpc::StatusCode::INTERNAL,
                         absl::StrCat("gateway error: ", internal::Printable(what)));
        } catch (...) {
          WriteFallbackError(res);
        }
      });
}

}  // namespace loom::gateway
