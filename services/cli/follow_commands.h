// loomctl's commands that follow a job until it ends: `wait` (and `submit --wait`), `watch` and
// `logs`. Output goes to stdout (one line per change, event or log line; terminal-safe), errors
// to stderr through FollowContext::fail.
//
// Exit status: 0 when the job SUCCEEDED (wait, watch) or the stream ended (logs); 1 when it
// ended otherwise; 130 after Ctrl-C (wait_interrupt.h); else fail()'s (the gRPC code).
// Thread-safety: call from the main thread (wait installs a SIGINT handler).
#ifndef LOOM_SERVICES_CLI_FOLLOW_COMMANDS_H_
#define LOOM_SERVICES_CLI_FOLLOW_COMMANDS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/job_service.grpc.pb.h"
#include "services/cli/wait_interrupt.h"

namespace loom::cli {

struct FollowContext {
  // A unary call's context (deadline, token), and a stream's.
  std::function<std::unique_ptr<grpc::ClientContext>()> unary;
  std::function<std::unique_ptr<grpc::ClientContext>()> stream;
  // Prints the error and returns the exit status.
  std::function<int(const absl::Status&)> fail;
};

// How `wait` shows progress: one line redrawn in place (a terminal), or a line per change.
enum class ProgressMode { kAuto, kLine, kPlain };
// "auto" (a line on a terminal whose TERM is not "dumb", plain otherwise), "line", "plain";
// INVALID_ARGUMENT naming --progress otherwise.
absl::StatusOr<ProgressMode> ParseProgressMode(const std::string& text);

struct WaitOptions {
  absl::Duration timeout = absl::Hours(24);  // DEADLINE_EXCEEDED after this long
  OnInterrupt on_interrupt = OnInterrupt::kAsk;
  ProgressMode progress = ProgressMode::kAuto;
};

// Polls GetJob every 0.5 s: a line per phase change; the progress (services/cli/progress_line.h:
// step, loss, held-out loss, tokens/s, elapsed, ETA) as one live line, or a line per step and
// held-out loss when plain; the last step and evaluation before the phase a job ended in. UNAVAILABLE,
// DEADLINE_EXCEEDED and CANCELLED (a restarting scheduler) are retried.
int WaitForJob(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx,
               const WaitOptions& options);

// `loomctl resume ID [--wait]` (issue 49): ResumeJob, then one line
// "job-x: PENDING, resumes from step 1200 (attempt 4)"; with `wait` (non-null) the job is then
// followed as WaitForJob does. A refusal (FAILED_PRECONDITION: not FAILED/CANCELLED, no committed
// checkpoint, a gang too big without wait_for_capacity; NOT_FOUND) goes through ctx.fail.
int ResumeJob(loom::v1::JobService::Stub& stub, const std::string& id, bool wait_for_capacity,
              const FollowContext& ctx, const WaitOptions* wait);

// One line per WatchJob event until the stream ends.
int WatchJob(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx);

struct LogsOptions {
  bool follow = false;              // keep streaming until the job ends
  int32_t tail = 0;                 // the last N retained lines first (0 = all)
  std::vector<std::string> ranks;   // only these (as typed: INVALID_ARGUMENT for a non-rank)
  bool json = false;                // the raw lines, one LogLine in protobuf JSON each
  std::string grep;                 // only lines this ECMAScript regex finds (in what is printed)
};

// The ranks' lines, "[rank N] text", as people read them (services/cli/log_lines.h), or raw.
int StreamLogs(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx,
               const LogsOptions& options);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_FOLLOW_COMMANDS_H_
