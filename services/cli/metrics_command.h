// File: services/cli/metrics_command.h
//
// `loomctl metrics JOB [--csv | --json]`: the job's metric history (JobService.GetJobMetrics,
// every page), one row per step: training loss, held-out loss where that step was evaluated,
// learning rate, gradient norm, tokens/s, step time and rank 0's peak memory. --csv for
// spreadsheets and pandas, --json for the raw points (one loom.v1.MetricPoint in protobuf JSON
// a line). Thread-safety: one call at a time.
#ifndef LOOM_SERVICES_CLI_METRICS_COMMAND_H_
#define LOOM_SERVICES_CLI_METRICS_COMMAND_H_

#include <string>
#include <vector>

#include "proto/job_service.grpc.pb.h"
#include "services/cli/follow_commands.h"

namespace loom::cli {

enum class MetricsFormat { kTable, kCsv, kJson };

// The rows of `points` (in step order, an evaluation after the training point of its step) as
// a table or CSV; kJson prints each point. Pure.
std::string FormatMetrics(const std::vector<loom::v1::MetricPoint>& points, MetricsFormat format);

// Fetches every page and prints it; the error exit status of `ctx.fail` otherwise.
int ShowMetrics(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx,
                MetricsFormat format);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_METRICS_COMMAND_H_
