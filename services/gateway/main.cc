// loom-gateway: the REST/JSON gateway to loom-scheduler's JobService (services/gateway/gateway.h).
//
//   loom-gateway --scheduler=HOST:PORT [--checkpoint=HOST:PORT] [--host=127.0.0.1] [--port=8080] [--metrics_port=0]
//                [--rpc_timeout=30s] [--ready_file=PATH] [--auth_tokens_file=PATH] [--tls_ca=PEM]
//                [--reconnect_backoff_max=1s] [--http_threads=N] [--sse_keepalive=15s]
//                [--follow_probe=1s] [--max_body_bytes=4194304] [--max_header_count=100]
//                [--max_header_bytes=65536] [--header_timeout=10s] [--body_timeout=60s]
//
// Prints "LOOM_READY loom-gateway grpc=- metrics=URL http=URL" once serving HTTP on --host:--port
// (common/daemon.h) and stops on SIGTERM or SIGINT. The metrics port also serves /healthz and
// /readyz (ready = the scheduler's gRPC channel connects).
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/daemon.h"
#include "common/grpc_channel.h"
#include "common/grpc_credentials.h"
#include "common/logging.h"
#include "services/gateway/gateway.h"
#include "services/gateway/gateway_server.h"

extern const char kLoomOpenApiJson[];  // services/gateway/openapi.json, embedded by a genrule

ABSL_FLAG(std::string, scheduler, "127.0.0.1:50051", "loom-scheduler gRPC address");
ABSL_FLAG(std::string, checkpoint, "",
          "loom-checkpoint gRPC address for the /v1/jobs/{id}/checkpoints routes; empty = those "
          "routes answer 501.");
ABSL_FLAG(absl::Duration, sse_keepalive, absl::Seconds(15),
          "How often a quiet GET /v1/jobs/{id}:watch event stream sends a keep-alive comment "
          "(a client that went away is noticed within this time).");
ABSL_FLAG(absl::Duration, follow_probe, absl::Seconds(1),
          "How often a quiet GET /v1/jobs/{id}/logs?follow=true stream checks that its client "
          "is still connected (nothing is written); a client that left frees its thread within "
          "about this time.");
ABSL_FLAG(int, http_threads, 0,
          "Threads serving HTTP requests; each open :watch or followed log stream holds one "
          "while it lasts, and requests beyond them wait. 0 = max(8, 2 x hardware threads).");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind HTTP and /metrics to.");
ABSL_FLAG(int, port, 8080, "HTTP port of the REST API (0 = any free port, logged).");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = any free port).");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(30), "Deadline of each RPC to the scheduler.");
ABSL_FLAG(absl::Duration, reconnect_backoff_max, loom::kDefaultReconnectBackoffMax,
          "Longest wait between two attempts to connect to the scheduler (gRPC reconnect "
          "backoff cap), so that requests work again soon after a scheduler restart.");
ABSL_FLAG(std::string, ready_file, "", "Write {name, metrics_url} here once serving.");
ABSL_FLAG(int64_t, max_body_bytes, 4 << 20,
          "Largest request body accepted, in bytes (413 above; default 4 MiB, gRPC's default "
          "message limit at the scheduler).");
ABSL_FLAG(int64_t, max_header_count, 100,
          "Most header fields a request may carry (431 above, answered before the token check "
          "and before the headers are stored; the connection is closed).");
ABSL_FLAG(int64_t, max_header_bytes, 64 << 10,
          "Most bytes of a request's request line and headers together, CRLFs included (431 "
          "above, as --max_header_count; default 64 KiB). Any one line is limited to 8192 bytes "
          "(431; 414 for the request line), the limit compiled into cpp-httplib.");
ABSL_FLAG(absl::Duration, header_timeout, absl::Seconds(10),
          "Longest time a request may take to send its request line and headers, from its first "
          "byte (408 after it, before the token check; the connection is closed). The read "
          "timeout, 5 s, bounds only the wait for each next byte.");
