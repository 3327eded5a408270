#include "common/daemon.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom {

absl::Status AnnounceReady(const ReadyInfo& info, const std::string& ready_file) {
  std::printf("LOOM_READY %s grpc=%s metrics=%s\n", info.name.c_str(),
              info.grpc_address.empty() ? "-" : info.grpc_address.c_str(),
              info.metrics_url.c_str());
  std::fflush(stdout);
  if (ready_file.empty()) return absl::OkStatus();
  nlohmann::json j = {{"name", info.name},
                      {"grpc_address", info.grpc_address},
                      {"metrics_url", info.metrics_url},
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
  return info;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsEndpoint> ep(new MetricsEndpoint());
  try {
    ep->exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", host, ":", port, ": ", e.what()));
  }
  ep->exposer_->RegisterCollectable(registry);
  std::vector<int> ports = ep->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::InternalError("metrics exposer reports no listening port");
  ep->host_ = host;
  ep->port_ = ports.front();
  return ep;
}

MetricsEndpoint::~MetricsEndpoint() = default;

std::string MetricsEndpoint::url() const {
  return absl::StrCat("http://", host_, ":", port_, "/metrics");
}

}  // namespace loom
