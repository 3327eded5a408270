#include "scheduler/scheduler_metrics.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <string>

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

}  // namespace
}  // namespace loom
