#include "tests/testing/prometheus.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_util.h"

namespace loom::testing {

using json = nlohmann::json;

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string HostPort(const std::string& url) {
  std::string rest = url.substr(url.find("://") == std::string::npos ? 0 : url.find("://") + 3);
  return rest.substr(0, rest.find('/'));
}

std::string PromTime(double unix_seconds) { return absl::StrFormat("%.3f", unix_seconds); }

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& dir, const std::vector<ScrapeJob>& jobs,
    const std::vector<std::string>& rule_files, absl::Duration interval) {
  const int port = FreePort();
  if (port <= 0) return absl::UnavailableError("no free port for Prometheus");
  const std::string every = absl::StrCat(absl::ToInt64Milliseconds(interval), "ms");
  std::string config = absl::StrCat("global:\n  scrape_interval: ", every,
                                    "\n  evaluation_interval: ", every, "\n");
  if (!rule_files.empty()) {
    absl::StrAppend(&config, "rule_files:\n");
    for (const std::string& f : rule_files) absl::StrAppend(&config, "  - ", f, "\n");
  }
  absl::StrAppend(&config, "scrape_configs:\n");
  for (const ScrapeJob& j : jobs) {
    absl::StrAppend(&config, "  - job_name: ", j.job, "\n    static_configs:\n      - targets: ['",
                    absl::StrJoin(j.targets, "', '"), "']\n");
  }
  const std::string config_path = absl::StrCat(dir, "/prometheus.yml");
  if (absl::Status s = WriteFileAtomically(config_path, config); !s.ok()) return s;
  auto p = Subprocess::Start(
      {"/usr/bin/prometheus", absl::StrCat("--config.file=", config_path),
       absl::StrCat("--storage.tsdb.path=", dir, "/prometheus-data"),
       absl::StrCat("--web.listen-address=127.0.0.1:", port)},
      absl::StrCat(dir, "/prometheus.log"));
  if (!p.ok()) return p.status();
  std::unique_ptr<PrometheusServer> server(
      new PrometheusServer(port, std::make_unique<Subprocess>(std::move(*p))));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (HttpGet(absl::StrCat("http://127.0.0.1:", port, "/-/ready")).ok()) return server;
    if (!server->process_->Running()) {
      return absl::UnavailableError(
          absl::StrCat("prometheus exited:\n", Tail(server->process_->log_path())));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("prometheus not ready after 30 s:\n", Tail(server->process_->log_path())));
}

absl::StatusOr<json> PrometheusServer::Api(
    const std::string& endpoint, const std::vector<std::pair<std::string, std::string>>& params) {
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(30);
  httplib::Params p;
  for (const auto& [k, v] : params) p.emplace(k, v);
  // GET: every endpoint takes it (label values only GET); the queries stay far below URL limits.
  auto res = client.Get(absl::StrCat("/api/v1/", endpoint).c_str(), p, httplib::Headers());
  if (!res) return absl::UnavailableError(absl::StrCat("GET /api/v1/", endpoint, " failed"));
  json body = json::parse(res->body, nullptr, false);
  if (!body.is_object() || body.value("status", "") != "success") {
    return absl::InvalidArgumentError(
        absl::StrCat("/api/v1/", endpoint, " (", absl::StrJoin(params, ", ",
                                                              absl::PairFormatter("=")),
                     "): HTTP ", res->status, ": ", res->body.substr(0, 2000)));
  }
  return body["data"];
}

absl::StatusOr<json> PrometheusServer::Query(const std::string& promql,
                                             std::optional<double> time) {
  std::vector<std::pair<std::string, std::string>> params = {{"query", promql}};
  if (time.has_value()) params.emplace_back("time", PromTime(*time));
  absl::StatusOr<json> data = Api("query", params);
  if (!data.ok()) return data.status();
  return (*data)["result"];
}

absl::StatusOr<std::vector<PromSample>> PrometheusServer::Samples(const std::string& promql,
                                                                  std::optional<double> time) {
  std::vector<std::pair<std::string, std::string>> params = {{"query", promql}};
  if (time.has_value()) params.emplace_back("time", PromTime(*time));
  absl::StatusOr<json> data = Api("query", params);
  if (!data.ok()) return data.status();
  const std::string type = data->value("resultType", "");
  const json& result = (*data)["result"];
  std::vector<PromSample> out;
  auto point = [](const json& pair, PromSample* s) {
    s->time = pair[0].get<double>();
    s->value = std::strtod(pair[1].get<std::string>().c_str(), nullptr);
  };
  if (type == "scalar") {
    PromSample s;
    point(result, &s);
    out.push_back(s);
    return out;
  }
  if (type != "vector" && type != "matrix") {
    return absl::InvalidArgumentError(absl::StrCat(promql, ": answer of type ", type));
  }
  for (const json& series : result) {
    PromSample base;
    for (const auto& [k, v] : series["metric"].items()) base.labels[k] = v.get<std::string>();
    if (type == "vector") {
      point(series["value"], &base);
      out.push_back(base);
    } else {
      for (const json& pair : series["values"]) {
        PromSample s = base;
        point(pair, &s);
        out.push_back(s);
      }
    }
  }
  return out;
}

absl::StatusOr<json> PrometheusServer::QueryRange(const std::string& promql, double start,
                                                  double end, double step) {
  absl::StatusOr<json> data = Api("query_range", {{"query", promql},
                                                  {"start", PromTime(start)},
                                                  {"end", PromTime(end)},
                                                  {"step", absl::StrFormat("%.3f", step)}});
  if (!data.ok()) return data.status();
  return (*data)["result"];
}

}  // namespace loom::testing
