// The Scheduler facade's metric history (issue 45): rank 0's step and held-out evaluation events
// arrive as its stdout log lines in worker heartbeats (loom.TrainerEvent, one JSON object a
// line); each becomes a loom.v1.MetricPoint stored with the job (JobStore::WriteMetrics, one
// row per (job, kind, step): a resumed attempt's rerun of a step replaces it, a retried
// heartbeat rewrites the same rows). Served by GetJobMetrics, oldest step first, paged.
#include "scheduler/scheduler.h"

#include <algorithm>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "proto/trainer_events.pb.h"
#include "scheduler/scheduler_internal.h"
#include "worker/trainer/trainer_events.h"

namespace loom {
namespace {

constexpr int kDefaultMetricsPage = 1000;
constexpr int kMaxMetricsPage = 10000;

// Storage order: a step's training point, then the evaluation after it.
int64_t KeyOf(const loom::v1::MetricPoint& p) {
  return p.step() * 2 + (p.kind() == loom::v1::MetricPoint::KIND_EVAL ? 1 : 0);
}

// Opaque to clients: the job and the last key returned, base64. Bound to the job.
std::string TokenAfter(const std::string& job_id, int64_t key) {
  return absl::WebSafeBase64Escape(absl::StrCat(job_id, "\n", key));
}

absl::StatusOr<int64_t> TokenStart(const loom::v1::GetJobMetricsRequest& request) {
  if (request.page_token().empty()) return int64_t{-1};
  std::string decoded;
  std::vector<std::string> parts;
  int64_t key = 0;
  if (absl::WebSafeBase64Unescape(request.page_token(), &decoded)) {
    parts = absl::StrSplit(decoded, absl::MaxSplits('\n', 1));
  }
  if (parts.size() != 2 || parts[0] != request.job_id() || !absl::SimpleAtoi(parts[1], &key) ||
      key < -1 || TokenAfter(parts[0], key) != request.page_token()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: not a token GetJobMetrics issued for job ", request.job_id()));
  }
  return key;
}

}  // namespace

void Scheduler::RecordMetrics(const loom::v1::HeartbeatRequest& request) {
  std::vector<MetricRow> rows;
  const absl::Time now = clock_->Now();
  for (const loom::v1::RankStatus& st : request.ranks()) {
    if (st.rank() != 0) continue;
    for (const loom::v1::RankLogLine& line : st.log_lines()) {
      // Cheap filter first: most lines are not these two events.
      if (line.stream() != "stdout" || !(absl::StartsWith(line.text(), "{\"step\":") ||
                                         absl::StartsWith(line.text(), "{\"eval\":"))) {
        continue;
      }
      // The trainer's own reader of its event lines (a newer trainer's fields ignored).
      absl::StatusOr<loom::TrainerEvent> parsed =
          loom::trainer::ParseTrainerEventLine(line.text(), /*ignore_unknown_fields=*/true);
      if (!parsed.ok()) continue;
      const loom::TrainerEvent& event = *parsed;
      loom::v1::MetricPoint p;
      p.set_attempt(st.attempt());
      SetTimestamp(now, p.mutable_time());
      if (event.has_step()) {
        const loom::TrainerEvent::Step& s = event.step();
        p.set_kind(loom::v1::MetricPoint::KIND_TRAIN);
        p.set_step(s.step());
        p.set_loss(s.loss());
        p.set_learning_rate(s.lr());
        p.set_grad_norm(s.grad_norm());
        p.set_tokens_per_second(s.tokens_per_s());
        p.set_step_time_seconds(s.step_time_s());
        p.set_peak_bytes(s.peak_bytes());
      } else if (event.has_eval()) {
        p.set_kind(loom::v1::MetricPoint::KIND_EVAL);
        p.set_step(event.eval().step());
        p.set_loss(event.eval().loss());
      } else {
        continue;
      }
      rows.push_back(MetricRow{st.job_id(), KeyOf(p), p.SerializeAsString()});
    }
  }
  if (rows.empty()) return;
  // A lost write loses points of the history, not the job: logged, the heartbeat goes on.
  if (absl::Status s = repository_->WriteMetrics(rows); !s.ok()) {
    LOG(WARNING) << "metric history: " << rows.size() << " point(s) not stored: " << s;
  }
}

absl::StatusOr<loom::v1::GetJobMetricsResponse> Scheduler::GetJobMetrics(
    const loom::v1::GetJobMetricsRequest& request) {
  RETURN_IF_ERROR(CheckRequiredId("job_id", request.job_id()));
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must not be negative, got ", request.page_size()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.find(request.job_id()) == jobs_.end()) return JobNotFound(request.job_id());
  }
  ASSIGN_OR_RETURN(const int64_t after, TokenStart(request));
  const int limit = request.page_size() == 0 ? kDefaultMetricsPage
                                             : std::min(request.page_size(), kMaxMetricsPage);
  ASSIGN_OR_RETURN(std::vector<MetricRow> rows,
                   repository_->ListMetrics(request.job_id(), after, limit));
  loom::v1::GetJobMetricsResponse out;
  int64_t last = after;
  for (const MetricRow& row : rows) {
    if (!out.add_points()->ParseFromString(row.data)) {
      return absl::DataLossError(absl::StrCat("job ", request.job_id(), ": metric point ",
                                              row.key, " is not a valid MetricPoint"));
    }
    last = row.key;
  }
  out.set_next_page_token(TokenAfter(request.job_id(), last));
  return out;
}

}  // namespace loom
