#include "common/daemon.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom {

absl::Status AnnounceReady(const ReadyInfo& info, const std::string& ready_file) {
  std::printf("LOOM_READY %s grpc=%s metrics=%s%s%s\n", info.name.c_str(),
              info.grpc_address.empty() ? "-" : info.grpc_address.c_str(),
              info.metrics_url.c_str(), info.http_url.empty() ? "" : " http=",
              info.http_url.c_str());
  std::fflush(stdout);
  if (ready_file.empty()) return absl::OkStatus();
  nlohmann::json j = {{"name", info.name},
                      {"grpc_address", info.grpc_address},
                      {"metrics_url", info.metrics_url},
                      {"http_url", info.http_url},
                      {"pid", static_cast<int64_t>(::getpid())}};
  return WriteFileAtomically(ready_file, j.dump());
}

absl::StatusOr<ReadyInfo> ReadReadyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name")) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a Loom ready file"));
  }
  ReadyInfo info;
  info.name = j.value("name", "");
  info.grpc_address = j.value("grpc_address", "");
  info.metrics_url = j.value("metrics_url", "");
  info.http_url = j.value("http_url", "");
  return info;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
    ReadyCheck ready) {
  std::unique_ptr<MetricsEndpoint> ep(new MetricsEndpoint());
  ep->registry_ = std::move(registry);
  ep->ready_ = std::move(ready);
  ep->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let two daemons
  // share a fixed --metrics_port silently.
  ep->server_->set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  MetricsEndpoint* self = ep.get();
  ep->server_->Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, self->registry_->Collect());
    res.set_content(out.str(), "text/plain; version=0.0.4; charset=utf-8");
  });
  ep->server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  ep->server_->Get("/readyz", [self](const httplib::Request&, httplib::Response& res) {
    absl::Status s = self->Ready();
    if (s.ok()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content(absl::StrCat("not ready: ", s.message(), "\n"), "text/plain");
    }
  });
  int bound = port;
  bool ok = port == 0 ? (bound = ep->server_->bind_to_any_port(host)) > 0
                      : ep->server_->bind_to_port(host, port);
  if (!ok) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", host, ":", port, " (address in use?)"));
  }
  ep->host_ = host;
  ep->port_ = bound;
  ep->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  // stop() before the listen loop runs would be lost (and the destructor would hang).
  while (!ep->server_->is_running()) absl::SleepFor(absl::Milliseconds(1));
  return ep;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsEndpoint::SetReadyCheck(ReadyCheck ready) {
  absl::MutexLock l(&mu_);
  ready_ = std::move(ready);
}

absl::Status MetricsEndpoint::Ready() const {
  ReadyCheck check;
  {
    absl::MutexLock l(&mu_);
    check = ready_;
  }
  return check ? check() : absl::OkStatus();
}

std::string MetricsEndpoint::url() const {
  return absl::StrCat("http://", host_, ":", port_, "/metrics");
}
std::string MetricsEndpoint::health_url() const {
  return absl::StrCat("http://", host_, ":", port_, "/healthz");
}
std::string MetricsEndpoint::ready_url() const {
  return absl::StrCat("http://", host_, ":", port_, "/readyz");
}

}  // namespace loom
