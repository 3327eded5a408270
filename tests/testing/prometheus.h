// Test support: a real Prometheus (Debian's /usr/bin/prometheus) started as a child process on a
// free loopback port, scraping the given targets with the given rule files, and its HTTP API
// (/api/v1/...) for the test's queries. Used by the observability tests
// (tests/observability/prometheus_scrape_test.cc, dashboards_truth_test.cc).
#ifndef LOOM_TESTS_TESTING_PROMETHEUS_H_
#define LOOM_TESTS_TESTING_PROMETHEUS_H_

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace loom::testing {

// A TCP port that was free a moment ago (bind port 0 on loopback, read it back, close); -1 if
// none could be bound.
int FreePort();

// "http://127.0.0.1:1234/metrics" -> "127.0.0.1:1234".
std::string HostPort(const std::string& url);

// One scrape job of the Prometheus configuration: its `job` label and "host:port" targets.
struct ScrapeJob {
  std::string job;
  std::vector<std::string> targets;
};

// One sample of an instant-vector answer: the series' labels (with __name__ when it has one)
// and its value at the evaluation time.
struct PromSample {
  std::map<std::string, std::string> labels;
  double value = 0;
  double time = 0;  // Unix seconds of the evaluation (or of the raw sample for range selectors)
};

class PrometheusServer {
 public:
  // Writes <dir>/prometheus.yml (scrape and evaluation every `interval`, the `jobs`, the
  // `rule_files`), starts Prometheus with its TSDB under <dir>/prometheus-data and its log in
  // <dir>/prometheus.log, and waits (up to 30 s) until /-/ready answers.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const std::vector<ScrapeJob>& jobs,
      const std::vector<std::string>& rule_files, absl::Duration interval = absl::Seconds(1));

  // GET /api/v1/<endpoint>?<params>: the "data" member of a "success" answer; an error (with
  // Prometheus' own error text) otherwise.
  absl::StatusOr<nlohmann::json> Api(const std::string& endpoint,
                                     const std::vector<std::pair<std::string, std::string>>& params = {});
  // /api/v1/query of `promql` (at Unix time `time` when given): the "result" member.
  absl::StatusOr<nlohmann::json> Query(const std::string& promql, std::optional<double> time = {});
  // The instant-vector (or scalar) answer of `promql` as samples; a matrix answer (a range
  // selector) as one sample per raw point. An error for a string answer.
  absl::StatusOr<std::vector<PromSample>> Samples(const std::string& promql,
                                                  std::optional<double> time = {});
  // /api/v1/query_range of `promql` from `start` to `end` every `step` seconds: the "result".
  absl::StatusOr<nlohmann::json> QueryRange(const std::string& promql, double start, double end,
                                            double step);

  int port() const { return port_; }
  const std::string& log_path() const { return process_->log_path(); }
  Subprocess& process() { return *process_; }

 private:
  PrometheusServer(int port, std::unique_ptr<Subprocess> process)
      : port_(port), process_(std::move(process)) {}
  int port_;
  std::unique_ptr<Subprocess> process_;
};

// "1712345678.123" (millisecond precision, as Prometheus' API accepts and answers).
std::string PromTime(double unix_seconds);

}  // namespace loom::testing

#endif  // LOOM_TESTS_TESTING_PROMETHEUS_H_
