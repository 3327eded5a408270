// Conventions every Loom daemon follows at startup so that scripts and tests can find it:
//   * gRPC and /metrics bind port 0 unless told otherwise, and the bound ports are reported;
//   * once serving, the daemon prints one line "LOOM_READY <name> grpc=HOST:PORT metrics=URL"
//     and, if --ready_file is set, atomically writes {"name","grpc_address","metrics_url","pid"}.
#ifndef LOOM_COMMON_DAEMON_H_
#define LOOM_COMMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace loom {

struct ReadyInfo {
  std::string name;          // "loom-scheduler", ...
  std::string grpc_address;  // "127.0.0.1:41234" (empty if the daemon serves no gRPC)
  std::string metrics_url;   // "http://127.0.0.1:41235/metrics"
};

// Prints the LOOM_READY line to stdout (flushed) and writes `ready_file` if non-empty.
absl::Status AnnounceReady(const ReadyInfo& info, const std::string& ready_file);

// Parses a ready file written by AnnounceReady. NOT_FOUND if absent, INVALID_ARGUMENT if malformed.
absl::StatusOr<ReadyInfo> ReadReadyFile(const std::string& path);

// A Prometheus /metrics endpoint (prometheus-cpp Exposer) bound to `host:port` (port 0 = any),
// serving `registry`. Thread-safe.
class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();
  int port() const { return port_; }
  std::string url() const;

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;
  int port_ = 0;
};

}  // namespace loom

#endif  // LOOM_COMMON_DAEMON_H_
