// loom-gateway's core: loom-scheduler's JobService and AdminService and loom-checkpoint's
// CheckpointService over HTTP/JSON (REST), using protobuf's canonical JSON mapping (proto3 JSON:
// lowerCamelCase names on output, both names accepted on input, enums by name, int64 as strings).
// docs/gateway.md lists every route with an example; openapi.json describes them.
//
// Jobs (JobService; any known token, scoped to its tenant: another tenant's job is 404):
//   GET  /v1/jobs[?phase=&page_size=&page_token=] -> ListJobs     200 ListJobsResponse
//   GET  /v1/jobs/{id}                         -> GetJob          200 Job
//   POST /v1/jobs        body SubmitJobRequest -> SubmitJob       200 SubmitJobResponse
//   POST /v1/jobs/{id}:cancel                  -> CancelJob       200 Job (graceful: STOPPING
//                                                 while the ranks write a final checkpoint)
//   POST /v1/jobs/{id}:kill                    -> KillJob         200 Job (CANCELLED at once)
//   POST /v1/jobs/{id}:resume  body {"waitForCapacity": true} optional
//                                              -> ResumeJob       200 Job (a FAILED or CANCELLED
//                                                 job PENDING again; 400 FAILED_PRECONDITION if
//                                                 it is not, or has no committed checkpoint)
//   GET  /v1/jobs/{id}:explain                 -> ExplainPending  200 ExplainPendingResponse
//   GET  /v1/jobs/{id}:watch                   -> WatchJob        200 text/event-stream: one
//        server-sent event per JobEvent ("event: <type>", "id: <n>" from 1, "data: <JobEvent
//        JSON>"), ended after the job's terminal event; an error after the headers is a last
//        "event: error" with the error body as data. A ": keep-alive" comment goes out every
//        `sse_keepalive` while the job is quiet, so a client that went away is noticed within
//        that time: the gateway then cancels the WatchJob call and frees its thread.
//   GET  /v1/jobs/{id}/logs?follow=&rank=&tail_lines=
//                                              -> StreamLogs      200 {"lines": [LogLine...]};
//        with follow=true a chunked application/x-ndjson body, one LogLine per line, that ends
//        when the job has ended (an error after the headers is sent as a last {"error": {...}}
//        line). While the job is quiet the connection is probed every `follow_probe` (nothing
//        is written: the body stays one LogLine per line), so a client that closed its
//        connection is noticed within about that time: the gateway then cancels the
//        StreamLogs call and frees its thread. rank may repeat or be comma-separated.
//   For :watch and followed logs the status code comes from a GetJob before the stream (404,
//   401, ...); the headers go out at once; each open stream holds one gateway thread (httplib's
//   pool, `--http_threads`) and one more that reads the gRPC stream.
// Checkpoints (CheckpointService; admin token, as loom-checkpoint demands, 403 otherwise; 501
// UNIMPLEMENTED when the gateway has no checkpoint service):
//   GET    /v1/jobs/{id}/checkpoints                 -> ListCheckpoints  200 ListCheckpointsResponse
//   GET    /v1/jobs/{id}/checkpoints/{step}          -> GetCheckpoint    200 CheckpointInfo
//   DELETE /v1/jobs/{id}/checkpoints/{step}[?protected_steps=N,M]
//                                                    -> DeleteCheckpoint 200 DeleteCheckpointResponse
//   POST   /v1/jobs/{id}/checkpoints/{step}:consolidate  body {output_dir, max_shard_size, dtype}
//                                                    -> ConsolidateCheckpoint (step 0 = newest
//                                                       committed) 200 ConsolidateCheckpointResponse
//   POST   /v1/jobs/{id}/checkpoints/{step}:verify   -> VerifyCheckpoint 200 VerifyCheckpointResponse
//   POST   /v1/jobs/{id}/checkpoints:applyRetention  body {keep_last, keep_best, best_metric,
//                                                    protected_steps} -> ApplyRetention 200
//   {step} is a decimal integer >= 0 (400 naming `step` otherwise). A body field that repeats a
//   path field (job_id, step) must equal it (400).
// Queues and nodes (AdminService; ListQueues takes any token, the node routes an admin token):
//   GET  /v1/queues                            -> ListQueues      200 ListQueuesResponse
//   GET  /v1/nodes                             -> ListNodes       200 ListNodesResponse
//   POST /v1/nodes/{id}:cordon    body {reason} optional -> CordonNode    200 NodeInfo
//   POST /v1/nodes/{id}:uncordon                        -> UncordonNode  200 NodeInfo
//   POST /v1/nodes/{id}:drain     body {reason} optional -> DrainNode     200 DrainNodeResponse
// Others:
//   GET  /v1/openapi.json                      the OpenAPI 3 document of these routes (no token)
//   GET  /healthz                              200 "ok" (the gateway itself; not the scheduler)
// Query parameters of GET /v1/jobs are fields of ListJobsRequest. Errors (from the services or
// the gateway) answer {"code": <gRPC code number>, "status": "NOT_FOUND", "message": "..."} with
// the HTTP status of HttpStatusFromGrpc (the mapping of google.rpc.Code / grpc-gateway). The
// RPCs carry a deadline of `rpc_timeout` (:watch and followed log streams excepted).
//
// HTTP-level errors use the same body with their own status: 405 UNIMPLEMENTED with an `Allow`
// header for a method a served path does not take; 411 INVALID_ARGUMENT for POST /v1/jobs
// without Content-Length (or chunked encoding); 413 INVALID_ARGUMENT for a body over
// `max_body_bytes` (refused from the declared Content-Length before the body is read, or while
// reading a chunked one), and for any body on a route that takes none (every route but the
// POSTs; before the token check); 501 UNIMPLEMENTED for a Transfer-Encoding other than one
// "chunked", 400 for one with Content-Length, two of them or one in HTTP/1.0; 400
// INVALID_ARGUMENT for a request httplib cannot parse; 404 NOT_FOUND for an unknown path (404 and
// 405 answered before httplib would read the request's body). Only the POST routes ever read a
// body, at most `max_body_bytes` of it. On a GatewayServer (gateway_server.h), a header
// section over its limits (field count, total bytes, one line over 8192 bytes) is 431
// INVALID_ARGUMENT naming the limit (414 for a request line over 8192 bytes), answered before
// the token check, and the connection is closed. Two Authorization (or Host) headers are 400 INVALID_ARGUMENT naming the header,
// before the token check. The other POSTs need no body and no Content-Length (curl -XPOST).
// 400 INVALID_ARGUMENT, and the connection closed, for a request whose length is ambiguous
// (RFC 9112 section 6.3): Content-Length headers that differ, or one that is not a decimal
// number. A request with a body that is refused before the body is read (401, 403, 413, a query
// parameter that is not UTF-8) has its connection closed after the answer, so that the body is
// never parsed as the next request. 400 INVALID_ARGUMENT naming the parameter for a query
// parameter (name or value) that
// is not UTF-8 once percent-decoded, and for a JSON body that is not UTF-8. Request bytes quoted
// in an error message (a path, a Range header) show each byte that is not UTF-8 as \xff. An
// exception in a handler is 500 INTERNAL; none reaches httplib's threads (it would end the
// process).
//
// Authentication: the request's `Authorization` header is forwarded as the RPC's `authorization`
// metadata, so the service authenticates the caller and scopes it to its tenant (401 for
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 for another tenant's job). With `auth` set the
// gateway also checks the token itself before calling a service: 401 without a known token on
// every /v1/ path but /v1/openapi.json, 403 for a user token on the admin routes (nodes,
// checkpoints).
//
// Metrics (with `registry`): loom_gateway_requests_total{route,method,code} and the histogram
// loom_gateway_request_duration_seconds{route,method}, where route is the template above
// ("/v1/jobs/{id}:watch"), or "unmatched" for a path no route serves; every route and method
// starts at 0 with the common codes (gateway.cc), so that increase() counts first requests.
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>