ABSL_FLAG(absl::Duration, body_timeout, absl::Seconds(60),
          "Longest time a request may take to send its body once its headers are in, on the "
          "routes that read one (408 after it; the connection is closed).");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer tokens file (same format as loom-scheduler's): reject requests without a known "
          "token with 401 before calling the scheduler. The Authorization header is forwarded "
          "to the scheduler either way.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify the scheduler's (and loom-checkpoint's) TLS certificate; empty = "
          "plaintext gRPC.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto creds = loom::MakeChannelCredentials(absl::GetFlag(FLAGS_tls_ca));
  if (!creds.ok()) {
    LOG(ERROR) << "--tls_ca: " << creds.status();
    return 2;
  }
  std::unique_ptr<loom::TokenAuthenticator> auth;
  if (!absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
    auto loaded = loom::TokenAuthenticator::FromFile(absl::GetFlag(FLAGS_auth_tokens_file));
    if (!loaded.ok()) {
      LOG(ERROR) << "--auth_tokens_file: " << loaded.status();
      return 2;
    }
    auth = std::make_unique<loom::TokenAuthenticator>(std::move(*loaded));
  } else {
    LOG(WARNING) << "no --auth_tokens_file: the gateway forwards requests without checking "
                 << "tokens (the scheduler still checks them if it has authentication on)";
  }
  if (absl::Status s = loom::ValidateReconnectBackoff("--reconnect_backoff_max",
                                                      absl::GetFlag(FLAGS_reconnect_backoff_max));
      !s.ok()) {
    LOG(ERROR) << s;
    return 2;
  }
  auto channel = loom::CreateReconnectingChannel(absl::GetFlag(FLAGS_scheduler), *creds,
                                                 absl::GetFlag(FLAGS_reconnect_backoff_max));
  auto stub = loom::v1::JobService::NewStub(channel);
  auto admin = loom::v1::AdminService::NewStub(channel);
  std::unique_ptr<loom::v1::CheckpointService::Stub> checkpoints;
  if (const std::string address = absl::GetFlag(FLAGS_checkpoint); !address.empty()) {
    checkpoints = loom::v1::CheckpointService::NewStub(loom::CreateReconnectingChannel(
        address, *creds, absl::GetFlag(FLAGS_reconnect_backoff_max)));
  }
  if (absl::GetFlag(FLAGS_sse_keepalive) <= absl::ZeroDuration()) {
    LOG(ERROR) << "--sse_keepalive: must be > 0, got " << absl::GetFlag(FLAGS_sse_keepalive);
    return 2;
  }
  if (absl::GetFlag(FLAGS_follow_probe) <= absl::ZeroDuration()) {
    LOG(ERROR) << "--follow_probe: must be > 0, got " << absl::GetFlag(FLAGS_follow_probe);
    return 2;
  }
  if (absl::GetFlag(FLAGS_http_threads) < 0) {
    LOG(ERROR) << "--http_threads: must be >= 0 (0 = default), got "
               << absl::GetFlag(FLAGS_http_threads);
    return 2;
  }
  const int http_threads = absl::GetFlag(FLAGS_http_threads) == 0
                               ? loom::gateway::DefaultHttpThreads()
                               : absl::GetFlag(FLAGS_http_threads);
  auto registry = std::make_shared<prometheus::Registry>();
  loom::gateway::GatewayOptions options;
  options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  if (absl::GetFlag(FLAGS_max_body_bytes) < 1) {
    LOG(ERROR) << "--max_body_bytes: must be >= 1, got " << absl::GetFlag(FLAGS_max_body_bytes);
    return 2;
  }
  options.max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_body_bytes));
  if (absl::GetFlag(FLAGS_max_header_count) < 1 || absl::GetFlag(FLAGS_max_header_bytes) < 1) {
    LOG(ERROR) << "--max_header_count and --max_header_bytes must be >= 1, got "
               << absl::GetFlag(FLAGS_max_header_count) << " and "
               << absl::GetFlag(FLAGS_max_header_bytes);
    return 2;
  }
  loom::gateway::HeaderLimits header_limits;
  header_limits.max_count = static_cast<size_t>(absl::GetFlag(FLAGS_max_header_count));
  header_limits.max_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_header_bytes));
  header_limits.header_timeout = absl::GetFlag(FLAGS_header_timeout);
  header_limits.body_timeout = absl::GetFlag(FLAGS_body_timeout);
  if (header_limits.header_timeout < absl::Milliseconds(1) ||
      header_limits.body_timeout < absl::Milliseconds(1)) {
    LOG(ERROR) << "--header_timeout and --body_timeout must be >= 1ms, got "
               << header_limits.header_timeout << " and " << header_limits.body_timeout;
    return 2;
  }
  options.openapi_json = kLoomOpenApiJson;
  options.registry = registry.get();
  options.auth = auth.get();
  options.admin = admin.get();
  options.checkpoints = checkpoints.get();
  options.sse_keepalive = absl::GetFlag(FLAGS_sse_keepalive);
  options.follow_probe = absl::GetFlag(FLAGS_follow_probe);
  loom::gateway::JobGateway gateway(stub.get(), options);

  loom::gateway::GatewayServer server(header_limits);
  loom::gateway::SetHttpThreads(server, http_threads);
  gateway.Register(server);
  const std::string host = absl::GetFlag(FLAGS_host);
  int port = absl::GetFlag(FLAGS_port);
  bool bound = port == 0 ? (port = server.bind_to_any_port(host)) > 0 : server.bind_to_port(host, port);
  if (!bound) {
    LOG(ERROR) << "cannot bind HTTP to " << host << ":" << absl::GetFlag(FLAGS_port);
    return 1;
  }
  // Ready while the scheduler's channel connects (within 1 s per probe).
  auto metrics = loom::MetricsEndpoint::Start(
      host, absl::GetFlag(FLAGS_metrics_port), registry, [channel]() -> absl::Status {
        if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(1))) {
          return absl::UnavailableError("scheduler not reachable");
        }
        return absl::OkStatus();
      });
  if (!metrics.ok()) {
    LOG(ERROR) << metrics.status();
    return 1;
  }
  std::thread listener([&server] { server.listen_after_bind(); });
  absl::Status announced =
      loom::AnnounceReady({"loom-gateway", "", (*metrics)->url(),
                           absl::StrCat("http://", host, ":", port)},
                          absl::GetFlag(FLAGS_ready_file));
  if (!announced.ok()) {
    LOG(ERROR) << "cannot announce readiness: " << announced;
    server.stop();
    listener.join();
    return 1;
  }
  LOG(INFO) << "loom-gateway serving http://" << host << ":" << port << " for scheduler "
            << absl::GetFlag(FLAGS_scheduler) << " on " << http_threads << " HTTP threads";
  int sig = 0;
  sigwait(&signals, &sig);
  LOG(INFO) << "signal " << sig << ": shutting down";
  server.stop();
  listener.join();
  LOG(INFO) << "loom-gateway stopped";
  return 0;
}
