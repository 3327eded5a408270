#include "services/cli/wait_interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace loom::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void OnSigint(int) { g_interrupted.store(true); }

}  // namespace

absl::StatusOr<OnInterrupt> ParseOnInterrupt(const std::string& text) {
  if (text == "ask") return OnInterrupt::kAsk;
  if (text == "detach") return OnInterrupt::kDetach;
  if (text == "cancel") return OnInterrupt::kCancel;
  return absl::InvalidArgumentError(
      absl::StrCat("--on_interrupt: \"", text, "\" is not one of ask, detach, cancel"));
}

void InstallInterruptFlag() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking read returns, the loop sees the flag
  sigaction(SIGINT, &sa, nullptr);
}

bool Interrupted() { return g_interrupted.load(); }

bool ShouldCancelOnInterrupt(OnInterrupt mode, const std::string& job_id) {
  if (mode == OnInterrupt::kCancel) return true;
  if (mode == OnInterrupt::kDetach) return false;
  if (isatty(STDIN_FILENO) == 0 || isatty(STDERR_FILENO) == 0) return false;
  signal(SIGINT, SIG_DFL);
  std::fprintf(stderr, "\nCancel %s? [y/N] (N leaves it running) ", job_id.c_str());
  std::fflush(stderr);
  char line[64];
  if (std::fgets(line, sizeof(line), stdin) == nullptr) return false;
  const std::string answer = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line));
  return answer == "y" || answer == "yes";
}

std::string DetachedMessage(const std::string& job_id, const std::string& phase) {
  return absl::StrCat("loomctl: stopped following ", job_id, "; it keeps running (", phase,
                      "). Follow it again: loomctl wait ", job_id, "   cancel it: loomctl cancel ",
                      job_id);
}

}  // namespace loom::cli
