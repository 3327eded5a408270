// How loomctl shows jobs: `loomctl get` (FormatJob) and `loomctl list` (FormatJobTable). Every
// string that came from a user or a rank (name, reason, message, node ids, paths) goes through
// TerminalSafe, so a job cannot send terminal escapes to whoever lists it.
#ifndef LOOM_SERVICES_CLI_JOB_PRINTING_H_
#define LOOM_SERVICES_CLI_JOB_PRINTING_H_

#include <string>

#include "google/protobuf/repeated_ptr_field.h"
#include "proto/common.pb.h"

namespace loom::cli {

// "RUNNING" for JOB_PHASE_RUNNING.
std::string PhaseName(loom::v1::JobPhase phase);

// The multi-line `loomctl get` view of `job`, ending in a newline.
std::string FormatJob(const loom::v1::Job& job);

// The `loomctl list` table: a header line, then one line per job (ID, NAME cut to 40 columns,
// PHASE, RANKS, STEP, LOSS).
std::string FormatJobTable(const google::protobuf::RepeatedPtrField<loom::v1::Job>& jobs);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_JOB_PRINTING_H_
