#include "scheduler/scheduler_metrics.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <string>

#include "absl/time/clock.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

std::string Text(prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

void ExpectLine(const std::string& text, const std::string& line) {
  EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << " missing:\n" << text;
}

TEST(SchedulerMetricsTest, TenantJobsKeepSeenCombinationsAtZero) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  m.SetTenantJobCounts({{{"team-a", "default", loom::v1::JOB_PHASE_PENDING}, 2},
                        {{"team-b", "batch", loom::v1::JOB_PHASE_RUNNING}, 1}});
  std::string t = Text(registry);
  ExpectLine(t, "loom_tenant_jobs{phase=\"PENDING\",queue=\"default\",tenant=\"team-a\"} 2");
  ExpectLine(t, "loom_tenant_jobs{phase=\"RUNNING\",queue=\"batch\",tenant=\"team-b\"} 1");
  m.SetTenantJobCounts({{{"team-a", "default", loom::v1::JOB_PHASE_RUNNING}, 2}});
  t = Text(registry);
  ExpectLine(t, "loom_tenant_jobs{phase=\"PENDING\",queue=\"default\",tenant=\"team-a\"} 0");
  ExpectLine(t, "loom_tenant_jobs{phase=\"RUNNING\",queue=\"batch\",tenant=\"team-b\"} 0");
  ExpectLine(t, "loom_tenant_jobs{phase=\"RUNNING\",queue=\"default\",tenant=\"team-a\"} 2");
}

TEST(SchedulerMetricsTest, SubmissionCommitsAndTheirBatchSizes) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  ExpectLine(Text(registry), "loom_submission_commits_total 0");
  m.SubmissionsCommitted(1);
  m.SubmissionsCommitted(3);
  m.SubmissionsCommitted(3);
  m.SubmissionsCommitted(100);
  const std::string t = Text(registry);
  ExpectLine(t, "loom_submission_commits_total 4");
  ExpectLine(t, "loom_submission_commit_jobs_count 4");
  ExpectLine(t, "loom_submission_commit_jobs_sum 107");
  ExpectLine(t, "loom_submission_commit_jobs_bucket{le=\"1\"} 1");
  ExpectLine(t, "loom_submission_commit_jobs_bucket{le=\"2\"} 1");
  ExpectLine(t, "loom_submission_commit_jobs_bucket{le=\"4\"} 3");
  ExpectLine(t, "loom_submission_commit_jobs_bucket{le=\"64\"} 3");
  ExpectLine(t, "loom_submission_commit_jobs_bucket{le=\"128\"} 4");
}

TEST(SchedulerMetricsTest, AdmissionAttemptsByResult) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  ExpectLine(Text(registry), "loom_admission_attempts_total{result=\"quota\"} 0");
  m.AdmissionAttempts("admitted", 1);
  m.AdmissionAttempts("no_capacity", 1);
  m.AdmissionAttempts("no_capacity", 1);
  m.AdmissionAttempts("something-new", 1);
  m.AdmissionAttempts("quota", 3);
  const std::string t = Text(registry);
  ExpectLine(t, "loom_admission_attempts_total{result=\"admitted\"} 1");
  ExpectLine(t, "loom_admission_attempts_total{result=\"no_capacity\"} 2");
  ExpectLine(t, "loom_admission_attempts_total{result=\"other\"} 1");
  ExpectLine(t, "loom_admission_attempts_total{result=\"infeasible\"} 0");
  ExpectLine(t, "loom_admission_attempts_total{result=\"quota\"} 3");
}

