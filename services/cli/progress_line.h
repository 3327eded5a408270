// File: services/cli/progress_line.h
//
// `loomctl wait`'s progress (issue 45: it scrolled one line per step, with no elapsed time or
// ETA): one line, "step 120/300 (40%)  loss 2.3456  held-out 2.5012 @100  1,234 tokens/s
// elapsed 1m20s  ETA 2m00s", redrawn in place on a terminal and printed as plain lines when
// piped. The ETA is the remaining steps at the rate this client has seen them pass (steps per
// second between the first step it saw and now), so a resumed job's earlier steps do not count.
//
// Thread-safety: ProgressRate is not thread-safe (one wait's own); the functions are pure.
#ifndef LOOM_SERVICES_CLI_PROGRESS_LINE_H_
#define LOOM_SERVICES_CLI_PROGRESS_LINE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "proto/common.pb.h"

namespace loom::cli {

// 1276.06 -> "1,276" (rounded to a whole number).
std::string WithThousands(double value);

// "45s", "3m20s", "1h02m", "2d03h".
std::string ShortDuration(absl::Duration d);

class ProgressRate {
 public:
  // The job's step as seen at `now`.
  void Observe(int64_t step, absl::Time now);
  // Time left for `total_steps` at the rate seen so far; nullopt before two different steps.
  std::optional<absl::Duration> Remaining(int64_t total_steps) const;

 private:
  int64_t first_step_ = -1;
  absl::Time first_time_;
  int64_t last_step_ = -1;
  absl::Time last_time_;
};

// The progress text of `job` at `now` (no newline, no escapes); `remaining` from ProgressRate.
std::string ProgressText(const loom::v1::Job& job, absl::Time now,
                         std::optional<absl::Duration> remaining);

}  // namespace loom::cli

#endif  // LOOM_SERVICES_CLI_PROGRESS_LINE_H_
