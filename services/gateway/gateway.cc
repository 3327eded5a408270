#include "services/gateway/gateway.h"

#include <google/protobuf/util/json_util.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <vector>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/grpc_credentials.h"

namespace loom::gateway {
namespace {

constexpr char kJson[] = "application/json";

// Canonical upper-case name of a gRPC code ("NOT_FOUND").
std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  int c = static_cast<int>(code);
  return c >= 0 && c <= 16 ? kNames[c] : "UNKNOWN";
}

void WriteError(httplib::Response& res, grpc::StatusCode code, const std::string& message) {
  res.status = HttpStatusFromGrpc(code);
  nlohmann::json body = {{"code", static_cast<int>(code)}, {"status", CodeName(code)},
                         {"message", message}};
  res.set_content(body.dump(), kJson);
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

// Parses `json` into `m` (unknown fields are an error); on failure answers 400 and returns false.
bool ParseBody(const std::string& json, google::protobuf::Message* m, httplib::Response& res) {
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto st = google::protobuf::util::JsonStringToMessage(json.empty() ? "{}" : json, m, opts);
  if (!st.ok()) {
    WriteError(res, grpc::StatusCode::INVALID_ARGUMENT,
               absl::StrCat("request body is not a valid ", m->GetDescriptor()->full_name(),
                            " in JSON: ", st.message().as_string()));
    return false;
  }
  return true;
}

// One LogLine in the canonical JSON mapping (single line).
std::string LineJson(const loom::v1::LogLine& line) {
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(line, &out, print);
  return out;
}

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

}  // namespace

int HttpStatusFromGrpc(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::CANCELLED: return 499;
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

JobGateway::JobGateway(loom::v1::JobService::StubInterface* stub, GatewayOptions options)
    : stub_(stub), options_(std::move(options)) {}

void JobGateway::Register(httplib::Server& server) {
  // The RPC's context: deadline, and the caller's Authorization header as gRPC metadata.
  auto context = [this](const httplib::Request& req) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.rpc_timeout));
    // A header gRPC cannot carry is dropped: the call then goes unauthenticated (and is
    // answered 401 where authentication is on) instead of aborting the gateway.
    const std::string authorization = req.get_header_value("Authorization");
    if (!authorization.empty()) AddAuthorizationMetadata(*ctx, authorization);
    return ctx;
  };
  if (options_.auth != nullptr) {
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!absl::StartsWith(req.path, "/v1/jobs")) return httplib::Server::HandlerResponse::Unhandled;
      absl::StatusOr<Caller> caller =
          options_.auth->Authenticate(req.get_header_value("Authorization"));
      if (caller.ok()) return httplib::Server::HandlerResponse::Unhandled;
      WriteError(res, grpc::StatusCode::UNAUTHENTICATED, std::string(caller.status().message()));
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  // Answers with `resp` or the RPC's error.
  auto reply = [](httplib::Response& res, const grpc::Status& s,
                  const google::protobuf::Message& resp) {
    if (s.ok()) {
      WriteMessage(res, resp);
    } else {
      WriteError(res, s.error_code(), s.error_message());
    }
  };

  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server.Get("/v1/openapi.json", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(options_.openapi_json, kJson);
  });
  server.Get("/v1/jobs", [this, context, reply](const httplib::Request& req,
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
      fields[key] = value;
    }
    loom::v1::ListJobsRequest request;
    if (!ParseBody(fields.dump(), &request, res)) return;
    loom::v1::ListJobsResponse response;
    reply(res, stub_->ListJobs(context(req).get(), request, &response), response);
  });
  server.Post("/v1/jobs", [this, context, reply](const httplib::Request& req,
                                                 httplib::Response& res) {
    loom::v1::SubmitJobRequest request;
    if (!ParseBody(req.body, &request, res)) return;
    loom::v1::SubmitJobResponse response;
    reply(res, stub_->SubmitJob(context(req).get(), request, &response), response);
  });
  server.Post(R"(/v1/jobs/([A-Za-z0-9_.-]+):cancel)",
              [this, context, reply](const httplib::Request& req, httplib::Response& res) {
                loom::v1::CancelJobRequest request;
                request.set_job_id(req.matches[1]);
                loom::v1::Job response;
                reply(res, stub_->CancelJob(context(req).get(), request, &response), response);
              });
  server.Post(R"(/v1/jobs/([A-Za-z0-9_.-]+):kill)",
              [this, context, reply](const httplib::Request& req, httplib::Response& res) {
                loom::v1::KillJobRequest request;
                request.set_job_id(req.matches[1]);
                loom::v1::Job response;
                reply(res, stub_->KillJob(context(req).get(), request, &response), response);
              });
  server.Get(R"(/v1/jobs/([A-Za-z0-9_.-]+)/logs)",
             [this, context](const httplib::Request& req, httplib::Response& res) {
               loom::v1::StreamLogsRequest request;
               request.set_job_id(req.matches[1]);
               if (!ParseLogsQuery(req, &request, res)) return;
               if (!request.follow()) {
                 // The retained lines at once, as {"lines": [LogLine, ...]}, under the deadline.
                 auto ctx = context(req);
                 auto reader = stub_->StreamLogs(ctx.get(), request);
                 // Each line is protobuf's JSON already: joined, not parsed and dumped again.
                 std::vector<std::string> lines;
                 loom::v1::LogLine line;
                 while (reader->Read(&line)) lines.push_back(LineJson(line));
                 grpc::Status s = reader->Finish();
                 if (!s.ok()) {
                   WriteError(res, s.error_code(), s.error_message());
                   return;
                 }
                 res.status = 200;
                 res.set_content(absl::StrCat("{\"lines\":[", absl::StrJoin(lines, ","), "]}"),
                                 kJson);
                 return;
               }
               // follow: chunked NDJSON, one LogLine per line, until the job ends. The status
               // code comes from a GetJob first (missing job, another tenant's, no token), so that
               // the headers go out at once instead of after the first line; then no deadline.
               {
                 loom::v1::GetJobRequest get;
                 get.set_job_id(request.job_id());
                 loom::v1::Job job;
                 grpc::Status s = stub_->GetJob(context(req).get(), get, &job);
                 if (!s.ok()) {
                   WriteError(res, s.error_code(), s.error_message());
                   return;
                 }
               }
               std::shared_ptr<grpc::ClientContext> ctx = context(req);
               ctx->set_deadline(std::chrono::system_clock::time_point::max());
               std::shared_ptr<grpc::ClientReaderInterface<loom::v1::LogLine>> reader(
                   stub_->StreamLogs(ctx.get(), request));
               res.status = 200;
               // A client that goes away is noticed at the next write (a line or the end); a
               // quiet job's follower holds its gateway thread until then.
               res.set_chunked_content_provider(
                   "application/x-ndjson",
                   [reader](size_t, httplib::DataSink& sink) {
                     loom::v1::LogLine line;
                     if (!reader->Read(&line)) {
                       grpc::Status s = reader->Finish();
                       if (!s.ok()) {  // the stream broke after the headers: say so in-band
                         std::string err = nlohmann::json({{"error", {{"code", static_cast<int>(s.error_code())},
                                                                      {"status", CodeName(s.error_code())},
                                                                      {"message", s.error_message()}}}})
                                               .dump() + "\n";
                         sink.write(err.data(), err.size());
                       }
                       sink.done();
                       return true;
                     }
                     std::string out = LineJson(line) + "\n";
                     return sink.write(out.data(), out.size());
                   },
                   [ctx](bool /*success*/) { ctx->TryCancel(); });
             });
  server.Get(R"(/v1/jobs/([A-Za-z0-9_.-]+))",
             [this, context, reply](const httplib::Request& req, httplib::Response& res) {
               loom::v1::GetJobRequest request;
               request.set_job_id(req.matches[1]);
               loom::v1::Job response;
               reply(res, stub_->GetJob(context(req).get(), request, &response), response);
             });
  if (options_.registry != nullptr) {
    auto* requests = &prometheus::BuildCounter()
                          .Name("loom_gateway_requests_total")
                          .Help("HTTP requests answered by the gateway, by method and status.")
                          .Register(*options_.registry);
    server.set_logger([requests](const httplib::Request& req, const httplib::Response& res) {
      requests->Add({{"method", req.method}, {"code", std::to_string(res.status)}}).Increment();
    });
  }
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already wrote its error
    if (res.status == 404) {
      WriteError(res, grpc::StatusCode::NOT_FOUND, absl::StrCat("no route for ", req.method, " ", req.path));
      return;
    }
    nlohmann::json body = {{"code", static_cast<int>(grpc::StatusCode::UNKNOWN)},
                           {"status", "UNKNOWN"},
                           {"message", absl::StrCat("HTTP ", res.status)}};
    res.set_content(body.dump(), kJson);
  });
}

}  // namespace loom::gateway