TEST(SchedulerMetricsTest, AcceleratorsByKindAndState) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  m.SetAccelerators({{{loom::v1::ACCELERATOR_KIND_H100, "free"}, 5},
                     {{loom::v1::ACCELERATOR_KIND_H100, "allocated"}, 3},
                     {{loom::v1::ACCELERATOR_KIND_CPU, "lost"}, 2}});
  const std::string t = Text(registry);
  ExpectLine(t, "loom_accelerators{kind=\"h100\",state=\"free\"} 5");
  ExpectLine(t, "loom_accelerators{kind=\"h100\",state=\"allocated\"} 3");
  ExpectLine(t, "loom_accelerators{kind=\"h100\",state=\"cordoned\"} 0");
  ExpectLine(t, "loom_accelerators{kind=\"cpu\",state=\"lost\"} 2");
  ExpectLine(t, "loom_accelerators{kind=\"cpu\",state=\"free\"} 0");
}

TEST(SchedulerMetricsTest, RestartsByCause) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  m.JobRestarted(loom::v1::FAILURE_CLASS_USER);
  m.JobRestarted(loom::v1::FAILURE_CLASS_INFRA);
  m.JobRestarted(loom::v1::FAILURE_CLASS_INFRA);
  m.JobRestarted(loom::v1::FAILURE_CLASS_PREEMPTED);
  const std::string t = Text(registry);
  ExpectLine(t, "loom_job_restarts_total{cause=\"user\"} 1");
  ExpectLine(t, "loom_job_restarts_total{cause=\"infra\"} 2");
  ExpectLine(t, "loom_job_restarts_total{cause=\"preemption\"} 1");
  ExpectLine(t, "loom_job_restarts_total{cause=\"oom\"} 0");
}

// Issue 53: a counter born at its first event is never counted by increase(): every edge of the
// state machine is exported at 0 before any job moves.
TEST(SchedulerMetricsTest, EveryPhaseTransitionStartsAtZero) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  std::string t = Text(registry);
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"UNSPECIFIED\",to=\"PENDING\"} 0");
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"PENDING\",to=\"STARTING\"} 0");
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"RUNNING\",to=\"SUCCEEDED\"} 0");
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"RUNNING\",to=\"RECOVERING\"} 0");
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"STOPPING\",to=\"CANCELLED\"} 0");
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"PENDING\",to=\"CANCELLED\"} 0");
  // Only edges that exist: nothing leaves a terminal phase.
  EXPECT_EQ(t.find("loom_job_phase_transitions_total{from=\"SUCCEEDED\""), std::string::npos);
  m.PhaseTransition(loom::v1::JOB_PHASE_RUNNING, loom::v1::JOB_PHASE_SUCCEEDED);
  t = Text(registry);
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"RUNNING\",to=\"SUCCEEDED\"} 1");
  ExpectLine(t, "loom_job_phase_transitions_total{from=\"RUNNING\",to=\"FAILED\"} 0");
}

// Issue 53: LoomJobStuckPending waits until the scheduler has lived as long as its window.
TEST(SchedulerMetricsTest, ExportsItsStartTime) {
  prometheus::Registry registry;
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  SchedulerMetrics m(registry);
  const std::string t = Text(registry);
  const std::string name = "\nloom_scheduler_start_time_seconds ";
  const size_t at = t.find(name);
  ASSERT_NE(at, std::string::npos) << t;
  const double started = std::stod(t.substr(at + name.size()));
  EXPECT_GE(started, std::floor(before));
  EXPECT_LE(started, before + 60);
}

// Issue 53: queue waits are often well under a second; the lowest bucket is 10 ms.
TEST(SchedulerMetricsTest, QueueWaitBucketsResolveSubSecondWaits) {
  prometheus::Registry registry;
  SchedulerMetrics m(registry);
  m.ObserveQueueWait(absl::Milliseconds(26));
  const std::string t = Text(registry);
  ExpectLine(t, "loom_job_queue_wait_seconds_bucket{le=\"0.01\"} 0");
  ExpectLine(t, "loom_job_queue_wait_seconds_bucket{le=\"0.025\"} 0");
  ExpectLine(t, "loom_job_queue_wait_seconds_bucket{le=\"0.05\"} 1");
  ExpectLine(t, "loom_job_queue_wait_seconds_bucket{le=\"86400\"} 1");
}

}  // namespace
}  // namespace loom