#include "absl/time/time.h"
#include "common/auth.h"
#include "proto/admin_service.grpc.pb.h"
#include "proto/checkpoint_service.grpc.pb.h"
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
  // If set, Register adds loom_gateway_requests_total and loom_gateway_request_duration_seconds
  // (above) here. Must outlive the server.
  prometheus::Registry* registry = nullptr;
  // The scheduler's AdminService (queues, nodes); null = those routes answer 501 UNIMPLEMENTED.
  // Must outlive the server.
  loom::v1::AdminService::StubInterface* admin = nullptr;
  // loom-checkpoint; null = the checkpoint routes answer 501 UNIMPLEMENTED. Must outlive the
  // server.
  loom::v1::CheckpointService::StubInterface* checkpoints = nullptr;
  // How often a quiet :watch stream sends a ": keep-alive" comment (> 0).
  absl::Duration sse_keepalive = absl::Seconds(15);
  // How often a quiet followed log stream checks that its client is still connected (> 0): a
  // client that left frees its gateway thread within about this time.
  absl::Duration follow_probe = absl::Seconds(1);
  // If set, /v1/ requests need a bearer token known to it (401 otherwise; 403 for a user token
  // on an admin route). Must outlive the server.
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

// The default size of the pool of threads serving HTTP requests (loom-gateway --http_threads):
// max(8, 2 x the hardware threads). Each open :watch or followed log stream holds one.
int DefaultHttpThreads();
// Makes `server` serve its requests on a pool of `threads` threads (>= 1) instead of httplib's
// default (max(8, hardware threads - 1)). Call before listening.
void SetHttpThreads(httplib::Server& server, int threads);

// Routes the REST API onto `stub` (and options.admin, options.checkpoints). Thread-safe (httplib
// runs handlers on a thread pool; gRPC stubs are thread-safe). `stub` must outlive the server
// the routes are registered on.
class JobGateway {
 public:
  JobGateway(loom::v1::JobService::StubInterface* stub, GatewayOptions options);
  void Register(httplib::Server& server);

 private:
  // gateway_watch.cc, gateway_logs.cc, gateway_checkpoint_routes.cc, gateway_admin_routes.cc.
  void RegisterExplainAndWatch(httplib::Server& server);
  void RegisterLogs(httplib::Server& server);
  void RegisterMetrics(httplib::Server& server);
  // POST /v1/jobs/{id}:resume (gateway_resume.cc).
  void RegisterResume(httplib::Server& server);
  void RegisterCheckpointRoutes(httplib::Server& server);
  void RegisterAdminRoutes(httplib::Server& server);

  loom::v1::JobService::StubInterface* stub_;
  const GatewayOptions options_;
};

}  // namespace loom::gateway

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_H_
