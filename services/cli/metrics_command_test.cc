// services/cli/metrics_command.h FormatMetrics: one row per step with the held-out loss of the
// steps that were evaluated, "-" (table) or an empty cell (CSV) where a step has no such value,
// and the CSV read back by hand.
#include "services/cli/metrics_command.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::cli {
namespace {

using loom::v1::MetricPoint;

MetricPoint Train(int64_t step, double loss) {
  MetricPoint p;
  p.set_kind(MetricPoint::KIND_TRAIN);
  p.set_step(step);
  p.set_attempt(1);
  p.set_loss(loss);
  p.set_learning_rate(0.001);
  p.set_grad_norm(0.5);
  p.set_tokens_per_second(12345.6);
  p.set_step_time_seconds(0.25);
  p.set_peak_bytes(104857600);
  return p;
}

MetricPoint Eval(int64_t step, double loss) {
  MetricPoint p;
  p.set_kind(MetricPoint::KIND_EVAL);
  p.set_step(step);
  p.set_attempt(1);
  p.set_loss(loss);
  return p;
}

const std::vector<MetricPoint> kPoints = {Eval(0, 5.5), Train(1, 5.25), Train(2, 4.75),
                                          Eval(2, 4.5)};

TEST(MetricsCommandTest, TableHasARowPerStep) {
  EXPECT_EQ(FormatMetrics(kPoints, MetricsFormat::kTable),
            "STEP     LOSS      HELD-OUT  LR         GRAD-NORM  TOKENS/S   STEP-S   PEAK-MiB\n"
            "0        -         5.5000    -          -          -          -        -\n"
            "1        5.2500    -         1.00e-03   0.500      12,346     0.25     100.0\n"
            "2        4.7500    4.5000    1.00e-03   0.500      12,346     0.25     100.0\n");
}

TEST(MetricsCommandTest, CsvHasEmptyCellsWhereAStepHasNoValue) {
  EXPECT_EQ(FormatMetrics(kPoints, MetricsFormat::kCsv),
            "step,attempt,loss,eval_loss,learning_rate,grad_norm,tokens_per_second,"
            "step_time_seconds,peak_bytes\n"
            "0,1,,5.5,,,,,\n"
            "1,1,5.25,,0.001,0.5,12345.6,0.25,104857600\n"
            "2,1,4.75,4.5,0.001,0.5,12345.6,0.25,104857600\n");
}

TEST(MetricsCommandTest, JsonIsOnePointALine) {
  const std::string json = FormatMetrics({Eval(0, 5.5)}, MetricsFormat::kJson);
  EXPECT_EQ(json,
            "{\"kind\":\"KIND_EVAL\",\"step\":\"0\",\"attempt\":1,\"loss\":5.5,"
            "\"learning_rate\":0,\"grad_norm\":0,\"tokens_per_second\":0,"
            "\"step_time_seconds\":0,\"peak_bytes\":\"0\"}\n");
}

}  // namespace
}  // namespace loom::cli
