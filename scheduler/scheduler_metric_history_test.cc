// The metric history through the Scheduler facade (issue 45): rank 0's step and eval events in a
// heartbeat's log lines become the job's MetricPoints (other ranks', stderr and other events do
// not), a retried heartbeat and a resumed attempt's rerun of a step replace rather than
// duplicate, pages follow one another with opaque tokens bound to the job, and the history
// survives a scheduler restart on its SQLite file.
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler_test_fixture.h"

namespace loom {
namespace {

using loom::v1::MetricPoint;

void AddLine(RankStatus* st, const std::string& stream, const std::string& text) {
  loom::v1::RankLogLine* l = st->add_log_lines();
  l->set_sequence(st->log_lines_size());
  l->set_stream(stream);
  l->set_text(text);
}

// A step event line as loom-trainer prints it (int64 as strings, every field).
std::string StepLine(int step, double loss) {
  return absl::StrCat(R"({"step":{"step":")", step, R"(","loss":)", loss,
                      R"(,"tokens_per_s":1276.5,"step_time_s":0.4,"optimizer_s":0.01,)",
                      R"("comm_bytes":"0","lr":0.001,"grad_norm":13.25,"loss_scale":1,)",
                      R"("skipped":false,"optimizer_step":"1","peak_bytes":"103864320"}})");
}

std::string EvalLine(int step, double loss) {
  return absl::StrCat(R"({"eval":{"step":")", step, R"(","loss":)", loss, "}}");
}

std::vector<MetricPoint> All(Scheduler& s, const std::string& job, int page_size) {
  std::vector<MetricPoint> out;
  loom::v1::GetJobMetricsRequest req;
  req.set_job_id(job);
  req.set_page_size(page_size);
  for (int pages = 0; pages < 100; ++pages) {
    absl::StatusOr<loom::v1::GetJobMetricsResponse> page = s.GetJobMetrics(req);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok() || page->points_size() == 0) break;
    out.insert(out.end(), page->points().begin(), page->points().end());
    EXPECT_FALSE(page->next_page_token().empty());
    req.set_page_token(page->next_page_token());
  }
  return out;
}

std::string Describe(const std::vector<MetricPoint>& points) {
  std::string out;
  for (const MetricPoint& p : points) {
    absl::StrAppend(&out, p.kind() == MetricPoint::KIND_EVAL ? "eval" : "train", "@", p.step(),
                    "=", p.loss(), " ");
  }
  return out;
}

TEST_F(SchedulerTest, RankZerosStepsAndEvaluationsBecomeTheJobsMetricHistory) {
  const std::string db = TmpDir() + "/metrics.db";
  std::remove(db.c_str());
  RestartOnSqlite(db);
  Job job = RunTwoRankJob();

  RankStatus r0 = Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500);
  AddLine(&r0, "stdout", R"({"process_start":{"rss_bytes":"1"}})");
  AddLine(&r0, "stdout", EvalLine(0, 5.5));
  AddLine(&r0, "stdout", StepLine(1, 5.25));
  AddLine(&r0, "stderr", "I20261207 engine.cc:118] step 1/2 loss 5.25");
  AddLine(&r0, "stdout", StepLine(2, 4.75));
  AddLine(&r0, "stdout", EvalLine(2, 4.5));
  AddLine(&r0, "stdout", R"({"step":{"step":"3", broken)");
  RankStatus r1 = Rank(job, 1, loom::v1::RANK_STATE_RUNNING);
  AddLine(&r1, "stdout", StepLine(1, 9.0));  // rank 1's copy: not rank 0's history
  Beat("node-a", {r0});
  Beat("node-a", {r0});  // a retried heartbeat
  Beat("node-b", {r1});

  std::vector<MetricPoint> points = All(*scheduler_, job.id(), 0);
  EXPECT_EQ(Describe(points), "eval@0=5.5 train@1=5.25 train@2=4.75 eval@2=4.5 ");
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[1].learning_rate(), 0.001);
  EXPECT_EQ(points[1].grad_norm(), 13.25);
  EXPECT_EQ(points[1].tokens_per_second(), 1276.5);
  EXPECT_EQ(points[1].step_time_seconds(), 0.4);
  EXPECT_EQ(points[1].peak_bytes(), 103864320);
  EXPECT_EQ(points[1].attempt(), job.attempt());
  EXPECT_GT(points[1].time().seconds(), 0);
  EXPECT_EQ(Describe(All(*scheduler_, job.id(), 1)), Describe(points)) << "one point a page";

  // A rerun of step 2 (a resumed attempt) replaces it; then the history survives a restart.
  RankStatus again = Rank(job, 0, loom::v1::RANK_STATE_RUNNING, 29500);
  AddLine(&again, "stdout", StepLine(2, 4.5));
  Beat("node-a", {again});
  RestartOnSqlite(db);
  EXPECT_EQ(Describe(All(*scheduler_, job.id(), 3)),
            "eval@0=5.5 train@1=5.25 train@2=4.5 eval@2=4.5 ");
}

TEST_F(SchedulerTest, MetricHistoryRefusesUnknownJobsAndForeignTokens) {
  Job a = RunTwoRankJob();
  loom::v1::GetJobMetricsRequest req;
  req.set_job_id("job-nope");
  EXPECT_EQ(scheduler_->GetJobMetrics(req).status().code(), absl::StatusCode::kNotFound);
  req.set_job_id("");
  EXPECT_EQ(scheduler_->GetJobMetrics(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_job_id(a.id());
  req.set_page_size(-1);
  EXPECT_EQ(scheduler_->GetJobMetrics(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_page_size(0);
  absl::StatusOr<loom::v1::GetJobMetricsResponse> empty = scheduler_->GetJobMetrics(req);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->points_size(), 0);
  // A token of this job continues; the same token for another job, or garbage, is refused.
  req.set_page_token(empty->next_page_token());
  EXPECT_TRUE(scheduler_->GetJobMetrics(req).ok());
  Job b = Submit(1);
  req.set_job_id(b.id());
  EXPECT_EQ(scheduler_->GetJobMetrics(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_page_token("after:3");
  EXPECT_EQ(scheduler_->GetJobMetrics(req).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
