#include "services/gateway/gateway_http.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_credentials.h"
#include "common/problems.h"
#include "common/utf8.h"
#include "services/gateway/gateway.h"

namespace loom::gateway::internal {
namespace {

bool IsChunked(const httplib::Request& req) {
  return absl::EqualsIgnoreCase(req.get_header_value("Transfer-Encoding"), "chunked");
}

}  // namespace

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  int c = static_cast<int>(code);
  return c >= 0 && c <= 16 ? kNames[c] : "UNKNOWN";
}

grpc::StatusCode LimitCode(const HeaderLimitError& limit) {
  return limit.http_status == 408 ? grpc::StatusCode::DEADLINE_EXCEEDED
                                  : grpc::StatusCode::INVALID_ARGUMENT;
}

std::string Printable(absl::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  while (i < text.size() && i < max_bytes) {
    uint32_t code_point = 0;
    const int n = loom::DecodeUtf8(text, i, &code_point);  // 0 invalid, -1 cut off: both one bad byte
    if (n <= 0) {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(text[i]),
                                               absl::kZeroPad2));
      ++i;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  if (i < text.size()) out += "...";
  return out;
}

std::string SafeDump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json ErrorJson(grpc::StatusCode code, const std::string& message) {
  return {{"code", static_cast<int>(code)}, {"status", CodeName(code)}, {"message", message}};
}

namespace {

std::string ErrorBody(grpc::StatusCode code, const std::string& message) {
  return SafeDump(ErrorJson(code, message));
}

}  // namespace

void WriteHttpError(httplib::Response& res, int http_status, grpc::StatusCode code,
                    const std::string& message) {
  res.status = http_status;
  res.set_content(ErrorBody(code, message), kJson);
}

void WriteHttpErrorAndClose(httplib::Response& res, int http_status, grpc::StatusCode code,
                            const std::string& message) {
  res.status = http_status;
  res.set_header("Connection", "close");
  auto body = std::make_shared<const std::string>(ErrorBody(code, message));
  res.set_content_provider(
      body->size(), kJson,
      [body](size_t offset, size_t length, httplib::DataSink& sink) {
        // The body (or the part a Range header asked for), then "failure": httplib ends the
        // connection instead of reading the request's unread bytes as the next request. (httplib
        // sends Content-Length from the provider's length: it applies ranges to every routed
        // response and to every error the gateway's error handler saw.)
        if (offset < body->size()) {
          sink.write(body->data() + offset, std::min(length, body->size() - offset));
        }
        return false;
      });
}

bool DeclaresBody(const httplib::Request& req) {
  if (IsChunked(req)) return true;
  int64_t length = 0;
  return req.has_header("Content-Length") &&
         absl::SimpleAtoi(req.get_header_value("Content-Length"), &length) && length > 0;
}

bool HasBody(const httplib::Response& res) {
  return !res.body.empty() || static_cast<bool>(res.content_provider_);
}

void WriteError(httplib::Response& res, grpc::StatusCode code, const std::string& message) {
  WriteHttpError(res, HttpStatusFromGrpc(code), code, message);
}

std::string MessageJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, print);
  return out;
}

void WriteMessage(httplib::Response& res, const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(m, &out, print);
  if (!st.ok()) {
    WriteError(res, grpc::StatusCode::INTERNAL,
               absl::StrCat("cannot encode the response as JSON: ", st.message().as_string()));
    return;
  }
  res.status = 200;
  res.set_content(out, kJson);
}

