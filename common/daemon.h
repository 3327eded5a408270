// Conventions every Loom daemon follows at startup so that scripts and tests can find it:
//   * gRPC and /metrics bind port 0 unless told otherwise, and the bound ports are reported;
//   * once serving, the daemon prints one line "LOOM_READY <name> grpc=HOST:PORT metrics=URL"
//     and, if --ready_file is set, atomically writes {"name","grpc_address","metrics_url","pid"};
//   * the metrics port also answers /healthz and /readyz (MetricsEndpoint).
#ifndef LOOM_COMMON_DAEMON_H_
#define LOOM_COMMON_DAEMON_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace loom {

struct ReadyInfo {
  std::string name;          // "loom-scheduler", ...
  std::string grpc_address;  // "127.0.0.1:41234" (empty if the daemon serves no gRPC)
  std::string metrics_url;   // "http://127.0.0.1:41235/metrics"
  std::string http_url;      // an HTTP API's base, "http://127.0.0.1:8080" (gateway; else empty)
};

// Prints the LOOM_READY line to stdout (flushed) and writes `ready_file` if non-empty.
absl::Status AnnounceReady(const ReadyInfo& info, const std::string& ready_file);

// Parses a ready file written by AnnounceReady. NOT_FOUND if absent, INVALID_ARGUMENT if malformed.
absl::StatusOr<ReadyInfo> ReadReadyFile(const std::string& path);

// The HTTP side of a daemon, on one port (cpp-httplib; prometheus-cpp's Exposer serves only
// /metrics):
//   GET /metrics  the registry in the Prometheus text format 0.0.4 (TextSerializer over Collect())
//   GET /healthz  200 "ok": the process is alive and its HTTP thread answers (Kubernetes
//                 livenessProbe)
//   GET /readyz   200 "ok" when the readiness check returns OK, else 503 with the check's message
//                 (Kubernetes readinessProbe; what "ready" means is the daemon's: see
//                 docs/operations.md). Without a check the endpoint is ready.
// Bound to `host:port` (port 0 = any free port). Thread-safe.
class MetricsEndpoint {
 public:
  using ReadyCheck = std::function<absl::Status()>;

  // UNAVAILABLE if `host:port` cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
      ReadyCheck ready = nullptr);
  ~MetricsEndpoint();  // stops the server and joins its thread

  // Replaces the readiness check (e.g. once the daemon knows what it waits for).
  void SetReadyCheck(ReadyCheck ready);

  int port() const { return port_; }
  std::string url() const;          // "http://HOST:PORT/metrics"
  std::string health_url() const;   // "http://HOST:PORT/healthz"
  std::string ready_url() const;    // "http://HOST:PORT/readyz"

 private:
  MetricsEndpoint() = default;
  absl::Status Ready() const;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  ReadyCheck ready_ ABSL_GUARDED_BY(mu_);
  std::string host_;
  int port_ = 0;
};

}  // namespace loom

#endif  // LOOM_COMMON_DAEMON_H_
