// File: scheduler/scheduler_metrics.h
//
// The scheduler's Prometheus metrics, built once from an injected registry (docs/design/STYLE.md
// habit 17; names follow docs/design/CONTROL-PLANE.md §2.8: `loom_` prefix, `_total` counters, base
// units, bounded labels, never a job id):
//   loom_jobs{phase}                          gauge: jobs per phase (every phase always present)
//   loom_jobs_submitted_total                 counter: accepted SubmitJob calls
//   loom_job_phase_transitions_total{from,to} counter: phase changes ("UNSPECIFIED" on submit);
//                                             every allowed edge (job_state.h) exported at 0 from
//                                             the start, so increase() counts the first event
//   loom_nodes{state="live|lost"}             gauge: registered worker nodes
//   loom_scheduling_cycle_seconds             histogram: duration of one scheduling cycle
//   loom_rank_slots{state="free|used|cordoned"} gauge: rank slots on live nodes (cordoned: free
//                                             slots of cordoned or draining nodes, not free)
//   loom_job_queue_wait_seconds               histogram: submission to placement (a job leaving
//                                             PENDING for anything but CANCELLED); buckets from
//                                             10 ms to 1 day
//   loom_tenant_jobs{tenant,queue,phase}      gauge: jobs per tenant, queue and phase (tenants come
//                                             from the tokens file, queues from the queue config:
//                                             bounded); a combination seen once stays, at 0
//   loom_admission_attempts_total{result}     counter: one per pending job per scheduling cycle
//                                             that tried to place it: admitted | no_capacity (not
//                                             enough free slots now) | quota (tenant/queue quota
//                                             reached) | infeasible (can never fit the live
//                                             cluster) | blocked (behind a higher-priority job of
//                                             the same kind) | preempting (admitted by preempting)
//   loom_accelerators{kind,state}             gauge: accelerators (rank slots) by kind and state:
//                                             free | allocated (a rank holds it) | cordoned (on a
//                                             node an operator cordoned) | lost (on a lost node)
//   loom_job_restarts_total{cause}            counter: new attempts after a failure, by failure
//                                             class: user | infra | setup | oom | preemption |
//                                             other
//   loom_scheduler_start_time_seconds         gauge: Unix time this scheduler process built its
//                                             metrics (alert rules that look back over a window
//                                             wait until the process has lived that long)
//   loom_submission_commits_total             counter: group commits of submitted jobs (one
//                                             SQLite transaction and fsync each)
//   loom_submission_commit_jobs               histogram: jobs per such commit (the group commit's
//                                             batch size; JobRepository)
#ifndef LOOM_SCHEDULER_SCHEDULER_METRICS_H_
#define LOOM_SCHEDULER_SCHEDULER_METRICS_H_

#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/common.pb.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace loom {

// Thread-safe. `registry` must outlive this object.
class SchedulerMetrics {
 public:
  explicit SchedulerMetrics(prometheus::Registry& registry);
  SchedulerMetrics(const SchedulerMetrics&) = delete;
  SchedulerMetrics& operator=(const SchedulerMetrics&) = delete;

  // Sets loom_jobs{phase} for every phase; phases missing from `counts` are set to 0.
  void SetJobCounts(const std::map<loom::v1::JobPhase, int>& counts);
  void JobSubmitted();
  void PhaseTransition(loom::v1::JobPhase from, loom::v1::JobPhase to);
  // A job left the queue after waiting `wait` since its submission.
  void ObserveQueueWait(absl::Duration wait);
  void SetNodes(int live, int lost);
  void ObserveSchedulingCycle(absl::Duration duration);
  void SetRankSlots(int free, int used, int cordoned);

  // Sets loom_tenant_jobs from (tenant, queue, phase) -> count; earlier combinations missing
  // from `counts` are set to 0.
  void SetTenantJobCounts(
      const std::map<std::tuple<std::string, std::string, loom::v1::JobPhase>, int>& counts);
  // `count` admission attempts with `result` (one of the values listed above; others count as
  // "other"). `count` >= 0.
  void AdmissionAttempts(const std::string& result, int64_t count);
  // Sets loom_accelerators from (kind, state) -> count; every state of every kind in `counts`
  // is set (missing states 0).
  void SetAccelerators(const std::map<std::pair<loom::v1::AcceleratorKind, std::string>, int>& counts);
  // A job starts a new attempt after a failure of class `cause` (PREEMPTED -> "preemption").
  void JobRestarted(loom::v1::FailureClass cause);
  // One group commit that durably stored `jobs` (>= 1) submitted jobs.
  void SubmissionsCommitted(int64_t jobs);

 private:
  // Immutable after construction (the series themselves are thread-safe).
  prometheus::Counter* submitted_;
  prometheus::Family<prometheus::Counter>* transitions_family_;
  std::map<std::pair<loom::v1::JobPhase, loom::v1::JobPhase>, prometheus::Counter*> transitions_;
  prometheus::Gauge* nodes_live_;
  prometheus::Gauge* nodes_lost_;
  prometheus::Histogram* cycle_seconds_;
  prometheus::Histogram* queue_wait_seconds_;
  prometheus::Gauge* slots_free_;
  prometheus::Gauge* slots_used_;
  prometheus::Gauge* slots_cordoned_;
  std::map<loom::v1::JobPhase, prometheus::Gauge*> jobs_by_phase_;
  prometheus::Family<prometheus::Gauge>* tenant_jobs_family_;
  prometheus::Family<prometheus::Counter>* admission_family_;
  std::map<std::string, prometheus::Counter*, std::less<>> admission_counters_;  // by result
  prometheus::Counter* admission_other_;
  prometheus::Family<prometheus::Gauge>* accelerators_family_;
  prometheus::Family<prometheus::Counter>* restarts_family_;
  prometheus::Counter* submission_commits_;
  prometheus::Histogram* submission_commit_jobs_;
  absl::Mutex mu_;
  std::map<std::tuple<std::string, std::string, loom::v1::JobPhase>, prometheus::Gauge*>
      tenant_jobs_ ABSL_GUARDED_BY(mu_);
  // The counts SetAccelerators last set: an unchanged call (most heartbeats) costs a map
  // comparison instead of four label lookups per kind in the family.
  std::map<std::pair<loom::v1::AcceleratorKind, std::string>, int> last_accelerators_
      ABSL_GUARDED_BY(mu_);
  bool accelerators_set_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace loom

#endif  // LOOM_SCHEDULER_SCHEDULER_METRICS_H_