void Reply(httplib::Response& res, const grpc::Status& s, const google::protobuf::Message& resp) {
  if (s.ok()) {
    WriteMessage(res, resp);
    return;
  }
  nlohmann::json body = ErrorJson(s.error_code(), s.error_message());
  // A refusal with problems (a submission's, common/problems.h) lists each, as google.rpc's
  // BadRequest FieldViolation in its JSON form: {"field": ..., "description": ...}.
  if (std::optional<std::string> bad_request = BadRequestOfRpcStatus(s.error_details())) {
    if (std::optional<std::vector<Problem>> problems = DecodeBadRequest(*bad_request)) {
      nlohmann::json details = nlohmann::json::array();
      for (const Problem& p : *problems) {
        details.push_back({{"field", p.path}, {"description", p.what}});
      }
      body["details"] = std::move(details);
    }
  }
  res.status = HttpStatusFromGrpc(s.error_code());
  res.set_content(SafeDump(body), kJson);
}

bool ParseBody(const std::string& json, google::protobuf::Message* m, httplib::Response& res,
               absl::string_view what) {
  if (const size_t bad = loom::FirstInvalidUtf8(json); bad != absl::string_view::npos) {
    WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat(what, " is not valid UTF-8 JSON (a ",
                            m->GetDescriptor()->full_name(), " is expected): byte 0x",
                            absl::Hex(static_cast<unsigned char>(json[bad]), absl::kZeroPad2),
                            " at offset ", bad, " is not UTF-8"));
    return false;
  }
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto st = google::protobuf::util::JsonStringToMessage(json.empty() ? "{}" : json, m, opts);
  if (!st.ok()) {
    WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat(what, " is not a valid ", m->GetDescriptor()->full_name(),
                            " in JSON: ", st.message().as_string()));
    return false;
  }
  return true;
}

std::string TooLarge(int64_t declared, size_t max) {
  return absl::StrCat("request body", declared >= 0 ? absl::StrCat(" of ", declared, " bytes") : "",
                      " is over the gateway's limit of ", max, " bytes (--max_body_bytes)");
}

bool ReadBody(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& reader, size_t max, bool required,
              std::string* body) {
  if (!req.has_header("Content-Length") && !IsChunked(req)) {
    if (!required) return true;
    WriteHttpError(res, 411, grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat(req.method, " ", req.path,
                                " needs a JSON body with a Content-Length header (or chunked "
                                "transfer encoding)"));
    return false;
  }
  bool too_large = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (body->size() + n > max) {
      too_large = true;
      return false;
    }
    // Capacity at most `max` too (a doubling std::string would hold up to 2 x max).
    if (body->size() + n > body->capacity()) {
      body->reserve(std::min(max, std::max(2 * body->capacity(), body->size() + n)));
    }
    body->append(data, n);
    return true;
  });
  if (too_large) {
    WriteHttpErrorAndClose(res, 413, grpc::StatusCode::INVALID_ARGUMENT, TooLarge(-1, max));
    return false;
  }
  // The body did not arrive within GatewayServer's --body_timeout (the stream ended it): 408.
  if (const HeaderLimitError* limit = CurrentHeaderLimitError(); !read && limit != nullptr) {
    WriteHttpErrorAndClose(res, limit->http_status, LimitCode(*limit), limit->message);
    return false;
  }
  if (!read) {
    WriteHttpErrorAndClose(
        res, 400, grpc::StatusCode::INVALID_ARGUMENT,
        "the request body could not be read (truncated, or a bad chunked encoding)");
    return false;
  }
  return true;
}

std::unique_ptr<grpc::ClientContext> MakeContext(const httplib::Request& req,
                                                 absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  const std::string authorization = req.get_header_value("Authorization");
  if (!authorization.empty()) AddAuthorizationMetadata(*ctx, authorization);
  return ctx;
}

