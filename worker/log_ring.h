// A rank's recent output lines (stdout and stderr of its trainer) for StreamLogs: a bounded ring
// with per-rank sequence numbers, from which the worker daemon sends new lines to the scheduler
// in its heartbeats (worker_service.proto RankStatus.log_lines).
#ifndef LOOM_WORKER_LOG_RING_H_
#define LOOM_WORKER_LOG_RING_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/worker_service.pb.h"

namespace loom::worker {

// Longest line kept (longer ones are cut, the cut marked with "...[truncated]").
inline constexpr size_t kMaxRankLogLineBytes = 4096;

// Thread-safe.
class LogRing {
 public:
  // Keeps the newest `capacity` (>= 1) lines.
  explicit LogRing(size_t capacity = 2000) : capacity_(capacity < 1 ? 1 : capacity) {}

  // Appends one line (without its newline); it gets the next sequence number (from 1).
  void Add(absl::string_view stream, absl::string_view text);
  // The retained lines with sequence > `after`, oldest first, at most `max_lines` of them and
  // `max_bytes` of text (at least one line if any is newer, whatever its size).
  std::vector<loom::v1::RankLogLine> After(int64_t after, size_t max_lines,
                                           size_t max_bytes) const;
  // Sequence number of the newest line (0 if none yet).
  int64_t last_sequence() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<loom::v1::RankLogLine> lines_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace loom::worker

#endif  // LOOM_WORKER_LOG_RING_H_
