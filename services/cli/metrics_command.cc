#include "services/cli/metrics_command.h"

#include <cstdio>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "google/protobuf/util/json_util.h"
#include "services/cli/progress_line.h"

namespace loom::cli {
namespace {

using loom::v1::MetricPoint;

struct Row {
  std::optional<MetricPoint> train;
  std::optional<MetricPoint> eval;
};

std::map<int64_t, Row> ByStep(const std::vector<MetricPoint>& points) {
  std::map<int64_t, Row> rows;
  for (const MetricPoint& p : points) {
    Row& r = rows[p.step()];
    (p.kind() == MetricPoint::KIND_EVAL ? r.eval : r.train) = p;
  }
  return rows;
}

}  // namespace

std::string FormatMetrics(const std::vector<MetricPoint>& points, MetricsFormat format) {
  std::string out;
  if (format == MetricsFormat::kJson) {
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    print.always_print_primitive_fields = true;  // step 0 and zero values are values here
    for (const MetricPoint& p : points) {
      std::string line;
      if (google::protobuf::util::MessageToJsonString(p, &line, print).ok()) {
        absl::StrAppend(&out, line, "\n");
      }
    }
    return out;
  }
  const bool csv = format == MetricsFormat::kCsv;
  out = csv ? "step,attempt,loss,eval_loss,learning_rate,grad_norm,tokens_per_second,"
              "step_time_seconds,peak_bytes\n"
            : absl::StrFormat("%-8s %-9s %-9s %-10s %-10s %-10s %-8s %s\n", "STEP", "LOSS",
                              "HELD-OUT", "LR", "GRAD-NORM", "TOKENS/S", "STEP-S", "PEAK-MiB");
  for (const auto& [step, r] : ByStep(points)) {
    const MetricPoint* t = r.train ? &*r.train : nullptr;
    const int attempt = t != nullptr ? t->attempt() : r.eval->attempt();
    if (csv) {
      // Empty cells where the step has no such value (pandas reads them as NaN).
      absl::StrAppend(&out, step, ",", attempt, ",",
                      t ? absl::StrFormat("%.17g", t->loss()) : "", ",",
                      r.eval ? absl::StrFormat("%.17g", r.eval->loss()) : "", ",",
                      t ? absl::StrFormat("%.17g", t->learning_rate()) : "", ",",
                      t ? absl::StrFormat("%.17g", t->grad_norm()) : "", ",",
                      t ? absl::StrFormat("%.17g", t->tokens_per_second()) : "", ",",
                      t ? absl::StrFormat("%.17g", t->step_time_seconds()) : "", ",",
                      t ? absl::StrCat(t->peak_bytes()) : "", "\n");
    } else {
      absl::StrAppendFormat(
          &out, "%-8d %-9s %-9s %-10s %-10s %-10s %-8s %s\n", step,
          t ? absl::StrFormat("%.4f", t->loss()) : "-",
          r.eval ? absl::StrFormat("%.4f", r.eval->loss()) : "-",
          t ? absl::StrFormat("%.2e", t->learning_rate()) : "-",
          t ? absl::StrFormat("%.3f", t->grad_norm()) : "-",
          t ? WithThousands(t->tokens_per_second()) : "-",
          t ? absl::StrFormat("%.2f", t->step_time_seconds()) : "-",
          t && t->peak_bytes() > 0 ? absl::StrFormat("%.1f", t->peak_bytes() / 1048576.0) : "-");
    }
  }
  return out;
}

int ShowMetrics(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx,
                MetricsFormat format) {
  std::vector<MetricPoint> points;
  loom::v1::GetJobMetricsRequest req;
  req.set_job_id(id);
  req.set_page_size(10000);
  while (true) {
    loom::v1::GetJobMetricsResponse page;
    grpc::Status s = stub.GetJobMetrics(ctx.unary().get(), req, &page);
    if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
    points.insert(points.end(), page.points().begin(), page.points().end());
    if (page.points_size() < req.page_size()) break;  // the last page, for now
    req.set_page_token(page.next_page_token());
  }
  if (points.empty() && format == MetricsFormat::kTable) {
    std::printf("job %s has no metrics yet (rank 0 reports each step as it finishes)\n",
                id.c_str());
    return 0;
  }
  std::printf("%s", FormatMetrics(points, format).c_str());
  return 0;
}

}  // namespace loom::cli