namespace {

struct RouteEntry {
  std::regex pattern;
  RouteInfo info;
};

const std::vector<RouteEntry>& Routes() {
  static const auto* const kRoutes = new std::vector<RouteEntry>{
      {std::regex("/healthz"), {"/healthz", "GET", Access::kOpen}},
      {std::regex("/v1/openapi.json"), {"/v1/openapi.json", "GET", Access::kOpen}},
      {std::regex(kJobsRoute), {"/v1/jobs", "GET, POST", Access::kUser}},
      {std::regex(kCancelRoute), {"/v1/jobs/{id}:cancel", "POST", Access::kUser}},
      {std::regex(kKillRoute), {"/v1/jobs/{id}:kill", "POST", Access::kUser}},
      {std::regex(kResumeRoute), {"/v1/jobs/{id}:resume", "POST", Access::kUser}},
      {std::regex(kExplainRoute), {"/v1/jobs/{id}:explain", "GET", Access::kUser}},
      {std::regex(kWatchRoute), {"/v1/jobs/{id}:watch", "GET", Access::kUser}},
      {std::regex(kLogsRoute), {"/v1/jobs/{id}/logs", "GET", Access::kUser}},
      {std::regex(kMetricsRoute), {"/v1/jobs/{id}/metrics", "GET", Access::kUser}},
      {std::regex(kCheckpointsRoute), {"/v1/jobs/{id}/checkpoints", "GET", Access::kAdmin}},
      {std::regex(kRetentionRoute),
       {"/v1/jobs/{id}/checkpoints:applyRetention", "POST", Access::kAdmin}},
      {std::regex(kConsolidateRoute),
       {"/v1/jobs/{id}/checkpoints/{step}:consolidate", "POST", Access::kAdmin}},
      {std::regex(kVerifyRoute),
       {"/v1/jobs/{id}/checkpoints/{step}:verify", "POST", Access::kAdmin}},
      {std::regex(kCheckpointRoute),
       {"/v1/jobs/{id}/checkpoints/{step}", "GET, DELETE", Access::kAdmin}},
      {std::regex(kJobRoute), {"/v1/jobs/{id}", "GET", Access::kUser}},
      {std::regex(kQueuesRoute), {"/v1/queues", "GET", Access::kUser}},
      {std::regex(kNodesRoute), {"/v1/nodes", "GET", Access::kAdmin}},
      {std::regex(kCordonRoute), {"/v1/nodes/{id}:cordon", "POST", Access::kAdmin}},
      {std::regex(kUncordonRoute), {"/v1/nodes/{id}:uncordon", "POST", Access::kAdmin}},
      {std::regex(kDrainRoute), {"/v1/nodes/{id}:drain", "POST", Access::kAdmin}},
  };
  return *kRoutes;
}

}  // namespace

const RouteInfo* FindRoute(const std::string& path) {
  for (const RouteEntry& e : Routes()) {
    if (std::regex_match(path, e.pattern)) return &e.info;
  }
  return nullptr;
}

std::vector<RouteInfo> AllRoutes() {
  std::vector<RouteInfo> out;
  for (const RouteEntry& e : Routes()) out.push_back(e.info);
  return out;
}

std::vector<std::array<std::string, 3>> PrecreatedRequestSeries() {
  static constexpr const char* kMethods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD",
                                             "OPTIONS"};
  // Answers to a request whose head or body breaks a limit, on any path.
  static constexpr const char* kLimitCodes[] = {"400", "408", "411", "413", "414", "431"};
  static constexpr const char* kServedCodes[] = {"200", "400", "401", "403", "404", "405",
                                                 "408", "409", "411", "413", "414", "416",
                                                 "429", "431", "500", "501", "503", "504"};
  std::vector<std::array<std::string, 3>> out;
  for (const RouteEntry& e : Routes()) {
    const std::vector<std::string> served = absl::StrSplit(e.info.methods, ", ");
    for (const char* method : kMethods) {
      if (std::find(served.begin(), served.end(), method) != served.end()) {
        for (const char* code : kServedCodes) out.push_back({e.info.route, method, code});
      } else {
        out.push_back({e.info.route, method, "405"});
      }
    }
  }
  for (const char* method : kMethods) out.push_back({"unmatched", method, "404"});
  for (const char* method : {"GET", "POST"}) {
    for (const char* code : kLimitCodes) out.push_back({"unmatched", method, code});
  }
  return out;
}

}  // namespace loom::gateway::internal
