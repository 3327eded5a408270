#include "scheduler/scheduler_metrics.h"

#include "common/accelerator_kind.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cctype>
#include <set>
#include <string>

#include "scheduler/job_state.h"

namespace loom {
namespace {

constexpr const char* kAdmissionResults[] = {"admitted",   "no_capacity", "quota",
                                             "infeasible", "blocked",     "preempting"};

}  // namespace

SchedulerMetrics::SchedulerMetrics(prometheus::Registry& registry) {
  auto& jobs = prometheus::BuildGauge()
                   .Name("loom_jobs")
                   .Help("Jobs known to the scheduler, by phase.")
                   .Register(registry);
  for (loom::v1::JobPhase phase : AllJobPhases()) {
    jobs_by_phase_[phase] = &jobs.Add({{"phase", std::string(JobPhaseName(phase))}});
  }
  submitted_ = &prometheus::BuildCounter()
                    .Name("loom_jobs_submitted_total")
                    .Help("Jobs accepted by SubmitJob.")
                    .Register(registry)
                    .Add({});
  transitions_family_ = &prometheus::BuildCounter()
                             .Name("loom_job_phase_transitions_total")
                             .Help("Job phase changes, by source and destination phase.")
                             .Register(registry);
  // Every edge of the state machine exists from the start, at 0: a series born at its first
  // event would hide that event from increase() and rate() (issue 53).
  for (const auto& [from, to] : AllowedTransitions()) {
    transitions_[{from, to}] = &transitions_family_->Add(
        {{"from", std::string(JobPhaseName(from))}, {"to", std::string(JobPhaseName(to))}});
  }
  prometheus::BuildGauge()
      .Name("loom_scheduler_start_time_seconds")
      .Help("Unix time this scheduler process started (registered its metrics).")
      .Register(registry)
      .Add({})
      .SetToCurrentTime();
  auto& nodes = prometheus::BuildGauge()
                    .Name("loom_nodes")
                    .Help("Registered worker nodes, by liveness.")
                    .Register(registry);
  nodes_live_ = &nodes.Add({{"state", "live"}});
  nodes_lost_ = &nodes.Add({{"state", "lost"}});
  cycle_seconds_ = &prometheus::BuildHistogram()
                        .Name("loom_scheduling_cycle_seconds")
                        .Help("Wall time of one scheduling cycle (liveness check + placement).")
                        .Register(registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{
                                     0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05, 0.1, 0.25, 0.5, 1.0});
  submission_commits_ = &prometheus::BuildCounter()
                            .Name("loom_submission_commits_total")
                            .Help("Group commits of submitted jobs (one transaction and fsync each).")
                            .Register(registry)
                            .Add({});
  submission_commit_jobs_ = &prometheus::BuildHistogram()
                                .Name("loom_submission_commit_jobs")
                                .Help("Submitted jobs stored per group commit.")
                                .Register(registry)
                                .Add({}, prometheus::Histogram::BucketBoundaries{
                                             1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096});
  queue_wait_seconds_ = &prometheus::BuildHistogram()
                             .Name("loom_job_queue_wait_seconds")
                             .Help("Time from submission to placement of a job (leaving PENDING).")
                             .Register(registry)
                             .Add({}, prometheus::Histogram::BucketBoundaries{
                                          0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15,
                                          30, 60, 120, 300, 600, 1800, 3600, 7200, 21600,
                                          86400});
  auto& slots = prometheus::BuildGauge()
                    .Name("loom_rank_slots")
                    .Help("Rank slots on live worker nodes, by state.")
                    .Register(registry);
  slots_free_ = &slots.Add({{"state", "free"}});
  slots_used_ = &slots.Add({{"state", "used"}});
  slots_cordoned_ = &slots.Add({{"state", "cordoned"}});
  tenant_jobs_family_ = &prometheus::BuildGauge()
                             .Name("loom_tenant_jobs")
                             .Help("Jobs by tenant, queue and phase.")
                             .Register(registry);
  admission_family_ = &prometheus::BuildCounter()
                           .Name("loom_admission_attempts_total")
                           .Help("Attempts to admit a pending job, by result: admitted, "
                                 "no_capacity, quota, infeasible, blocked, preempting.")
                           .Register(registry);
  // Counters kept, not looked up per attempt: Family::Add hashes the labels under the family's
  // lock, and a full admission pass counts one attempt per waiting job.
  for (const char* r : kAdmissionResults) {
    admission_counters_.emplace(r, &admission_family_->Add({{"result", r}}));
  }
  admission_other_ = &admission_family_->Add({{"result", "other"}});
  accelerators_family_ = &prometheus::BuildGauge()
                              .Name("loom_accelerators")
                              .Help("Accelerators (rank slots) of registered nodes, by kind and "
                                    "state: free, allocated, cordoned, lost.")
                              .Register(registry);
  restarts_family_ = &prometheus::BuildCounter()
                          .Name("loom_job_restarts_total")
                          .Help("New attempts of jobs after a failure, by cause (failure class).")
                          .Register(registry);
  for (const char* c : {"user", "infra", "setup", "oom", "preemption", "other"}) {
    restarts_family_->Add({{"cause", c}});
  }
}

void SchedulerMetrics::SetTenantJobCounts(
    const std::map<std::tuple<std::string, std::string, loom::v1::JobPhase>, int>& counts) {
  absl::MutexLock l(&mu_);
  for (auto& [key, gauge] : tenant_jobs_) {
    if (counts.count(key) == 0) gauge->Set(0);
  }
  for (const auto& [key, n] : counts) {
    auto it = tenant_jobs_.find(key);
    if (it == tenant_jobs_.end()) {
      const auto& [tenant, queue, phase] = key;
      prometheus::Gauge* g = &tenant_jobs_family_->Add(
          {{"tenant", tenant}, {"queue", queue}, {"phase", std::string(JobPhaseName(phase))}});
      it = tenant_jobs_.emplace(key, g).first;
    }
    it->second->Set(n);
  }
}

void SchedulerMetrics::AdmissionAttempts(const std::string& result, int64_t count) {
  auto it = admission_counters_.find(result);
  (it == admission_counters_.end() ? admission_other_ : it->second)
      ->Increment(static_cast<double>(count));
}

void SchedulerMetrics::SetAccelerators(
    const std::map<std::pair<loom::v1::AcceleratorKind, std::string>, int>& counts) {
  absl::MutexLock lock(&mu_);
  if (accelerators_set_ && counts == last_accelerators_) return;
  accelerators_set_ = true;
  last_accelerators_ = counts;
  std::set<loom::v1::AcceleratorKind> kinds;
  for (const auto& [key, n] : counts) kinds.insert(key.first);
  for (loom::v1::AcceleratorKind kind : kinds) {
    const std::string name = AcceleratorKindName(kind);
    for (const char* state : {"free", "allocated", "cordoned", "lost"}) {
      auto it = counts.find({kind, state});
      accelerators_family_->Add({{"kind", name}, {"state", state}})
          .Set(it == counts.end() ? 0 : it->second);
    }
  }
}

void SchedulerMetrics::JobRestarted(loom::v1::FailureClass cause) {
  const char* name = "other";
  switch (cause) {
    case loom::v1::FAILURE_CLASS_USER: name = "user"; break;
    case loom::v1::FAILURE_CLASS_INFRA: name = "infra"; break;
    case loom::v1::FAILURE_CLASS_SETUP: name = "setup"; break;
    case loom::v1::FAILURE_CLASS_OOM: name = "oom"; break;
    case loom::v1::FAILURE_CLASS_PREEMPTED: name = "preemption"; break;
    default: break;
  }
  restarts_family_->Add({{"cause", name}}).Increment();
}

void SchedulerMetrics::SetJobCounts(const std::map<loom::v1::JobPhase, int>& counts) {
  for (auto& [phase, gauge] : jobs_by_phase_) {
    auto it = counts.find(phase);
    gauge->Set(it == counts.end() ? 0 : it->second);
  }
}

void SchedulerMetrics::JobSubmitted() { submitted_->Increment(); }

void SchedulerMetrics::PhaseTransition(loom::v1::JobPhase from, loom::v1::JobPhase to) {
  auto it = transitions_.find({from, to});
  if (it != transitions_.end()) {
    it->second->Increment();
    return;
  }
  // Not an edge of the table (a caller bypassing Transition()): still counted. Family::Add is
  // thread-safe and returns the existing series for known labels.
  transitions_family_
      ->Add({{"from", std::string(JobPhaseName(from))}, {"to", std::string(JobPhaseName(to))}})
      .Increment();
}

void SchedulerMetrics::ObserveQueueWait(absl::Duration wait) {
  queue_wait_seconds_->Observe(absl::ToDoubleSeconds(wait));
}

void SchedulerMetrics::SetNodes(int live, int lost) {
  nodes_live_->Set(live);
  nodes_lost_->Set(lost);
}

void SchedulerMetrics::ObserveSchedulingCycle(absl::Duration duration) {
  cycle_seconds_->Observe(absl::ToDoubleSeconds(duration));
}

void SchedulerMetrics::SetRankSlots(int free, int used, int cordoned) {
  slots_free_->Set(free);
  slots_used_->Set(used);
  slots_cordoned_->Set(cordoned);
}

void SchedulerMetrics::SubmissionsCommitted(int64_t jobs) {
  submission_commits_->Increment();
  submission_commit_jobs_->Observe(static_cast<double>(jobs));
}

}  // namespace loom
