// loom-gateway's core: JobService over HTTP/JSON (REST), using protobuf's canonical JSON mapping
// (proto3 JSON: lowerCamelCase names on output, both names accepted on input, enums by name).
//
//   GET  /v1/jobs[?phase=JOB_PHASE_RUNNING]   -> ListJobs        200 ListJobsResponse
//   GET  /v1/jobs/{id}                         -> GetJob          200 Job
//   POST /v1/jobs        body SubmitJobRequest -> SubmitJob       200 SubmitJobResponse
//   POST /v1/jobs/{id}:cancel                  -> CancelJob       200 Job (graceful: STOPPING
//                                                 while the ranks write a final checkpoint)
//   POST /v1/jobs/{id}:kill                    -> KillJob         200 Job (CANCELLED at once)
//   GET  /v1/jobs/{id}/logs?follow=&rank=&tail_lines=
//                                              -> StreamLogs      200 {"lines": [LogLine...]};
//        with follow=true a chunked application/x-ndjson body, one LogLine per line, that ends
//        when the job has ended (an error after the headers is sent as a last {"error": {...}}
//        line). The status code comes from a GetJob before the stream (404, 401, ...); the
//        headers go out at once. A client that disconnects cancels the stream at the next line
//        or the job's end; until then each follower holds one gateway thread (httplib's pool).
//        rank may repeat or be comma-separated. WatchJob is gRPC-only.
//   GET  /v1/openapi.json                      the OpenAPI 3 document of these routes
//   GET  /healthz                              200 "ok" (the gateway itself; not the scheduler)
// Query parameters of GET /v1/jobs are fields of ListJobsRequest. Errors (from the scheduler or
// the gateway) answer {"code": <gRPC code number>, "status": "NOT_FOUND", "message": "..."} with
// the HTTP status of HttpStatusFromGrpc (the mapping of google.rpc.Code / grpc-gateway). The
// RPCs carry a deadline of `rpc_timeout` (followed log streams excepted).
//
// HTTP-level errors use the same body with their own status: 405 UNIMPLEMENTED with an `Allow`
// header for a method a served path does not take; 411 INVALID_ARGUMENT for POST /v1/jobs
// without Content-Length (or chunked encoding); 413 INVALID_ARGUMENT for a body over
// `max_body_bytes` (refused from the declared Content-Length before the body is read, or while
// reading a chunked one); 400 INVALID_ARGUMENT for a request httplib cannot parse; 404 NOT_FOUND
// for an unknown path. A POST :cancel / :kill needs no body and no Content-Length (curl -XPOST).
//
// Authentication: the request's `Authorization` header is forwarded as the RPC's `authorization`
// metadata, so the scheduler authenticates the caller and scopes it to its tenant (401 for
// UNAUTHENTICATED, 404 for another tenant's job). With `auth` set the gateway also rejects
// requests without a known token itself (401) before calling the scheduler.
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>

#include "absl/time/time.h"
#include "common/auth.h"
#include "proto/job_service.grpc.pb.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace loom::gateway {

struct GatewayOptions {
  // Deadline of each RPC to the scheduler.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Served at /v1/openapi.json (the text of services/gateway/openapi.json).
  std::string openapi_json;
  // If set, Register adds loom_gateway_requests_total{method,code} (HTTP method and status) here.
  prometheus::Registry* registry = nullptr;
  // If set, /v1/jobs* requests need a bearer token known to it (401 otherwise). Must outlive
  // the server.
  const TokenAuthenticator* auth = nullptr;
  // Largest request body accepted, in bytes (413 above). The default is gRPC's default
  // receive limit (4 MiB), which the scheduler would refuse anyway (RESOURCE_EXHAUSTED).
  size_t max_body_bytes = 4 << 20;
};

// The HTTP status for a gRPC status code: OK 200, INVALID_ARGUMENT / FAILED_PRECONDITION /
// OUT_OF_RANGE 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS /
// ABORTED 409, RESOURCE_EXHAUSTED 429, CANCELLED 499, UNIMPLEMENTED 501, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, anything else 500.
int HttpStatusFromGrpc(grpc::StatusCode code);

// Routes the REST API onto `stub`. Thread-safe (httplib runs handlers on a thread pool; gRPC
// stubs are thread-safe). `stub` must outlive the server the routes are registered on.
class JobGateway {
 public:
  JobGateway(loom::v1::JobService::StubInterface* stub, GatewayOptions options);
  void Register(httplib::Server& server);

 private:
  loom::v1::JobService::StubInterface* stub_;
  const GatewayOptions options_;
};

}  // namespace loom::gateway

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_H_
