#include "services/cli/job_printing.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/cli/terminal_text.h"

namespace loom::cli {

using loom::v1::Job;

std::string PhaseName(loom::v1::JobPhase p) {
  std::string n = loom::v1::JobPhase_Name(p);
  return n.substr(std::string("JOB_PHASE_").size());
}

std::string FormatJob(const Job& job) {
  const auto& p = job.progress();
  std::string out = absl::StrFormat("id:       %s\nname:     %s\nphase:    %s\n",
                                    TerminalSafe(job.id()), TerminalSafe(job.spec().name()),
                                    PhaseName(job.phase()));
  if (!job.reason().empty()) absl::StrAppend(&out, "reason:   ", TerminalSafe(job.reason()), "\n");
  if (!job.message().empty()) {
    absl::StrAppend(&out, "message:  ", TerminalSafe(job.message()), "\n");
  }
  absl::StrAppend(&out, "ranks:    ", job.spec().resources().num_ranks());
  for (int i = 0; i < job.rank_nodes_size(); ++i) {
    absl::StrAppend(&out, i == 0 ? " (" : ", ", i, "@", TerminalSafe(job.rank_nodes(i)));
  }
  absl::StrAppend(&out, job.rank_nodes_size() > 0 ? ")" : "", "\nattempt:  ", job.attempt(), "\n");
  if (job.has_technique()) {  // technique: auto
    const loom::v1::ChosenTechnique& t = job.technique();
    absl::StrAppend(&out, "technique: ", TerminalSafe(t.name()), " (auto: ", TerminalSafe(t.why()),
                    ")\n");
    for (const std::string& setting : t.settings()) {
      absl::StrAppend(&out, "           ", TerminalSafe(setting), "\n");
    }
  }
  if (p.step() > 0) {
    absl::StrAppendFormat(&out, "step:     %lld/%lld  loss %.4f  tokens/s %.0f\n",
                          static_cast<long long>(p.step()),
                          static_cast<long long>(job.spec().training().steps()), p.loss(),
                          p.tokens_per_second());
  } else {  // no training loss yet: "loss 0.0000" read as a result
    absl::StrAppendFormat(&out, "step:     0/%lld  (no step finished yet)\n",
                          static_cast<long long>(job.spec().training().steps()));
  }
  if (p.has_eval_loss()) {
    absl::StrAppendFormat(&out, "held-out: %.4f after step %lld (before training: %.4f)\n",
                          p.eval_loss(), static_cast<long long>(p.eval_step()),
                          p.initial_eval_loss());
  }
  if (p.last_checkpoint_step() > 0) {
    absl::StrAppendFormat(&out, "checkpoints: %s (last at step %lld)\n",
                          TerminalSafe(job.checkpoint_dir()),
                          static_cast<long long>(p.last_checkpoint_step()));
  } else {
    absl::StrAppend(&out, "checkpoints: none yet (will be written under ",
                    TerminalSafe(job.checkpoint_dir()), ")\n");
  }
  if (!job.checkpoint_retention_error().empty()) {
    absl::StrAppend(&out, "checkpoint retention failed (retried): ",
                    TerminalSafe(job.checkpoint_retention_error()), "\n");
  }
  return out;
}

std::string FormatJobTable(const google::protobuf::RepeatedPtrField<Job>& jobs) {
  // LOSS is the last step's training loss; HELD-OUT the last evaluation's (a user read a small
  // training loss as the result while the held-out loss was far higher).
  std::string out = absl::StrFormat("%-16s %-20s %-10s %-6s %-12s %-8s %s\n", "ID", "NAME",
                                    "PHASE", "RANKS", "STEP", "LOSS", "HELD-OUT");
  for (const Job& j : jobs) {
    absl::StrAppendFormat(
        &out, "%-16s %-20s %-10s %-6d %-12s %-8s %s\n", TerminalSafeCut(j.id(), 40),
        TerminalSafeCut(j.spec().name(), 40), PhaseName(j.phase()),
        j.spec().resources().num_ranks(),
        absl::StrCat(j.progress().step(), "/", j.spec().training().steps()),
        j.progress().step() > 0 ? absl::StrFormat("%.4f", j.progress().loss()) : "-",
        j.progress().has_eval_loss() ? absl::StrFormat("%.4f", j.progress().eval_loss()) : "-");
  }
  return out;
}

}  // namespace loom::cli
