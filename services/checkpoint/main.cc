// loom-checkpoint: lists committed checkpoints and consolidates ZeRO-3 rank shards into
// Hugging Face model.safetensors + config.json (loom.v1.CheckpointService).
//
//   loom-checkpoint --checkpoint_root=/var/lib/loom/checkpoints [--host=127.0.0.1] [--port=0]
//                   [--metrics_port=0] [--ready_file=PATH]
//
// Prints "LOOM_READY loom-checkpoint grpc=HOST:PORT metrics=URL" once serving (common/daemon.h)
// and shuts down gracefully on SIGTERM or SIGINT.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>

#include <prometheus/registry.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/daemon.h"
#include "common/grpc_credentials.h"
#include "common/grpc_server.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "services/checkpoint/checkpoint_service.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to bind gRPC and /metrics to (0.0.0.0: every interface; then "
          "--advertise_address is required).");
ABSL_FLAG(std::string, advertise_address, "",
          "Address other hosts dial to reach this service, written to the ready line/file "
          "(default: --host)");
ABSL_FLAG(int, port, 0, "gRPC port (0 = any free port, reported on the LOOM_READY line).");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0 = any free port).");
ABSL_FLAG(std::string, ready_file, "",
          "If set, write {name, grpc_address, metrics_url, pid} JSON here once serving.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory holding one checkpoint directory per job (<root>/<job_id>). Required; "
          "created if missing.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for TLS on the gRPC port (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for TLS on the gRPC port (with --tls_cert).");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Tokens file (docs/operations.md); with it every RPC needs an admin token or "
          "--service_token_file's token. Empty = authentication off.");
ABSL_FLAG(std::string, service_token_file, "",
          "File holding the cluster's service token, which the scheduler sends (its "
          "--checkpoint_token_file); accepted with admin rights.");
ABSL_FLAG(int, shutdown_grace_seconds, 10,
          "On SIGTERM/SIGINT, how long in-flight RPCs may run before they are cancelled.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  const std::string root = absl::GetFlag(FLAGS_checkpoint_root);
  if (root.empty()) {
    LOG(ERROR) << "--checkpoint_root is required";
    return 2;
  }
  if (absl::Status s = loom::MakeDirs(root); !s.ok()) {
    LOG(ERROR) << "--checkpoint_root: " << s;
    return 2;
  }

  // Block the shutdown signals before any thread starts, so that only the waiter receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto registry = std::make_shared<prometheus::Registry>();
  loom::CheckpointServiceOptions options;
  options.checkpoint_root = root;
  std::optional<loom::TokenAuthenticator> users, service_token;
  if (const std::string f = absl::GetFlag(FLAGS_auth_tokens_file); !f.empty()) {
    auto a = loom::TokenAuthenticator::FromFile(f);
    if (!a.ok()) {
      LOG(ERROR) << "--auth_tokens_file: " << a.status();
      return 2;
    }
    users = std::move(*a);
    options.users = &*users;
  }
  {
    auto token = loom::ReadTokenFile(absl::GetFlag(FLAGS_service_token_file));
    if (!token.ok()) {
      LOG(ERROR) << "--service_token_file: " << token.status();
      return 2;
    }
    if (!token->empty()) {
      service_token = loom::TokenAuthenticator::ForToken(*token, loom::Caller{});
      options.service = &*service_token;
    }
  }
  if (options.users == nullptr && options.service == nullptr) {
    LOG(WARNING) << "authentication off (no --auth_tokens_file / --service_token_file): any "
                    "client reaching this port can read, consolidate and delete checkpoints";
  }
  loom::CheckpointServiceImpl service(options, *registry);

  const std::string host = absl::GetFlag(FLAGS_host);
  absl::StatusOr<std::string> advertised = loom::AdvertisedAddress(
      "--host", host, "--advertise_address", absl::GetFlag(FLAGS_advertise_address));
  if (!advertised.ok()) {
    LOG(ERROR) << advertised.status();
    return 2;
  }
  int port = 0;
  auto creds = loom::MakeServerCredentials(absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key));
  if (!creds.ok()) {
    LOG(ERROR) << "--tls_cert/--tls_key: " << creds.status();
    return 2;
  }
  auto server =
      loom::StartCheckpointServer(host, absl::GetFlag(FLAGS_port), &service, &port, *creds);
  if (!server.ok()) {
    LOG(ERROR) << server.status();
    return 1;
  }
  // Ready while the checkpoint root is a readable, searchable directory (e.g. the volume is
  // mounted).
  auto metrics = loom::MetricsEndpoint::Start(
      host, absl::GetFlag(FLAGS_metrics_port), registry, [root]() -> absl::Status {
        if (::access(root.c_str(), R_OK | X_OK) != 0) {
          return absl::UnavailableError(absl::StrCat("checkpoint root ", root, " not readable"));
        }
        return absl::OkStatus();
      });
  if (!metrics.ok()) {
    LOG(ERROR) << metrics.status();
    return 1;
  }
  absl::Status announced = loom::AnnounceReady(
      {"loom-checkpoint", loom::JoinHostPort(*advertised, port),
       loom::ReplaceUrlHost((*metrics)->url(), *advertised)},
      absl::GetFlag(FLAGS_ready_file));
  if (!announced.ok()) {
    LOG(ERROR) << "cannot announce readiness: " << announced;
    return 1;
  }
  LOG(INFO) << "loom-checkpoint serving " << host << ":" << port << " (advertised as "
            << loom::JoinHostPort(*advertised, port) << ") over " << root;

  grpc::Server* srv = server->get();
  const int grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  std::thread waiter([&signals, srv, grace] {
    int sig = 0;
    sigwait(&signals, &sig);
    LOG(INFO) << "signal " << sig << ": shutting down";
    loom::ShutdownGracefully(*srv, std::chrono::system_clock::now() + std::chrono::seconds(grace));
    LOG(INFO) << "gRPC server shut down";
  });
  srv->Wait();
  waiter.join();
  LOG(INFO) << "loom-checkpoint stopped";
  return 0;
}
