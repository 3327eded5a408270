#include "services/cli/follow_commands.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "google/protobuf/util/json_util.h"
#include "services/cli/job_printing.h"
#include "services/cli/log_lines.h"
#include "services/cli/progress_line.h"
#include "services/cli/terminal_text.h"

namespace loom::cli {
namespace {

using loom::v1::Job;

bool Ended(loom::v1::JobPhase p) {
  return p == loom::v1::JOB_PHASE_SUCCEEDED || p == loom::v1::JOB_PHASE_FAILED ||
         p == loom::v1::JOB_PHASE_CANCELLED;
}

// Ctrl-C under wait (services/cli/wait_interrupt.h): cancel the job or say how to come back.
int OnInterrupted(loom::v1::JobService::Stub& stub, const std::string& id,
                  const FollowContext& ctx, OnInterrupt mode, loom::v1::JobPhase phase) {
  if (!ShouldCancelOnInterrupt(mode, id)) {
    std::fprintf(stderr, "%s\n", DetachedMessage(id, PhaseName(phase)).c_str());
    return kInterruptedExitCode;
  }
  loom::v1::CancelJobRequest req;
  req.set_job_id(id);
  Job job;
  grpc::Status s = stub.CancelJob(ctx.unary().get(), req, &job);
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  std::fprintf(stderr, "loomctl: cancelling %s (%s: %s); `loomctl wait %s` follows it to the end\n",
               id.c_str(), PhaseName(job.phase()).c_str(), TerminalSafe(job.message()).c_str(),
               id.c_str());
  return kInterruptedExitCode;
}

}  // namespace

int ResumeJob(loom::v1::JobService::Stub& stub, const std::string& id, bool wait_for_capacity,
              const FollowContext& ctx, const WaitOptions* wait) {
  loom::v1::ResumeJobRequest req;
  req.set_job_id(id);
  req.set_wait_for_capacity(wait_for_capacity);
  loom::v1::Job job;
  grpc::Status s = stub.ResumeJob(ctx.unary().get(), req, &job);
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  // The scheduler set the job's step to the checkpoint it resumes from; its next placement is
  // attempt + 1.
  std::printf("%s: %s, resumes from step %lld (attempt %d)\n", TerminalSafe(job.id()).c_str(),
              PhaseName(job.phase()).c_str(),
              static_cast<long long>(job.progress().last_checkpoint_step()), job.attempt() + 1);
  std::fflush(stdout);
  if (wait == nullptr) return 0;
  return WaitForJob(stub, id, ctx, *wait);
}

absl::StatusOr<ProgressMode> ParseProgressMode(const std::string& text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "line") return ProgressMode::kLine;
  if (text == "plain") return ProgressMode::kPlain;
  return absl::InvalidArgumentError(
      absl::StrCat("--progress: '", text, "' is not auto, line or plain"));
}

