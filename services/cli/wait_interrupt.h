// Ctrl-C while loomctl follows a job (`loomctl wait`, `loomctl submit --wait`), issue 49: the
// job trains on in the cluster whatever loomctl does, so an interrupt must not detach in
// silence. --on_interrupt says what happens:
//   ask     (default) with a terminal on stdin and stderr, "Cancel job-x? [y/N]": y cancels it
//           (graceful: a final checkpoint first), anything else detaches; without a terminal
//           (scripts, CI) as `detach`;
//   detach  loomctl exits, saying that the job keeps running and how to reattach or cancel it;
//   cancel  loomctl asks the scheduler to cancel the job, says so, and exits.
// Either way loomctl exits 130 (128 + SIGINT, the shell's convention for an interrupted command).
//
// Thread-safety: InstallInterruptFlag and the handler are async-signal-safe (one atomic flag);
// call the rest from the main thread.
#ifndef LOOM_SERVICES_CLI_WAIT_INTERRUPT_H_
#define LOOM_SERVICES_CLI_WAIT_INTERRUPT_H_

#include <string>

#include "absl/status/statusor.h"

namespace loom::cli {

inline constexpr int kInterruptedExitCode = 130;

enum class OnInterrupt { kAsk, kDetach, kCancel };

// "ask" | "detach" | "cancel"; INVALID_ARGUMENT naming --on_interrupt otherwise.
absl::StatusOr<OnInterrupt> ParseOnInterrupt(const std::string& text);

// Replaces SIGINT's default action (end the process) with setting a flag that Interrupted()
// reads; idempotent.
void InstallInterruptFlag();
bool Interrupted();

// What to do with `job_id` now that the user pressed Ctrl-C: true = cancel it. kAsk prompts on
// the terminal (stderr) and reads the answer from stdin; SIGINT's default action is restored
// first, so a second Ctrl-C at the prompt ends loomctl (the job keeps running).
bool ShouldCancelOnInterrupt(OnInterrupt mode, const std::string& job_id);

// The line printed when loomctl leaves a job running: how to follow it again or stop it.
std::string DetachedMessage(const std::string& job_id, const std::string& phase);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_WAIT_INTERRUPT_H_
