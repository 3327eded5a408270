// File: services/cli/log_lines.h
//
// What `loomctl logs` prints for a rank's line (issue 45: each step of each rank was a
// ~900-character JSON event, and about 10 of 89 lines were for people). A trainer's stdout line
// is one loom.TrainerEvent in protobuf JSON (proto/trainer_events.proto); by default it becomes
// a short sentence, e.g.
//   [rank 0] step 12/300  loss 2.3456  lr 1.00e-03  grad norm 0.812  3,412 tokens/s  0.52 s
// and the events only rank 0's copy of says anything new (every rank's step, started, held-out
// loss, checkpoint, done) are shown for rank 0 alone, unless the ranks were asked for by name.
// Start-up chatter (process_start, rendezvous) and the trainer's glog INFO lines on stderr (they
// repeat the events, or diagnose) are left out too. Other stderr lines (warnings, errors, a
// library's message, a crash) and stdout lines that are not an event are people's lines already:
// printed as they are. Errors are every rank's.
//
// Thread-safety: pure functions.
#ifndef LOOM_SERVICES_CLI_LOG_LINES_H_
#define LOOM_SERVICES_CLI_LOG_LINES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "proto/job_service.pb.h"

namespace loom::cli {

struct LogRendering {
  int64_t total_steps = 0;   // the job's training.steps ("step 12/300"); 0 = unknown
  bool ranks_named = false;  // --rank given: every event of those ranks, none left out
};

// "[rank N] <sentence>", or nullopt when the line is left out by default. Not terminal-safe:
// the caller escapes it (TerminalSafe).
std::optional<std::string> ReadableLogLine(const loom::v1::LogLine& line,
                                           const LogRendering& how);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_LOG_LINES_H_
