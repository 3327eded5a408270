#include "services/cli/log_lines.h"

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/trainer_events.pb.h"
#include "services/cli/progress_line.h"
#include "worker/trainer/trainer_events.h"

namespace loom::cli {
namespace {

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string Params(int64_t n) {
  if (n >= 1'000'000'000) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1'000'000) return absl::StrFormat("%.1fM", n / 1e6);
  return WithThousands(static_cast<double>(n));
}

std::string StepText(const loom::TrainerEvent::Step& s, int64_t total_steps) {
  std::string out = absl::StrCat("step ", s.step());
  if (total_steps > 0) absl::StrAppend(&out, "/", total_steps);
  absl::StrAppendFormat(&out, "  loss %.4f  lr %.2e", s.loss(), s.lr());
  if (s.grad_norm() > 0) absl::StrAppendFormat(&out, "  grad norm %.3f", s.grad_norm());
  absl::StrAppend(&out, "  ", WithThousands(s.tokens_per_s()), " tokens/s");
  absl::StrAppendFormat(&out, "  %.2f s", s.step_time_s());
  if (s.peak_bytes() > 0) absl::StrAppend(&out, "  peak ", MiB(s.peak_bytes()));
  if (s.skipped()) absl::StrAppend(&out, "  (skipped: fp16 overflow)");
  return out;
}

// A glog line ("I20261207 21:59:10.026773 31816 engine.cc:66] ..."): its severity letter, else 0.
char GlogSeverity(const std::string& text) {
  static const std::regex kGlog(R"(^([IWEF])\d{8} \d\d:\d\d:\d\d\.\d+ +\d+ [^ :]+:\d+\] )");
  std::smatch m;
  return std::regex_search(text, m, kGlog) ? m.str(1)[0] : 0;
}

}  // namespace

std::optional<std::string> ReadableLogLine(const loom::v1::LogLine& line,
                                           const LogRendering& how) {
  const std::string prefix = absl::StrCat("[rank ", line.rank(), "] ");
  if (line.stream() == "stderr") {
    // The trainer's INFO log repeats its events ("step 1/2 loss ...") or diagnoses: shown only
    // for named ranks; warnings, errors and anything not from glog (a library's message, a
    // crash) are people's lines.
    if (!how.ranks_named && GlogSeverity(line.text()) == 'I') return std::nullopt;
    return prefix + line.text();
  }
  // The trainer's own reader of its event lines (a newer trainer's fields ignored).
  absl::StatusOr<loom::TrainerEvent> parsed =
      line.text().empty() || line.text()[0] != '{'
          ? absl::InvalidArgumentError("not an event")
          : loom::trainer::ParseTrainerEventLine(line.text(), /*ignore_unknown_fields=*/true);
  if (!parsed.ok()) return prefix + line.text();
  const loom::TrainerEvent& event = *parsed;
  // Rank 0 speaks for the gang, unless the ranks were named.
  const bool shown = how.ranks_named || line.rank() == 0;
  switch (event.kind_case()) {
    case loom::TrainerEvent::kProcessStart:
    case loom::TrainerEvent::kRendezvous:
      if (!how.ranks_named) return std::nullopt;
      return event.has_rendezvous()
                 ? absl::StrCat(prefix, "rendezvous on port ", event.rendezvous().port())
                 : absl::StrCat(prefix, "process started (", MiB(event.process_start().rss_bytes()),
                                " resident)");
    case loom::TrainerEvent::kWarning:
      if (!shown) return std::nullopt;
      return absl::StrCat(prefix, "warning: ", event.warning().message());
    case loom::TrainerEvent::kStarted: {
      if (!shown) return std::nullopt;
      const auto& s = event.started();
      std::string out = absl::StrCat(prefix, "started: ", s.world_size(), " rank",
                                     s.world_size() == 1 ? "" : "s", ", ", Params(s.params()),
                                     " parameters, ZeRO stage ", s.zero_stage(), " (partition ",
                                     MiB(s.partition_bytes()), ")");
      if (!s.offload_optimizer().empty() && s.offload_optimizer() != "none") {
        absl::StrAppend(&out, ", optimizer offload to ", s.offload_optimizer());
      }
      if (!s.offload_param().empty() && s.offload_param() != "none") {
        absl::StrAppend(&out, ", parameter offload to ", s.offload_param());
      }
      absl::StrAppend(&out, s.start_step() > 0 ? absl::StrCat(", resuming at step ", s.start_step())
                                               : ", from step 0");
      return out;
    }
    case loom::TrainerEvent::kEval:
      if (!shown) return std::nullopt;
      return absl::StrFormat("%sheld-out loss %.4f at step %d", prefix, event.eval().loss(),
                             event.eval().step());
    case loom::TrainerEvent::kStep:
      if (!shown) return std::nullopt;
      return prefix + StepText(event.step(), how.total_steps);
    case loom::TrainerEvent::kCheckpoint:
      if (!shown) return std::nullopt;
      return absl::StrCat(prefix, "checkpoint of step ", event.checkpoint().step(), " committed: ",
                          event.checkpoint().dir());
    case loom::TrainerEvent::kDone: {
      if (!shown) return std::nullopt;
      const auto& d = event.done();
      return absl::StrFormat("%sdone at step %d: held-out loss %.4f -> %.4f", prefix, d.step(),
                             d.initial_eval_loss(), d.final_eval_loss());
    }
    case loom::TrainerEvent::kStopped: {
      if (!shown) return std::nullopt;
      const auto& s = event.stopped();
      return absl::StrCat(prefix, "stopped at step ", s.step(),
                          s.has_checkpoint_step()
                              ? absl::StrCat(" (final checkpoint of step ", s.checkpoint_step(), ")")
                              : std::string(" (no checkpoint)"));
    }
    case loom::TrainerEvent::kError:
      return absl::StrCat(prefix, "error: ", event.error().message());
    case loom::TrainerEvent::KIND_NOT_SET:
      break;
  }
  return prefix + line.text();
}

}  // namespace loom::cli