int WaitForJob(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx,
               const WaitOptions& options) {
  InstallInterruptFlag();
  const char* term = std::getenv("TERM");
  const bool live =
      options.progress == ProgressMode::kLine ||
      (options.progress == ProgressMode::kAuto && isatty(STDOUT_FILENO) &&
       !(term != nullptr && std::string(term) == "dumb"));
  bool line_open = false;  // live: the progress line is on screen, not ended by a newline
  auto end_line = [&](bool keep) {
    if (!line_open) return;
    std::printf(keep ? "\n" : "\r\x1b[2K");  // keep it, or erase it for the next line
    line_open = false;
  };
  absl::Time deadline = absl::Now() + options.timeout;
  int64_t last_step = -1;
  int64_t last_eval_step = -1;
  loom::v1::JobPhase last_phase = loom::v1::JOB_PHASE_UNSPECIFIED;
  absl::Time last_error = absl::InfinitePast();
  ProgressRate rate;
  while (absl::Now() < deadline) {
    if (Interrupted()) {
      end_line(true);
      return OnInterrupted(stub, id, ctx, options.on_interrupt, last_phase);
    }
    loom::v1::GetJobRequest req;
    req.set_job_id(id);
    Job job;
    grpc::Status s = stub.GetJob(ctx.unary().get(), req, &job);
    if (!s.ok()) {
      absl::Status st = loom::FromGrpcStatus(s);
      // A restarting scheduler cancels the calls in flight (CANCELLED; this client never
      // cancels its own): retried like UNAVAILABLE. Returned, CANCELLED is gRPC code 1, which is
      // also this command's "the job ended unsuccessfully" exit status.
      if (!absl::IsUnavailable(st) && !absl::IsDeadlineExceeded(st) && !absl::IsCancelled(st)) {
        end_line(true);
        return ctx.fail(st);
      }
      if (absl::Now() - last_error > absl::Seconds(10)) {
        end_line(true);
        std::fprintf(stderr, "loomctl: scheduler unavailable, retrying: %s\n",
                     s.error_message().c_str());
        last_error = absl::Now();
      }
      absl::SleepFor(absl::Milliseconds(500));
      continue;
    }
    const absl::Time now = absl::Now();
    const auto& p = job.progress();
    const bool ended = Ended(job.phase());
    rate.Observe(p.step(), now);
    auto phase_line = [&] {
      if (job.phase() == last_phase) return;
      end_line(/*keep=*/ended);
      std::printf("[%s] %s %s%s%s\n",
                  absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone()).c_str(), id.c_str(),
                  PhaseName(job.phase()).c_str(), job.message().empty() ? "" : ": ",
                  TerminalSafe(job.message()).c_str());
      last_phase = job.phase();
    };
    // A job that ended reports its last step and evaluation first, then how it ended.
    if (!ended) phase_line();
    const std::string progress =
        ProgressText(job, now, rate.Remaining(job.spec().training().steps()));
    if (live) {
      if (p.step() > 0 || p.has_eval_loss()) {
        std::printf("\r\x1b[2K%s", progress.c_str());
        line_open = true;
      }
    } else {
      if (p.step() != last_step && p.step() > 0) std::printf("  %s\n", progress.c_str());
      if (p.has_eval_loss() && p.eval_step() != last_eval_step) {
        std::printf("  held-out loss after step %lld: %.4f\n",
                    static_cast<long long>(p.eval_step()), p.eval_loss());
      }
    }
    last_step = p.step();
    if (p.has_eval_loss()) last_eval_step = p.eval_step();
    if (ended) phase_line();
    std::fflush(stdout);
    if (ended) {
      if (p.has_eval_loss()) {
        std::printf("held-out loss: before %.4f  after %.4f\n", p.initial_eval_loss(), p.eval_loss());
      }
      return job.phase() == loom::v1::JOB_PHASE_SUCCEEDED ? 0 : 1;
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
  end_line(true);
  return ctx.fail(absl::DeadlineExceededError(absl::StrCat("job ", id, " did not end in time")));
}

// `loomctl watch ID`: one line per WatchJob event.
int WatchJob(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx) {
  loom::v1::WatchJobRequest req;
  req.set_job_id(id);
  auto stream = ctx.stream();
  auto reader = stub.WatchJob(stream.get(), req);
  loom::v1::JobEvent event;
  loom::v1::JobPhase last = loom::v1::JOB_PHASE_UNSPECIFIED;
  std::string retention_error;  // the last one printed
  while (reader->Read(&event)) {
    const Job& job = event.job();
    const auto& p = job.progress();
    // History events (an ended job's past phase changes) carry their own time.
    const absl::Time when =
        event.has_time() ? absl::FromUnixSeconds(event.time().seconds()) : absl::Now();
    std::string line = absl::StrFormat(
        "[%s] %-12s %-10s step %lld/%lld", absl::FormatTime("%H:%M:%S", when, absl::LocalTimeZone()),
        event.type(), PhaseName(job.phase()), static_cast<long long>(p.step()),
        static_cast<long long>(p.total_steps()));  // events other than the Snapshot: no spec
    if (p.step() > 0) absl::StrAppend(&line, absl::StrFormat(" loss %.4f", p.loss()));
    if (p.last_checkpoint_step() > 0) {
      absl::StrAppend(&line, " ckpt ", p.last_checkpoint_step());
    }
    if (!job.message().empty()) {
      absl::StrAppend(&line, "  ", TerminalSafe(job.reason()), ": ", TerminalSafe(job.message()));
    }
    if (job.checkpoint_retention_error() != retention_error) {
      retention_error = job.checkpoint_retention_error();
      absl::StrAppend(&line, retention_error.empty()
                                 ? "  checkpoint retention recovered"
                                 : absl::StrCat("  checkpoint retention failed (retried): ",
                                                TerminalSafe(retention_error)));
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    last = job.phase();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  return last == loom::v1::JOB_PHASE_SUCCEEDED ? 0 : 1;
}

// `loomctl logs ID`: the ranks' lines, prefixed with the rank, as people read them
// (log_lines.h) or raw (--json).
int StreamLogs(loom::v1::JobService::Stub& stub, const std::string& id, const FollowContext& ctx,
               const LogsOptions& options) {
  loom::v1::StreamLogsRequest req;
  req.set_job_id(id);
  req.set_follow(options.follow);
  req.set_tail_lines(options.tail);
  for (const std::string& r : options.ranks) {
    int32_t rank = 0;
    if (!absl::SimpleAtoi(r, &rank) || rank < 0) {
      return ctx.fail(absl::InvalidArgumentError(absl::StrCat("--rank: '", r, "' is not a rank")));
    }
    req.add_ranks(rank);
  }
  std::optional<std::regex> grep;
  if (!options.grep.empty()) {
    try {
      grep.emplace(options.grep, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return ctx.fail(absl::InvalidArgumentError(
          absl::StrCat("--grep: '", options.grep, "' is not a regular expression: ", e.what())));
    }
  }
  LogRendering how;
  how.ranks_named = !options.ranks.empty();
  if (!options.json) {  // "step 12/300": the job's length, when the scheduler answers
    loom::v1::GetJobRequest get;
    get.set_job_id(id);
    loom::v1::Job job;
    if (stub.GetJob(ctx.unary().get(), get, &job).ok()) {
      how.total_steps = job.spec().training().steps();
    }
  }
  auto stream = ctx.stream();
  auto reader = stub.StreamLogs(stream.get(), req);
  loom::v1::LogLine line;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  while (reader->Read(&line)) {
    std::string text;
    if (options.json) {
      if (!google::protobuf::util::MessageToJsonString(line, &text, print).ok()) continue;
    } else {
      std::optional<std::string> readable = ReadableLogLine(line, how);
      if (!readable.has_value()) continue;
      text = TerminalSafe(*readable);
    }
    if (grep.has_value() && !std::regex_search(text, *grep)) continue;
    std::printf("%s\n", text.c_str());
    if (req.follow()) std::fflush(stdout);
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return ctx.fail(loom::FromGrpcStatus(s));
  return 0;
}


}  // namespace loom::cli
