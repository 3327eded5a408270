// Prometheus metrics of a worker daemon and of the trainer ranks it runs. Built once from an
// injected registry. Labels are bounded: rank (< slots) and state; never a job id.
#ifndef LOOM_WORKER_WORKER_METRICS_H_
#define LOOM_WORKER_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "proto/worker_service.pb.h"

namespace loom::worker {

// Thread-safe (prometheus-cpp metrics are atomic).
class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void RecordHeartbeat(bool ok);
  // Updates the ranks-by-state gauge and the per-rank trainer gauges.
  void RecordRanks(const std::vector<loom::v1::RankStatus>& ranks, int slots);

 private:
  prometheus::Family<prometheus::Counter>& heartbeats_;
  prometheus::Family<prometheus::Gauge>& ranks_;
  prometheus::Family<prometheus::Gauge>& slots_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& eval_loss_;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_WORKER_METRICS_H_
